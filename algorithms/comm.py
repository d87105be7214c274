"""Collectives shared by the algorithms: flat (fused) averaging of a list of tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist


def flat_average_(tensors: list[torch.Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Average ``tensors`` in place across ``group`` with one all-reduce of a fused buffer.

    Each tensor is divided by the group size *before* the sum, as DDP's default hook does, so the
    two produce the same floating-point result and the sum cannot overflow in low precision.
    """
    if not tensors:
        return
    world = dist.get_world_size(group)
    flat = torch.cat([t.reshape(-1) for t in tensors]).div_(world)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def broadcast_(tensors: list[torch.Tensor], src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Copy rank ``src``'s values of ``tensors`` to every rank of ``group`` (one fused broadcast)."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.broadcast(flat, src=src, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
