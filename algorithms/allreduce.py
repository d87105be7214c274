"""Explicit per-step gradient averaging: the "classic" data-parallel baseline of the DASO paper."""

from __future__ import annotations

from algorithms.base import Algorithm
from algorithms.comm import flat_average_
from algorithms.topology import Topology


class AllReduce(Algorithm):
    """Synchronous SGD with one blocking all-reduce of all gradients after backward.

    Paper: the "classic" data-parallel baseline of Coquelin et al., "Accelerating neural network
    training with distributed asynchronous and selective optimization (DASO)", Journal of Big Data
    2022, https://arxiv.org/abs/2104.05588 (also WAGMA-SGD's "Allreduce" baseline).

    Unlike DDP, communication starts only when backward has finished, so the whole all-reduce is on
    the critical path and is timed as ``comm_s``. Comparing it with DDP isolates what overlapping
    communication with backward buys. The update is mathematically DDP's: with the same seed the
    parameters agree after every step (to floating-point reordering). Buffers (batch-norm
    statistics) stay local, as in Horovod.

    Args:
        none beyond the topology: the gradients go in one fused buffer.

    Example::

        algo = AllReduce(topology)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    family = "all-reduce"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)

    def step(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        start = self._timed_start()
        flat_average_(grads)
        self._timed_stop(start)
        self.optimizer.step()
        self.step_count += 1
