"""DiLoCo (arXiv:2311.08105, Algorithm 1): the outer Nesterov step by hand, all-reduce SGD as its
special case (its run to the digits target: tests/algorithms/test_baselines.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import algorithms
from algorithms.diloco import DiLoCo
from algorithms.topology import Topology
from tests.distributed import max_param_diff, run_on, train_digits

ROOT = Path(__file__).resolve().parents[2]


class Vector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0]))

    def forward(self, x):
        return x * self.w


# Each worker's parameters at the end of two rounds of H = 1 step (the inner step itself moves
# nothing: lr 0), set by hand.
WORKERS = {
    0: ([0.5, 2.5], [0.268, 2.2]),
    1: ([0.7, 1.5], [0.468, 1.8]),
}


def _two_outer_steps(rank: int, world: int, out: str) -> None:
    model = Vector()
    if rank != 0:  # another start: prepare() must replace it by rank 0's theta = [1, 2]
        with torch.no_grad():
            model.w.fill_(9.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    algo = DiLoCo(Topology(rank, nodes=2, procs_per_node=1), inner_steps=1, outer_lr=0.7, outer_momentum=0.9)
    algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=2, epochs=1))
    seen = []
    for theta_i in WORKERS[rank]:
        with torch.no_grad():
            model.w.copy_(torch.tensor(theta_i))
        model.w.grad = torch.zeros(2)
        algo.step()
        seen.append(model.w.detach().clone())
    if rank == 0:
        torch.save(seen, out)


def test_the_outer_step_by_hand(tmp_path):
    """theta = [1, 2]. Round 1: the workers end at [0.5, 2.5] and [0.7, 1.5], mean [0.6, 2.0], so
    Delta = [0.4, 0]; Nesterov's first step (buffer b = Delta) moves theta by lr (Delta + 0.9 b) =
    0.7 x 1.9 x 0.4 = 0.532: theta = [0.468, 2.0]. Round 2: mean [0.368, 2.0], Delta = [0.1, 0];
    b = 0.9 x 0.4 + 0.1 = 0.46, step 0.7 x (0.1 + 0.9 x 0.46) = 0.3598: theta = [0.1082, 2.0]."""
    out = tmp_path / "seen.pt"
    run_on(2, _two_outer_steps, str(out))
    first, second = torch.load(out)
    assert torch.allclose(first, torch.tensor([0.468, 2.0]), atol=1e-6), first
    assert torch.allclose(second, torch.tensor([0.1082, 2.0]), atol=1e-6), second


def _both(rank: int, world: int, knobs: dict, tmp: str) -> None:
    train_digits(rank, world, "diloco", knobs, f"{tmp}/diloco.pt", 6, 6)
    train_digits(rank, world, "allreduce", {}, f"{tmp}/allreduce.pt", 6, 6)


def test_h1_with_outer_lr_1_and_no_momentum_is_allreduce_sgd(tmp_path):
    """One local step from the same point, then theta - mean(theta - theta_i) = mean(theta_i): with
    SGD's momentum and weight decay (linear in the gradient) that is all-reduce SGD's update."""
    knobs = {"inner_steps": 1, "outer_lr": 1.0, "outer_momentum": 0.0}
    run_on(2, _both, knobs, str(tmp_path))
    assert max_param_diff(str(tmp_path / "diloco.pt"), str(tmp_path / "allreduce.pt")) <= 1e-6


@pytest.mark.parametrize(
    "knobs, name",
    [({"inner_steps": 0}, "inner_steps"), ({"outer_lr": 0.0}, "outer_lr"), ({"outer_momentum": 1.0}, "outer_momentum")],
)
def test_bad_knobs_are_refused(knobs, name):
    with pytest.raises(ValueError, match=f"``{name}``"):
        DiLoCo(Topology(0, 1, 1), **knobs)
