"""PyTorch DistributedDataParallel: the reference every speed-up in the suite is measured against."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from algorithms import comm
from algorithms.base import Algorithm, Plan
from algorithms.topology import Topology


class BucketBytes:
    """What a ``DistributedDataParallel`` of ``module`` over ``p`` ranks sends, for ``comm.count``: DDP's
    messages leave from C++, past the suite's collectives, so they are counted from what its buckets
    and broadcasts hold.

    Its constructor broadcasts rank 0's parameters and buffers; each training step all-reduces its
    buckets, which hold every gradient (the parameters that require one), and, before the forward
    pass, broadcasts the module's buffers from rank 0 (``broadcast_buffers``, DDP's default, which
    the suite keeps). ``buckets=False`` where a comm hook replaces the all-reduce and counts what it
    sends itself.
    """

    def __init__(self, module: nn.Module, p: int, buckets: bool = True) -> None:
        self.p, self.counts_buckets = p, buckets
        self.gradients = sum(comm.tensor_bytes(q) for q in module.parameters() if q.requires_grad)
        self.buffers = sum(comm.tensor_bytes(b) for b in module.buffers())
        comm.count(comm.broadcast_bytes(comm.tensor_bytes(list(module.parameters()) + list(module.buffers())), p))

    def step(self) -> None:
        """Count one training step: the buffers' broadcast, the buckets' all-reduce."""
        comm.count(comm.broadcast_bytes(self.buffers, self.p))
        if self.counts_buckets:
            comm.count(comm.ring_allreduce_bytes(self.gradients, self.p))


def device_ids(model: nn.Module) -> list[int] | None:
    """DDP's ``device_ids``: the model's one GPU, or ``None`` for a CPU model.

    Decided by where the model is, not by whether CUDA is present: ``--set device=cpu`` on a GPU
    node builds a CPU model, for which DDP refuses any device id.
    """
    device = next(model.parameters()).device
    return [device.index] if device.type == "cuda" else None


class DDP(Algorithm):
    """PyTorch DistributedDataParallel: bucketed gradient all-reduce overlapped with backward.

    Paper: Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
    VLDB 2020, https://arxiv.org/abs/2006.15704.

    The model is wrapped in ``torch.nn.parallel.DistributedDataParallel`` as is, with no comm hook, so
    the baseline is the real thing. Gradients are averaged bucket by bucket while backward still
    runs; ``comm_s`` therefore stays 0 (the overlapped time is not separable). The throughput
    benchmark measures the communication share instead, against a run with no communication.

    Args:
        bucket_cap_mb: DDP's gradient bucket size in MiB (default 25, DDP's own default).

    Example::

        algo = DDP(topology)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    overlaps_comm = True
    broadcast_start = False  # the wrapper broadcasts the initial state itself
    family = "all-reduce"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py

    def __init__(self, topology: Topology, *, bucket_cap_mb: float = 25.0) -> None:
        super().__init__(topology)
        if bucket_cap_mb <= 0:
            raise ValueError(f"Arg ``bucket_cap_mb`` must be positive, got {bucket_cap_mb}.")
        self.bucket_cap_mb = bucket_cap_mb

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        self.ddp = DistributedDataParallel(
            model,
            device_ids=device_ids(model),
            bucket_cap_mb=self.bucket_cap_mb,
        )
        self.sent = BucketBytes(model, self.topology.world_size)
        super().prepare(model, optimizer, plan)
        return self.ddp

    def step(self) -> None:
        # The gradients were averaged during backward; only the local update is left.
        self.sent.step()
        self.optimizer.step()
        self.step_count += 1
