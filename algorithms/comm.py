"""Collectives shared by the algorithms: fused (flat) averaging, broadcast and copies in and out."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

_threads = threading


def threads():
    """Where an algorithm gets its threads, locks, events and conditions: ``threading`` on a real
    job; on the virtual cluster (``benchmarks/virtual.py``) stand-ins whose waits run on its clock.
    Use ``comm.threads().Thread(...)`` where one would write ``threading.Thread(...)``."""
    return _threads


def use_threads(provider):
    """Install ``provider`` as ``threads()``; return the one it replaces (the virtual cluster's hook)."""
    global _threads
    previous, _threads = _threads, provider
    return previous


def side_backend() -> str:
    """The backend of a CPU side channel beside the default group (a control group, a progress or
    gossip thread's own channel): gloo, or, on the virtual cluster (``benchmarks/virtual.py``), its
    own groups, which carry CPU tensors too."""
    return "virtual" if dist.is_initialized() and dist.get_backend() == "virtual" else "gloo"


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous copy of ``tensors``: one message instead of one per tensor."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy the consecutive slices of ``flat`` back into ``tensors`` (the inverse of ``flatten``)."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def flat_average_(tensors: list[torch.Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Average ``tensors`` in place across ``group`` with one all-reduce of a fused buffer.

    Each tensor is divided by the group size *before* the sum, as DDP's default hook does, so the
    two produce the same floating-point result and the sum cannot overflow in low precision.
    """
    if not tensors:
        return
    flat = flatten(tensors).div_(dist.get_world_size(group))
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    unflatten_into(flat, tensors)


def broadcast_(tensors: list[torch.Tensor], src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Copy rank ``src``'s values of ``tensors`` to every rank of ``group`` (one fused broadcast)."""
    if not tensors:
        return
    flat = flatten(tensors)
    dist.broadcast(flat, src=src, group=group)
    unflatten_into(flat, tensors)
