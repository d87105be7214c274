"""The baselines' update rules on tiny tensors, and their equivalences with the reference methods."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import algorithms
from algorithms.adpsgd import pairwise_delta
from algorithms.dpsgd import mix
from algorithms.sgp import debias, push_sum_share
from algorithms.topology import Topology
from benchmarks.tasks import digits
from tests.distributed import max_param_diff, run_on, train_digits

STEPS = 8


class Scalar(nn.Module):
    """A model whose only parameter is a vector set to the rank: expected means are (W-1)/2."""

    def __init__(self, value: float, size: int = 3) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((size,), value))

    def forward(self, x):
        return x * self.w


def _build(name: str, rank: int, world: int, model: nn.Module, lr: float, **knobs):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    algo = algorithms.build(name, Topology(rank, nodes=max(1, world // 2), procs_per_node=min(2, world)), **knobs)
    return algo, optimizer


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


# ---- pure functions -------------------------------------------------------------------------------------


def test_pure_rules_on_hand_checkable_numbers():
    assert torch.equal(
        mix(torch.tensor([3.0]), {1: torch.tensor([6.0]), 2: torch.tensor([0.0])}, {1: 1 / 3, 2: 1 / 3}, 1 / 3),
        torch.tensor([3.0]),
    )
    x, w = push_sum_share(torch.tensor([6.0, 3.0]), 1.0, num_peers=2)
    assert torch.equal(x, torch.tensor([2.0, 1.0])) and w == 1 / 3
    assert torch.equal(debias(torch.tensor([1.0, 2.0]), 0.5), torch.tensor([2.0, 4.0]))
    mine, theirs = torch.tensor([1.0, 5.0]), torch.tensor([3.0, -1.0])
    a, b = mine + pairwise_delta(mine, theirs), theirs + pairwise_delta(theirs, mine)
    assert torch.equal(a, torch.tensor([2.0, 2.0])) and torch.equal(a + b, mine + theirs)


# ---- local SGD --------------------------------------------------------------------------------------------


def _local_sgd_rule(rank: int, world: int) -> None:
    # lr 1, gradient = rank (loss = rank * sum(w)); H = 2: step 1 local, step 2 averaged.
    model = Scalar(0.0)
    algo, opt = _build("local_sgd", rank, world, model, lr=1.0, period=2)
    algo.prepare(model, opt, algorithms.Plan(steps_per_epoch=4, epochs=1))
    for step in range(2):
        opt.zero_grad()
        (rank * model.w.sum()).backward()
        algo.step()
        expected = -float(rank) if step == 0 else -2 * (world - 1) / 2
        assert torch.allclose(model.w.data, torch.full((3,), expected)), (step, model.w.data)


def test_local_sgd_averages_every_h_steps():
    run_on(4, _local_sgd_rule)


def _train(rank: int, world: int, name: str, knobs: dict, out: str) -> None:
    train_digits(rank, world, name, knobs, out, steps=STEPS, steps_per_epoch=3)


def test_local_sgd_with_h1_and_averaged_momentum_is_allreduce_sgd(tmp_path):
    run_on(4, _train, "allreduce", {}, str(tmp_path / "a.pt"))
    run_on(4, _train, "local_sgd", {"period": 1, "momentum_mode": "average"}, str(tmp_path / "l.pt"))
    assert max_param_diff(tmp_path / "a.pt", tmp_path / "l.pt") <= 1e-6


def _torch_post_local(rank: int, world: int, out: str) -> None:
    """The reference: torch's PostLocalSGDOptimizer + PeriodicModelAverager + post_localSGD_hook."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    torch.manual_seed(0)
    model = digits.make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    switch = 3  # steps_per_epoch 3 x switch_epoch 1
    ddp.register_comm_hook(
        PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=switch, post_local_gradient_allreduce=False
        ),
        post_localSGD_hook,
    )
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    optimizer = PostLocalSGDOptimizer(sgd, PeriodicModelAverager(period=2, warmup_steps=switch))
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    if rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out)


def test_post_local_sgd_matches_torch_post_local_sgd_optimizer(tmp_path):
    run_on(4, _torch_post_local, str(tmp_path / "torch.pt"))
    run_on(4, _train, "post_local_sgd", {"period": 2, "switch_epoch": 1}, str(tmp_path / "ours.pt"))
    assert max_param_diff(tmp_path / "ours.pt", tmp_path / "torch.pt") <= 1e-6
    run_on(4, _train, "post_local_sgd", {"period": 2, "switch_epoch": 3}, str(tmp_path / "never.pt"))
    assert max_param_diff(tmp_path / "never.pt", tmp_path / "torch.pt") > 1e-4, "the switch changed nothing"


# ---- D-PSGD -----------------------------------------------------------------------------------------------


