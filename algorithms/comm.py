"""Collectives shared by the algorithms: fused (flat) averaging, broadcast and copies in and out,
and the count of the bytes each rank sends.

Every message an algorithm sends goes through this module's ``all_reduce``, ``broadcast``, ``send``,
``isend`` and ``batch_isend_irecv``, which count its bytes and hand it to ``torch.distributed``
unchanged. A collective counts what the algorithm of its cost model sends from each rank
(``benchmarks/virtual/network.py`` charges time for the same bytes): a ring all-reduce of n bytes over p
ranks sends 2(p-1)/p n from each; a binomial-tree broadcast sends p-1 messages of n bytes, counted
as (p-1)/p n on each rank, so that the mean over ranks is exact; a point-to-point message counts n
on its sender. Where a library sends for the algorithm (DDP's and PowerSGD's buckets, Horovod's
fused tensors), the algorithm's class counts what the buckets or hook send, with ``count``. What
the runner sends (clock readings, stop flags, evaluation, checkpoints) is not the algorithm's:
it runs under ``uncounted()``, or calls ``torch.distributed`` directly.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterator

import torch
import torch.distributed as dist

_threads = threading


def threads():
    """Where an algorithm gets its threads, locks, events and conditions: ``threading`` on a real
    job; on the virtual cluster (``benchmarks/virtual/``) stand-ins whose waits run on its clock.
    Use ``comm.threads().Thread(...)`` where one would write ``threading.Thread(...)``."""
    return _threads


def use_threads(provider):
    """Install ``provider`` as ``threads()``; return the one it replaces (the virtual cluster's hook)."""
    global _threads
    previous, _threads = _threads, provider
    return previous


def side_backend() -> str:
    """The backend of a CPU side channel beside the default group (a control group, a progress or
    gossip thread's own channel): gloo, or, on the virtual cluster (``benchmarks/virtual/``), its
    own groups, which carry CPU tensors too."""
    return "virtual" if dist.is_initialized() and dist.get_backend() == "virtual" else "gloo"


# -- bytes sent ------------------------------------------------------------------------------------
_sent: dict[int, float] = defaultdict(float)  # global rank -> bytes (one key per process; P on the virtual cluster)
_sent_lock = threading.Lock()  # a real lock, held for an addition only: never across a wait
_uncounted = threading.local()
_message_scale = 1.0


def carried_by_mpi(group: dist.ProcessGroup) -> None:
    """Say that ``group``'s traffic stands for MPI's, as Heat's DASO sends its global syncs: the
    virtual cluster charges it the network's MPI rate (``Network.mpi``). No effect on a real
    backend, where the group's own library carries it."""
    mark = getattr(group, "carried_by_mpi", None)  # the virtual cluster's groups have it
    if mark is not None:
        mark()


def ring_allreduce_bytes(nbytes: float, p: int) -> float:
    """What each of ``p`` ranks sends in a ring all-reduce of ``nbytes``: reduce-scatter then
    all-gather, 2(p-1) messages of n/p bytes (the bandwidth-optimal algorithm of NCCL, gloo's ring,
    Horovod)."""
    return 2.0 * (p - 1) * nbytes / p


def broadcast_bytes(nbytes: float, p: int) -> float:
    """Each rank's share of a broadcast of ``nbytes`` to ``p`` ranks: p-1 messages of n bytes in all."""
    return (p - 1) * nbytes / p


def tensor_bytes(tensors: torch.Tensor | list[torch.Tensor]) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(t.numel() * t.element_size() for t in tensors)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def count(nbytes: float) -> None:
    """Add ``nbytes`` to what this rank has sent (times the virtual cluster's message scale)."""
    if getattr(_uncounted, "depth", 0):
        return
    with _sent_lock:
        _sent[_rank()] += nbytes * _message_scale


def sent_bytes() -> float:
    """The bytes this rank has sent since its run started (``set_sent_bytes``)."""
    with _sent_lock:
        return _sent[_rank()]


def set_sent_bytes(value: float) -> None:
    """Start this rank's count at ``value``: 0 for a new run, the checkpoint's count on a resume."""
    with _sent_lock:
        _sent[_rank()] = float(value)


def set_message_scale(scale: float) -> float:
    """Count every message as ``scale`` times its bytes, as the virtual cluster charges them when it
    stands a small model in for a paper's (``sim_model_mb``); return the scale it replaces."""
    global _message_scale
    previous, _message_scale = _message_scale, scale
    return previous


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Messages this thread sends inside are not the algorithm's (evaluation, checkpoints)."""
    _uncounted.depth = getattr(_uncounted, "depth", 0) + 1
    try:
        yield
    finally:
        _uncounted.depth -= 1


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group: dist.ProcessGroup | None = None, async_op=False):
    """``dist.all_reduce``, counted as a ring all-reduce."""
    count(ring_allreduce_bytes(tensor_bytes(tensor), dist.get_world_size(group)))
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None = None, async_op=False):
    """``dist.broadcast``, counted as each rank's share of a broadcast."""
    count(broadcast_bytes(tensor_bytes(tensor), dist.get_world_size(group)))
    return dist.broadcast(tensor, src=src, group=group, async_op=async_op)


