"""The runner's clock on a real job: wall time, read after the device has run its queued work.

The virtual cluster's ranks read ``virtual.VirtualClock`` instead, which has the same interface:
the loop calls ``compute``, ``evaluate`` and the straggler's ``sleep`` where time passes, and the
virtual clock charges them from its time model; here they take their own time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

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
