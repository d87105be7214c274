"""WAGMA-SGD: the group schedule, information spread, the averaging rules, the stale rule of Fig. 3,
the equivalence with global averaging when S = P, and training with and without a straggler."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import algorithms
from algorithms.topology import Topology, wagma_group
from algorithms.wagma import WAGMA, default_group_size, group_average
from tests.distributed import max_param_diff, run_on, train_digits

ROOT = Path(__file__).resolve().parent.parent


def groups(p: int, s: int, t: int, printed: bool = False) -> list[tuple[int, ...]]:
    return sorted({tuple(wagma_group(r, p, s, t, printed)) for r in range(p)})


def test_schedule_reproduces_the_papers_example():
    assert groups(8, 4, 0) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert groups(8, 4, 1) == [(0, 1, 4, 5), (2, 3, 6, 7)]
    # Algorithm 1 as printed gives groups of 2 at t = 1 (the erratum of spec 2.2).
    assert groups(8, 4, 1, printed=True) == [(0, 4), (1, 5), (2, 6), (3, 7)]


@pytest.mark.parametrize("p,s", [(4, 2), (8, 2), (8, 4), (16, 4), (64, 8), (64, 4), (16, 16)])
def test_groups_partition_the_workers_and_spread_information_in_log_s_p(p, s):
    rounds = math.ceil(math.log2(p) / math.log2(s))
    for start in range(6):
        for t in range(start, start + rounds):
            gs = groups(p, s, t)
            assert len(gs) == p // s and all(len(g) == s for g in gs)
            assert sorted(r for g in gs for r in g) == list(range(p))
        known = [{r} for r in range(p)]  # what each worker has heard of
        for t in range(start, start + rounds):
            known = [set().union(*(known[q] for q in wagma_group(r, p, s, t))) for r in range(p)]
        assert all(k == set(range(p)) for k in known), (p, s, start)


def test_averaging_rules_on_hand_checkable_numbers():
    assert torch.equal(group_average(torch.tensor([12.0]), torch.tensor([6.0]), 4, fresh=True), torch.tensor([3.0]))
    assert torch.equal(group_average(torch.tensor([12.0]), torch.tensor([6.0]), 4, fresh=False), torch.tensor([3.6]))
    assert default_group_size(4) == 2 and default_group_size(8) == 2 and default_group_size(64) == 8


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="power-of-two number of workers"):
        WAGMA(Topology(0, nodes=3, procs_per_node=2))
    with pytest.raises(ValueError, match="``group_size``"):
        WAGMA(Topology(0, nodes=2, procs_per_node=2), group_size=3)


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return (x * self.w).sum()


def _fig3(rank: int, world: int) -> None:
    """Rank 1 is late at iteration 0: rank 0 triggers the round with rank 1's stale (initial) model."""
    model = Scalar()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    algo = WAGMA(Topology(rank, nodes=1, procs_per_node=2), group_size=2, global_period=10)
    algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=10, epochs=1))
    if rank == 1:
        time.sleep(1.5)
    optimizer.zero_grad()
    model(torch.full((2,), float(rank + 1))).backward()  # gradient 1 on rank 0, 2 on rank 1
    algo.step()
    # W'_0: -1 on rank 0, -2 on rank 1; the round sums -1 with rank 1's stale 0.
    expected = -0.5 if rank == 0 else (-1 - 2) / 3  # fresh: sum / S; stale: (sum + W') / (S + 1)
    assert torch.allclose(model.w.data, torch.full((2,), expected)), (rank, model.w.data)
    assert algo.stale_rounds == (1 if rank == 1 else 0)
    algo.close()


def test_a_late_worker_contributes_its_stale_model_and_uses_the_s_plus_1_rule():
    run_on(2, _fig3)


def _equal_after_global(t: int, algo, model: nn.Module) -> None:
    """Every replica is the same right after a global average."""
    if isinstance(algo, WAGMA) and algo.is_global(t):
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        assert all(torch.equal(gathered[0], g) for g in gathered)


def _train(rank: int, world: int, name: str, knobs: dict, out: str) -> None:
    train_digits(rank, world, name, knobs, out, steps=12, steps_per_epoch=12, check=_equal_after_global)


def test_sync_wagma_with_s_equal_p_is_per_step_global_averaging(tmp_path):
    run_on(4, _train, "wagma", {"group_size": 4, "global_period": 5, "mode": "sync"}, str(tmp_path / "w.pt"))
    run_on(4, _train, "local_sgd", {"period": 1}, str(tmp_path / "l.pt"))
    assert max_param_diff(tmp_path / "w.pt", tmp_path / "l.pt") <= 1e-6


def test_wait_avoiding_rounds_keep_replicas_equal_after_each_global_average(tmp_path):
    run_on(4, _train, "wagma", {"global_period": 4}, str(tmp_path / "wa.pt"))


@pytest.mark.parametrize("extra", [[], ["--set", "mode=sync"], ["--set", "straggler=fixed", "--set", "straggler_delay_ms=10"]])
def test_wagma_reaches_the_digits_target_on_four_processes(tmp_path, extra):
    out = tmp_path / "wagma"
    result = subprocess.run([sys.executable, "-m", "benchmarks.run", "--algorithm", "wagma", "--task", "digits",
                             "--nodes", "2", "--procs-per-node", "2", "--out", str(out), "--set", "wandb=false", *extra],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["time_to_target_s"] is not None
    assert (out / "metrics.csv").read_text().splitlines()[0].endswith("stale_share,spread")
