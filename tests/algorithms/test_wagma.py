"""WAGMA-SGD: the group schedule, information spread, the averaging rules, the stale rule of Fig. 3,
the send buffer after a global average, the equivalence with global averaging when S = P, and
training with and without a straggler."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import algorithms
from algorithms.topology import Topology, wagma_group
from algorithms.wagma import WAGMA, default_group_size, group_average
from tests.distributed import max_param_diff, run_on, train_digits

ROOT = Path(__file__).resolve().parents[2]


def groups(p: int, s: int, t: int, printed: bool = False) -> list[tuple[int, ...]]:
    return sorted({tuple(wagma_group(r, p, s, t, printed)) for r in range(p)})


def test_schedule_reproduces_the_papers_example():
    assert groups(8, 4, 0) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert groups(8, 4, 1) == [(0, 1, 4, 5), (2, 3, 6, 7)]
    # Algorithm 1 as printed (Sec. 3.2, line 6: cumulative mask <<= shift) gives groups of 2 at t = 1.
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


def _late_until_started(algo: WAGMA, version: int) -> None:
    """Be late on purpose: wait until another rank's activation has made this rank's progress thread
    start round ``version`` with its send buffer (a fixed sleep would assume the others get there
    within it, which a loaded machine need not grant)."""
    deadline = time.monotonic() + 120
    while algo.started_version < version:
        assert time.monotonic() < deadline, f"round {version} never started on the late rank"
        time.sleep(0.01)


def _fig3(rank: int, world: int) -> None:
    """Rank 1 is late at iteration 0: rank 0 triggers the round with rank 1's stale (initial) model."""
    model = Scalar()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    algo = WAGMA(Topology(rank, nodes=1, procs_per_node=2), group_size=2, global_period=10)
    algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=10, epochs=1))
    if rank == 1:
        _late_until_started(algo, 0)
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


def algorithm2(
    grads: list[int], group_size: int, period: int, steps: int, late: dict[int, int]
) -> list[list[Fraction]]:
    """Algorithm 2 in exact arithmetic, independent of ``WAGMA``: one scalar per rank, W_0 = 0, SGD at
    lr 1 with the constant gradient ``grads[rank]``; ``late[t]`` is the rank whose group round t runs
    before its local step t (its send buffer is contributed). Every rank's model after every step."""
    p = len(grads)
    w = [Fraction(0)] * p
    send = list(w)  # the send buffer: the initial model until the first local step
    history = []
    for t in range(steps):
        local = [w[r] - grads[r] for r in range(p)]  # lines 6-7: W'_t = W_t - lr * g
        if (t + 1) % period == 0:  # line 16: global average of the W'_t
            w = [sum(local) / p] * p
        else:
            stale = late.get(t)
            contributed = [send[r] if r == stale else local[r] for r in range(p)]  # line 9
            sums = [sum(contributed[q] for q in wagma_group(r, p, group_size, t)) for r in range(p)]
            # lines 10-13: W_sum / S if fresh, else (W_sum + W'_t) / (S + 1)
            w = [(sums[r] + local[r]) / (group_size + 1) if r == stale else sums[r] / group_size for r in range(p)]
        send = local  # "the send buffer is updated by W'_t" at every iteration, global ones too (our reading)
        history.append(w)
    return history


# P = 4, S = 2, tau = 3: t = 2 and 5 are global; the groups are {0,1},{2,3} at even t and {0,2},{1,3}
# at odd t (wagma_group's mask is 1 << (t mod 2)). Only rank 1 has a gradient (4), so W'_t = W_t
# except on rank 1, where W'_t = W_t - 4. Rank 1 is late at t = 3, the first group iteration after a
# global average. The models of ranks 0..3 after each step:
#   t=0 {0,1},{2,3}  W' = (0, -4, 0, 0)            -> (-2, -2, 0, 0)
#   t=1 {0,2},{1,3}  W' = (-2, -6, 0, 0)           -> (-1, -3, -1, -3)
#   t=2 global       W' = (-1, -7, -1, -3), sum -12 -> (-3, -3, -3, -3); rank 1's send buffer: W'_2 = -7
#   t=3 {0,2},{1,3}  W' = (-3, -7, -3, -3). Ranks 0, 2, 3 start round 3 while rank 1 sleeps, so rank 1's
#                    thread contributes its send buffer: rank 3's W_sum = -7 + -3 = -10. Rank 3 is fresh:
#                    -10 / 2 = -5. Rank 1 is stale (the /(S+1) rule) and adds its own W'_3 = -7:
#                    (-10 - 7) / 3 = -17/3. Ranks 0, 2: (-3 - 3) / 2 = -3
#                                                  -> (-3, -17/3, -3, -5)
#   t=4 {0,1},{2,3}  W' = (-3, -29/3, -3, -5)      -> (-19/3, -19/3, -4, -4)
#   t=5 global       W' = (-19/3, -31/3, -4, -4)   -> all (-19/3 - 31/3 - 8) / 4 = -37/6
# Had the send buffer kept W'_1 = -6 across the global average (issue 14), t=3 would give rank 3
# -9/2 and rank 1 -16/3; had it taken the averaged model -3 (the other reading), -3 and -13/3.
LATE_RANK, LATE_STEP, GRADS = 1, 3, [0, 4, 0, 0]
AFTER_SYNC = [
    [-2, -2, 0, 0],
    [-1, -3, -1, -3],
    [-3, -3, -3, -3],
    [-3, Fraction(-17, 3), -3, -5],
    [Fraction(-19, 3), Fraction(-19, 3), -4, -4],
    [Fraction(-37, 6)] * 4,
]


