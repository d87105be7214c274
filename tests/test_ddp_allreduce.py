"""DDP and explicit all-reduce SGD are the same update: parameters agree after k steps."""

from __future__ import annotations

import torch
import torch.distributed as dist

import algorithms
from algorithms.comm import broadcast_, flat_average_
from algorithms.topology import Topology
from benchmarks.tasks import digits
from tests.distributed import run_on

STEPS = 6


def _train(rank: int, world: int, name: str, out: str) -> None:
    torch.manual_seed(0)
    model = digits.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    algo = algorithms.build(name, Topology(rank, nodes=2, procs_per_node=world // 2))
    train_model = algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=STEPS, epochs=1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank sees its own batches
    for _ in range(STEPS):
        x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(train_model(x), y).backward()
        algo.step()
    if rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out)
    # Within one algorithm every rank must hold the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], g) for g in gathered)


def test_ddp_and_allreduce_agree_after_k_steps(tmp_path):
    for name in ("ddp", "allreduce"):
        run_on(4, _train, name, str(tmp_path / f"{name}.pt"))
    ddp, allreduce = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "allreduce.pt")
    start = digits.make_model
    torch.manual_seed(0)
    initial = list(start().parameters())
    moved = max((a - b).abs().max().item() for a, b in zip(ddp, initial))
    assert moved > 1e-3, "the parameters did not train"
    diff = max((a - b).abs().max().item() for a, b in zip(ddp, allreduce))
    assert diff <= 1e-6, f"ddp and allreduce differ by {diff}"


def _flat_average(rank: int, world: int) -> None:
    # Rank-valued tensors: the mean of 0..W-1 is (W-1)/2 in every element.
    tensors = [torch.full((3,), float(rank)), torch.full((2, 2), float(rank) * 2)]
    flat_average_(tensors)
    assert torch.allclose(tensors[0], torch.full((3,), (world - 1) / 2))
    assert torch.allclose(tensors[1], torch.full((2, 2), float(world - 1)))
    values = [torch.full((2,), float(rank + 7))]
    broadcast_(values, src=0)
    assert torch.equal(values[0], torch.full((2,), 7.0))


def test_flat_average_and_broadcast_on_rank_valued_tensors():
    run_on(4, _flat_average)
