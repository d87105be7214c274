"""The runner's clock on a real job: wall time, read after the device has run its queued work.

The virtual cluster's ranks read ``virtual.VirtualClock`` instead, which has the same interface:
the loop calls ``compute``, ``evaluate`` and the straggler's ``sleep`` where time passes, and the
virtual clock charges them from its time model; here they take their own time.

A run's clock is the slowest rank's (AlgoPerf's ``sync_ddp_time`` takes the ``MAX``): the reductions
over the job that turn each rank's reading into the run's (``slowest``, ``global_max``) and its
per-rank counters into the job's (``global_mean``) live here, beside the clock they read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from algorithms import accelerator

T = TypeVar("T")


class WallClock:
    """The runner's clock on a real job (s), read once ``device`` has run the work queued on it: CUDA
    runs kernels asynchronously, and a reading would otherwise leave out the work queued but not yet
    run. The virtual cluster's ranks use ``virtual.VirtualClock`` instead, with the same interface."""

    kind = "wall"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self) -> float:
        accelerator.synchronize(self.device)
        return time.perf_counter()

    def compute(self) -> None:
        """A batch's forward and backward took their own time."""

    def evaluate(self, batches: float) -> None:
        """An evaluation takes its own time."""

    def shared(self, key: object, make: Callable[[], T]) -> T:
        """What the ranks of one process may share, made once (``VirtualClock.shared``): a real rank
        is its own process, so it makes its own."""
        return make()

    sleep = None  # stragglers sleep for real
    columns = ()  # metrics.csv's columns of the clock's own (the virtual clock's time breakdown)

    def breakdown(self) -> dict[str, float]:
        return {}

    def size_messages(self, model: torch.nn.Module) -> None:
        """Real messages have their real size."""

    def describe(self) -> dict[str, object]:
        return {}


def loss_accumulator(saved: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The epoch's running loss sum on ``device``: zero, or a mid-epoch checkpoint's (loaded on the CPU)."""
    return torch.zeros((), dtype=torch.float64, device=device) if saved is None else saved.to(device, torch.float64)


def group_device() -> torch.device | None:
    """Where the job's default group takes its tensors: the rank's current accelerator under NCCL (or
    another device's backend), None (the CPU) under gloo and on the virtual cluster."""
    backend = dist.get_backend()
    if backend in ("gloo", "virtual"):
        return None
    kinds = [k for k, b in dist.Backend.default_device_backend_map.items() if b == backend]
    return torch.device(kinds[0], torch.get_device_module(kinds[0]).current_device())


def all_reduce_numbers(values: list[float], op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce a few numbers over the job; on the rank's device where the job's group is the
    device's (NCCL takes no CPU tensors)."""
    t = torch.tensor(values, dtype=torch.float64, device=group_device())
    dist.all_reduce(t, op=op)
    return t.cpu()


def global_mean(value: torch.Tensor | float) -> float:
    """``value``'s mean over the job's ranks (a per-rank counter: seconds communicating, bytes sent)."""
    return all_reduce_numbers([float(value)])[0].item() / dist.get_world_size()


def global_max(value: float) -> float:
    """``value``'s maximum over the job's ranks: a clock reading becomes the slowest rank's."""
    return all_reduce_numbers([float(value)], dist.ReduceOp.MAX)[0].item()


def slowest(*values: float) -> list[float]:
    """Each of ``values``' maximum over the job's ranks, in one collective."""
    return all_reduce_numbers([float(v) for v in values], dist.ReduceOp.MAX).tolist()
