"""DDP and explicit all-reduce SGD are the same update: parameters agree after k steps."""

from __future__ import annotations

import torch
import torch.distributed as dist

from algorithms.comm import broadcast_, flat_average_
from benchmarks.tasks import digits
from tests.distributed import run_on, train_digits

STEPS = 6


def _same_everywhere(t: int, algo, model) -> None:
    """Within one algorithm every rank holds the same parameters after every step."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], g) for g in gathered)


def _train(rank: int, world: int, name: str, out: str) -> None:
    train_digits(rank, world, name, {}, out, steps=STEPS, steps_per_epoch=STEPS, check=_same_everywhere)


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


def _evaluated_statistics(rank: int, world: int, name: str) -> None:
    """Rank r trains a batch-norm layer on data of mean r: the evaluated model holds the workers' mean
    statistics, as for the model-averaging methods, not each rank's own (which would score each
    validation slice with another model)."""
    import algorithms
    from algorithms.topology import Topology

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(2, momentum=1.0), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    algo = algorithms.build(name, Topology(rank, nodes=1, procs_per_node=world))
    train_model = algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=1, epochs=1))
    x = torch.full((4, 2), float(rank)) + torch.tensor([[0.0, 1.0], [0.0, -1.0], [1.0, 0.0], [-1.0, 0.0]])
    train_model(x).sum().backward()  # momentum 1: running_mean is this batch's mean, (r, r)
    algo.step()
    evaluated = algo.eval_model()[0].running_mean
    assert torch.allclose(evaluated, torch.full((2,), (world - 1) / 2)), (name, rank, evaluated)
    algo.close()


def test_every_algorithm_is_evaluated_with_the_workers_mean_batch_norm_statistics():
    for name in ("allreduce", "ddp"):
        run_on(2, _evaluated_statistics, name)