def send(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup | None = None, tag: int = 0) -> None:
    """``dist.send``, counted on the sender."""
    count(tensor_bytes(tensor))
    dist.send(tensor, dst=dst, group=group, tag=tag)


def isend(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup | None = None, tag: int = 0):
    """``dist.isend``, counted on the sender."""
    count(tensor_bytes(tensor))
    return dist.isend(tensor, dst=dst, group=group, tag=tag)


def batch_isend_irecv(ops: list[dist.P2POp]) -> list:
    """``dist.batch_isend_irecv``, its sends counted on the sender, its receives posted first.

    gloo posts a batch's operations one by one, and its TCP pair sends nothing before the receiver
    has posted the matching receive. With the sends first, exchanges that follow each other with no
    barrier between them (a training loop's) fall into step with one direction waiting for the
    other: measured on two nodes at 50 Mbit/s, 2.01x the link's time where the receives first take
    1.04x (``python -m tools.gloo_links``, docs/measurements.md). MPI codes pre-post receives
    for the same reason. NCCL runs a batch as one group, where the order does not matter."""
    count(sum(tensor_bytes(op.tensor) for op in ops if op.op is dist.isend))
    return dist.batch_isend_irecv(sorted(ops, key=lambda op: op.op is not dist.irecv))


def exchange(message: torch.Tensor, out_peers: list[int], received: dict[int, torch.Tensor], segments: int = 1) -> None:
    """Send ``message`` to each of ``out_peers`` and receive each ``received[j]`` from rank j, in
    ``segments`` consecutive rounds: round k sends and receives the k-th slice of each buffer and
    waits for all of them before round k+1 starts. The values received are the same for any
    ``segments``; the timing is not. One round is one flat message; 161 rounds are the WAGMA paper's
    D-PSGD and SGP, which exchange ResNet-50's 161 tensors one after another, each waiting for the
    peers' (github.com/Shigangli/WAGMA-SGD, ``optimizer_dpsgd_imagenet.py``): a delayed rank then
    holds up its neighbours' neighbours within the same step."""
    parts = message.chunk(segments)
    slices = {j: buf.chunk(segments) for j, buf in received.items()}
    for k, part in enumerate(parts):
        ops = [dist.P2POp(dist.isend, part, j) for j in out_peers]
        ops += [dist.P2POp(dist.irecv, slices[j][k], j) for j in received]
        if ops:
            for work in batch_isend_irecv(ops):
                work.wait()


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
    all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    unflatten_into(flat, tensors)


def broadcast_(tensors: list[torch.Tensor], src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Copy rank ``src``'s values of ``tensors`` to every rank of ``group`` (one fused broadcast)."""
    if not tensors:
        return
    flat = flatten(tensors)
    broadcast(flat, src=src, group=group)
    unflatten_into(flat, tensors)