def _dpsgd_mixing(rank: int, world: int, segments: int = 1) -> None:
    model = Scalar(float(rank))
    algo, opt = _build("dpsgd", rank, world, model, lr=0.0, segments=segments)
    with torch.no_grad():  # prepare() broadcasts rank 0's model; set the rank values after it
        algo.prepare(model, opt, algorithms.Plan(steps_per_epoch=1, epochs=1))
        model.w.fill_(float(rank))
    model.w.grad = torch.zeros_like(model.w)
    algo.step()
    # Ring of 4, weights 1/3: rank 0 -> (3 + 0 + 1) / 3, rank 1 -> (0 + 1 + 2) / 3, ...
    expected = {0: 4 / 3, 1: 1.0, 2: 2.0, 3: 5 / 3}[rank]
    assert torch.allclose(model.w.data, torch.full((3,), expected))
    mean = torch.stack(_gather(model.w.data)).mean(0)
    assert torch.allclose(mean, torch.full((3,), (world - 1) / 2))


@pytest.mark.parametrize("segments", [1, 2])
def test_dpsgd_mixing_keeps_the_mean(segments):
    """The same values whether the model goes in one message or in rounds (WAGMA's D-PSGD)."""
    run_on(4, _dpsgd_mixing, segments)


# ---- SGP --------------------------------------------------------------------------------------------------


def _sgp_push_sum(rank: int, world: int, overlap: int) -> None:
    model = Scalar(0.0)
    algo, opt = _build("sgp", rank, world, model, lr=0.0, num_peers=1, overlap=overlap)
    algo.prepare(model, opt, algorithms.Plan(steps_per_epoch=1, epochs=1))
    with torch.no_grad():
        model.w.fill_(float(rank))
    model.w.grad = torch.zeros_like(model.w)
    algo.step()
    if overlap == 0:
        # Step 0 pushes half to rank + 1: x_i = (x_i + x_{i-1}) / 2.
        expected = {0: 1.5, 1: 0.5, 2: 1.5, 3: 2.5}[rank]
        assert torch.allclose(model.w.data, torch.full((3,), expected)) and algo.weight == 1.0
    for _ in range(5):
        algo.step()
    in_flight = sum(t.item() for t in _gather(torch.tensor([algo.weight])))
    if overlap:  # part of the mass is in messages not yet consumed
        assert in_flight < world - 0.1, in_flight
    algo.end_epoch(0.0)  # consumes every message in flight
    weights = _gather(torch.tensor([algo.weight]))
    numerators = _gather(model.w.data * algo.weight)
    assert abs(sum(w.item() for w in weights) - world) < 1e-6
    assert torch.allclose(sum(numerators) / sum(weights), torch.full((3,), (world - 1) / 2))
    assert torch.allclose(algo.eval_model().w.data, torch.full((3,), (world - 1) / 2))


def test_sgp_push_sum_keeps_total_weight_and_true_average():
    run_on(4, _sgp_push_sum, 0)


def test_overlap_sgp_push_sum_keeps_total_weight_and_true_average():
    run_on(4, _sgp_push_sum, 1)


# ---- AD-PSGD ----------------------------------------------------------------------------------------------


def _adpsgd_pairwise(rank: int, world: int) -> None:
    model = Scalar(0.0)
    algo, opt = _build("adpsgd", rank, world, model, lr=0.0)
    algo.prepare(model, opt, algorithms.Plan(steps_per_epoch=1, epochs=1))
    with torch.no_grad():
        model.w.fill_(float(rank))
    model.w.grad = torch.zeros_like(model.w)
    for _ in range(6):
        algo.step()
    algo.close()
    total = sum(_gather(model.w.data))
    assert torch.allclose(total, torch.full((3,), float(sum(range(world))))), total
    exchanges = sum(t.item() for t in _gather(torch.tensor([float(algo.exchanges)])))
    assert exchanges > 0
    if world == 2:  # one pair: both end at the pair's mean after at least one exchange
        assert torch.allclose(model.w.data, torch.full((3,), 0.5))


def test_adpsgd_pairwise_averaging_keeps_the_sum():
    run_on(2, _adpsgd_pairwise)
    run_on(4, _adpsgd_pairwise)


# ---- each baseline trains to the embedded target on 2 virtual nodes x 2 processes -----------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, sets",
    [
        ("local_sgd", []),
        ("post_local_sgd", []),
        ("dpsgd", []),
        ("sgp", []),
        ("adpsgd", []),
        ("diloco", ["inner_steps=8"]),  # about 3 outer steps an epoch (the paper's H=500 is past the run)
        ("powersgd", ["start_powerSGD_iter=10"]),  # compressing from step 10 (PyTorch's default: 1000)
    ],
)
def test_baseline_reaches_the_digits_target_on_four_processes(tmp_path, name, sets, run_command):
    out = tmp_path / name
    result = subprocess.run(
        [
            *run_command,
            "--algorithm",
            name,
            "--task",
            "digits",
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--seed",
            "0",
            "--out",
            str(out),
            "--set",
            "wandb=false",
            *[x for item in sets for x in ("--set", item)],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["time_to_target_s"] is not None, summary
    if algorithms.get(name).overlaps_comm:  # AD-PSGD's exchanges, PowerSGD's buckets run beside the computation
        assert summary["comm_share"] is None
    else:
        assert 0 < summary["comm_share"] < 1
