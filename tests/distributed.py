"""Run a function on W gloo processes on this machine (the tests' small virtual cluster)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, store: str, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_on(world: int, fn: Callable, *args: object) -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` processes; re-raises the first failure."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.spawn(_entry, args=(world, store, fn, args), nprocs=world, join=True)
