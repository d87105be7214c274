"""PyTorch DistributedDataParallel: the reference every speed-up in the suite is measured against."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from algorithms.base import Algorithm, Plan
from algorithms.topology import Topology


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
    simulator = "virtual"

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
        super().prepare(model, optimizer, plan)
        return self.ddp

    def step(self) -> None:
        # The gradients were averaged during backward; only the local update is left.
        self.optimizer.step()
        self.step_count += 1