def _late_after_sync(rank: int, world: int) -> None:
    model = Scalar()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    algo = WAGMA(Topology(rank, nodes=1, procs_per_node=world), group_size=2, global_period=3)
    algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=6, epochs=1))
    with algo.cond:  # the hold below needs a reentrant lock (else step() would hang, not fail)
        assert algo.cond.acquire(blocking=False), "WAGMA.cond is no longer reentrant"
        algo.cond.release()
    for t, expected in enumerate(AFTER_SYNC):
        late = rank == LATE_RANK and t == LATE_STEP
        # Only the deliberate straggler may be late: an accidental one (a rank descheduled for a
        # moment on a busy machine) would change the numbers, as it adds a stale W' and divides by
        # S + 1. So each other rank holds its WAGMA lock from before the barrier until step() has
        # published W'_t: its progress thread snapshots the send buffer under that lock, and no rank
        # can start round t before every rank has passed the barrier. step() re-enters the lock (a
        # Condition's RLock) and releases it while it waits for the round. The barrier is on the
        # default group; WAGMA's threads use groups of their own.
        with contextlib.nullcontext() if late else algo.cond:
            dist.barrier()
            if late:  # the others run round 3 meanwhile, and rank 3 gets this rank's send buffer
                _late_until_started(algo, LATE_STEP)
            optimizer.zero_grad()
            model(torch.full((2,), float(GRADS[rank]))).backward()
            algo.step()
        stale = int(rank == LATE_RANK and t >= LATE_STEP)
        assert algo.stale_rounds == stale, f"rank {rank} step {t}: {algo.stale_rounds} stale rounds, not {stale}"
        want = torch.full((2,), float(expected[rank]))
        assert torch.allclose(model.w.data, want, rtol=0, atol=1e-6), f"rank {rank} step {t}: {model.w.data} != {want}"
    algo.close()


def test_a_late_worker_after_a_global_average_contributes_its_w_prime_of_that_iteration():
    assert algorithm2(GRADS, group_size=2, period=3, steps=6, late={LATE_STEP: LATE_RANK}) == AFTER_SYNC
    run_on(4, _late_after_sync)


def _send_buffer(rank: int, world: int, mode: str) -> None:
    model = Scalar()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    algo = WAGMA(Topology(rank, nodes=1, procs_per_node=world), group_size=2, global_period=2, mode=mode)
    algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=4, epochs=1))
    x = torch.full((2,), float(rank + 1))
    for t in range(4):  # t = 1 and 3 are global
        local = model.w.detach() - x  # W'_t = W_t - lr * g
        optimizer.zero_grad()
        model(x).backward()
        algo.step()
        state = algo.state_dict()  # only this rank's main thread writes the send buffer
        assert state["send_iter"] == t, f"rank {rank} step {t}: send_iter {state['send_iter']}"
        assert torch.allclose(state["send_buf"], local, rtol=0, atol=0), (rank, t, state["send_buf"], local)
    algo.close()


@pytest.mark.parametrize("mode", ["wait_avoiding", "sync"])
def test_the_checkpointed_send_buffer_is_the_last_local_model_after_every_step(mode):
    run_on(2, _send_buffer, mode)


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


@pytest.mark.parametrize(
    "extra", [[], ["--set", "mode=sync"], ["--set", "straggler=fixed", "--set", "straggler_delay_ms=10"]]
)
def test_wagma_reaches_the_digits_target_on_four_processes(tmp_path, extra, run_command):
    out = tmp_path / "wagma"
    result = subprocess.run(
        [
            *run_command,
            "--algorithm",
            "wagma",
            "--task",
            "digits",
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--out",
            str(out),
            "--set",
            "wandb=false",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["time_to_target_s"] is not None
    assert (out / "metrics.csv").read_text().splitlines()[0].endswith("stale_share,spread")
