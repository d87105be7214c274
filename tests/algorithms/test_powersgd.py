"""PowerSGD through PyTorch's own hook (arXiv:1905.13727): DDP until it starts, then compressed; its
state carried across a resume (its run to the digits target: tests/algorithms/test_baselines.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import algorithms
from algorithms.powersgd import PowerSGD
from algorithms.topology import Topology
from benchmarks.tasks import digits
from tests.distributed import max_param_diff, run_on, train_digits

ROOT = Path(__file__).resolve().parents[2]


def test_before_it_starts_it_is_ddp_and_then_it_compresses(tmp_path):
    runs = [
        ("ddp", {}, "ddp"),
        ("powersgd", {"start_powerSGD_iter": 10}, "late"),
        ("powersgd", {"start_powerSGD_iter": 2}, "early"),
    ]
    run_on(2, _train_each, [(name, knobs, str(tmp_path / f"{out}.pt")) for name, knobs, out in runs])
    assert max_param_diff(str(tmp_path / "ddp.pt"), str(tmp_path / "late.pt")) <= 1e-6  # plain all-reduce
    compressed = max_param_diff(str(tmp_path / "ddp.pt"), str(tmp_path / "early.pt"))
    assert 1e-4 < compressed < 0.05, compressed  # a rank-1 approximation of DDP's update


def _train_each(rank: int, world: int, runs: list[tuple[str, dict, str]]) -> None:
    for name, knobs, out in runs:  # one pair of processes for all: start-up dominates the time
        train_digits(rank, world, name, knobs, out, 6, 6)


def _make(rank: int):
    torch.manual_seed(0)
    model = digits.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    algo = PowerSGD(Topology(rank, 1, 2), start_powerSGD_iter=3)
    return model, optimizer, algo, algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=10, epochs=2))


def _resume_midway(rank: int, world: int, out: str) -> None:
    """20 steps straight; then 8 steps, a checkpoint, and 12 steps of a fresh model, DDP and hook."""
    g = torch.Generator().manual_seed(100 + rank)
    data = [(torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(20)]

    def steps(parts, batches):
        model, optimizer, algo, ddp = parts
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            algo.step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    straight = steps(_make(rank), data)
    first = _make(rank)
    steps(first, data[:8])
    saved = copy.deepcopy((first[0].state_dict(), first[1].state_dict(), first[2].state_dict()))
    again = _make(rank)
    again[0].load_state_dict(saved[0])
    again[1].load_state_dict(saved[1])
    again[2].load_state_dict(saved[2])
    resumed = steps(again, data[8:9])
    first_layout = dict(again[2].layout)
    resumed = steps(again, data[9:])
    if rank == 0:
        torch.save({"diff": (resumed - straight).abs().max().item(), "layouts": [first_layout, again[2].layout]}, out)


def test_a_resumed_hook_state_continues_the_trajectory(tmp_path):
    """Error feedback and warm-start Q are kept per bucket; the resumed process's first step uses
    DDP's first layout, the next ones the layout DDP makes after it, different from the first: the
    state is laid out again each time, and the trajectory goes on to rounding (measured: 4e-9 after
    the first step, 3e-8 after 12)."""
    out = tmp_path / "resume.pt"
    run_on(2, _resume_midway, str(out))
    result = torch.load(out)
    assert result["layouts"][0] != result["layouts"][1], "the resume never changed the bucket layout"
    assert result["diff"] <= 1e-6, result


@pytest.mark.parametrize(
    "knobs, name",
    [
        ({"matrix_approximation_rank": 0}, "matrix_approximation_rank"),
        ({"start_powerSGD_iter": 1}, "start_powerSGD_iter"),
    ],
)
def test_bad_knobs_are_refused(knobs, name):
    with pytest.raises(ValueError, match=f"``{name}``"):
        PowerSGD(Topology(0, 1, 1), **knobs)
