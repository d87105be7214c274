"""A rank's clock on the virtual cluster: compute time from the step-time model, straggler delays,
DDP's buckets overlapped with backward, and the Hogwild updaters' counters."""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from algorithms import comm
from benchmarks.stragglers import MACHINE_CV, GammaTimes

if TYPE_CHECKING:
    from benchmarks.virtual.job import Cluster

# The forward pass's share of a batch's compute; backward costs about twice the forward (two matrix
# products per layer against one: Kaplan et al., "Scaling Laws for Neural Language Models", 2020, Sec. 2.1).
FORWARD_SHARE = 1.0 / 3.0


T = TypeVar("T")


@dataclass(eq=False)
class Counters:
    """The ranks' Hogwild update counters as the job sees them over virtual time (threads run in time
    order, so every list is in time order): the time of every update, and the job-wide highest
    counter with the time it rose to each value."""

    counts: dict[int, int] = field(default_factory=dict)
    updates: list[float] = field(default_factory=list)  # the time of each update, any rank's
    times: list[float] = field(default_factory=lambda: [0.0])
    highest: list[int] = field(default_factory=lambda: [0])

    def reached(self, threshold: int) -> float | None:
        """When some counter first reached ``threshold`` (None: not yet)."""
        if self.highest[-1] < threshold:
            return None
        return self.times[bisect.bisect_left(self.highest, threshold)]


class VirtualClock:
    """A rank's clock on the virtual cluster, as the runner reads it (``clock.WallClock``'s interface).

    A batch's forward and backward cost ``sim_step_ms``, or, under the ``gamma``/``gamma_het``
    straggler models, a time drawn from them with that mean (DANA's model, as in
    ``benchmarks/simulator.py``); a straggler's fixed delay advances the clock as it would sleep.
    """

    kind = "simulated"

    def __init__(self, cluster: Cluster, rank: int, cfg) -> None:
        s = cfg.settings
        self.scheduler, self.rank = cluster.scheduler, rank
        self.step_ms = s.sim_step_ms  # kept as given: env.json reports the setting, not a round trip through seconds
        self.step_s = self.step_ms / 1000.0
        self.step_source = s.sim_step_source
        self.times = (
            GammaTimes(s.straggler, cfg.world_size, self.step_s, cfg.seed) if s.straggler in MACHINE_CV else None
        )
        # Machine noise: each batch's time varies by ``sim_step_cv`` around the mean (a gamma law, this
        # rank's own stream). A deterministic clock ties every rank to the nanosecond, which no machine
        # does, and a tie can change what a protocol does (every rank of a WAGMA round activates it).
        self.step_cv = s.sim_step_cv
        self.noise = np.random.default_rng([cfg.seed, rank, 0x5717]) if self.step_cv > 0 else None
        self.network, self.cluster = cluster.network, cluster
        self.actor = cluster.scheduler.actors[rank]  # the rank's main thread
        self.model_mb = s.sim_model_mb
        self.updater_speedup = s.sim_updater_speedup
        self._batch_s: float | None = None  # this batch's compute time, once drawn
        self._charged_s = 0.0  # the part of it charged so far

    def shared(self, key: object, make: Callable[[], T]) -> T:
        """One ``make()`` for every rank of the cluster: its ranks are threads of one process, and the
        read-only datasets need one copy, not one a rank (1,024 copies of MNIST-1D drawn 5x larger
        were 4 GB)."""
        if key not in self.cluster.shared:
            self.cluster.shared[key] = make()
        return self.cluster.shared[key]

    def __call__(self) -> float:
        return self.scheduler.now()

    def compute(self, until: float | None = None, hand_on: bool = True) -> None:
        """Charge the batch's compute time: all of it that is left (the runner, after backward), or up
        to the fraction ``until`` of it (DDP's buckets during backward, ``overlap_backward``, which
        runs ahead of the other ranks: ``hand_on=False``, see ``Scheduler.advance``)."""
        if self._batch_s is None:
            self._batch_s = self._draw()
        target = self._batch_s * (1.0 if until is None else min(until, 1.0))
        self._compute(max(target - self._charged_s, 0.0), hand_on)
        self._charged_s = max(target, self._charged_s)
        if until is None:
            self._batch_s, self._charged_s = None, 0.0

    def overlap_backward(self, module: torch.nn.Module) -> None:
        """Overlap DDP's bucketed all-reduce with backward on the virtual clock, as on a real GPU.

        ``module`` is what the algorithm's ``prepare`` returned; only a ``DistributedDataParallel`` is
        touched (DDP, DASO inside a node, and the model of Horovod, ``HorovodModel``, whose messages
        go in its type and are averaged as Horovod does). Its buckets are all-reduced with PyTorch's default
        rule (divide by the group's size, sum), each started at the virtual time its gradients are
        ready: the forward pass costs ``FORWARD_SHARE`` of the batch's compute, and backward produces
        the gradients at a steady rate per parameter, in DDP's bucket order. With ``sim_model_mb``
        a bucket is split as the paper's model would be (DDP's ``bucket_cap_mb`` of that model's
        bytes), so a small embedded model overlaps as much as the large one it stands for. The
        last bucket waits for every all-reduce in flight, on the virtual clock, before DDP reads
        them (a future waited on in C++ could not hand the machine to another rank). A DDP that has
        the algorithm's own comm hook (PowerSGD's; DDP takes one hook) is charged its batch's whole
        compute at the end of the forward pass instead: the hook's messages start after backward.
        """
        if not isinstance(module, torch.nn.parallel.DistributedDataParallel):
            return
        if module._comm_hooks:  # the algorithm's own hook (PowerSGD): DDP takes one, so no overlap
            module.register_forward_hook(self._charge_batch_before_backward)
            return
        total = sum(p.numel() for p in module.parameters() if p.requires_grad)
        cap, clock = module.bucket_bytes_cap, self
        state = {"done": 0, "pending": []}
        horovod = getattr(module, "sums_then_averages", False)  # Horovod's messages: its type, its averaging
        dtype = module.message_dtype if horovod else None

        def hook(group, bucket):  # no annotations: DDP checks them, and this module's are strings
            flat = bucket.buffer()
            if not horovod:  # DDP's rule: divide by the group's size, then sum
                flat.div_(group.size())
            message = flat.to(dtype) if dtype is not None else flat
            scaled = flat.numel() * flat.element_size() * clock.cluster.byte_scale  # the gradients' bytes
            works = []
            for chunk in message.chunk(max(1, math.ceil(scaled / cap))):
                state["done"] += chunk.numel()
                clock.compute(FORWARD_SHARE + (1.0 - FORWARD_SHARE) * min(state["done"] / total, 1.0), hand_on=False)
                works.append(dist.all_reduce(chunk, group=group, async_op=True))
            future = torch.futures.Future()
            state["pending"].append((works, future, flat, message))
            if bucket.is_last():
                for works, fut, result, sent in state["pending"]:
                    for work in works:
                        work.wait()
                    if horovod:  # op=hvd.Average: the sum, then scaled by 1/p, in the message's type
                        result.copy_(sent.div_(group.size()))
                    fut.set_result(result)
                state["done"], state["pending"] = 0, []
            return future

        module.register_comm_hook(module.process_group, hook)

    def _charge_batch_before_backward(self, module: torch.nn.Module, args, output) -> None:  # noqa: ANN001
        """A training forward pass charges the batch's whole compute, so that the comm hook's messages
        during backward start at its end (the runner's ``compute`` then finds nothing left)."""
        if module.training and torch.is_grad_enabled():
            self.compute(1.0)

    def update(self, updaters: int, sizes: list[int], span: tuple[int, int]) -> None:
        """Charge one Hogwild update of a LAP/LPP-SGD updater thread (``updaters.ThreadUpdaters``).

        The rank's U updaters share its GPU, which runs them together ``sim_updater_speedup`` times as
        fast as one process alone (1: no gain, a saturated GPU), so a full update costs a batch's
        compute x U / speedup. A partial one (LPP-SGD's block ``span`` of the tensors of ``sizes``)
        costs the forward pass, the input gradients from the output down to the block's first
        tensor, and the block's own weight gradients: backward is two thirds of a batch, half of it
        each kind, spread over the tensors by parameter count (the rate ``overlap_backward`` uses).
        """
        lo, hi = span
        total = sum(sizes)
        through, own = sum(sizes[lo:]) / total, sum(sizes[lo:hi]) / total
        share = FORWARD_SHARE + (1.0 - FORWARD_SHARE) / 2 * (through + own)
        batch = self._draw()
        self._compute(batch * updaters / self.updater_speedup * share)

    def _draw(self) -> float:
        """One batch's compute time: from the gamma straggler model, with machine noise, or the mean."""
        if self.times is not None:
            return float(self.times.draw_all()[self.rank])
        if self.noise is not None:
            shape = 1.0 / self.step_cv**2
            return float(self.noise.gamma(shape, self.step_s / shape))
        return self.step_s

    def count_updates(self, count: int, update: bool = True) -> None:
        """This rank's Hogwild counter is now ``count``, by an update (``update``) or a resume, at this
        thread's time: the board that ``wait_updates`` reads. Only the waits this can end are asked
        again (one key per value waited for): asking every averager at every update costs P^2 a step."""
        board, now = self.cluster.updates, self.scheduler.now()
        board.counts[self.rank] = count
        if update:
            board.updates.append(now)
            self.scheduler.poke((board, "updates", len(board.updates)))
        if count > board.highest[-1]:
            risen = range(board.highest[-1] + 1, count + 1)
            board.times.append(now)
            board.highest.append(count)
            for value in risen:
                self.scheduler.poke((board, "reached", value))

    def job_updates(self) -> int:
        """Updates of every rank so far (``wait_updates``'s ``after``)."""
        return len(self.cluster.updates.updates)

    def wait_updates(self, threshold: int, after: int | None = None) -> None:
        """Wait until some rank's Hogwild counter reaches ``threshold`` or, with ``after``, until the
        job has made more than ``after`` updates: the virtual cluster's stand-in for the averagers'
        busy loop, which would see nothing new before (``updaters.ThreadUpdaters``)."""
        board = self.cluster.updates

        def ready() -> float | None:
            times = [board.reached(threshold)]
            if after is not None and len(board.updates) > after:
                times.append(board.updates[after])
            return min((t for t in times if t is not None), default=None)

        keys = [(board, "reached", threshold)] + ([(board, "updates", after + 1)] if after is not None else [])
        self.scheduler.wait(ready, f"a Hogwild counter to reach {threshold}", keys)

    def sleep(self, seconds: float) -> None:
        self.scheduler.advance(seconds)

    def evaluate(self, batches: float) -> None:
        """Charge an evaluation of ``batches`` training batches' worth of samples: their forward
        passes, ``FORWARD_SHARE`` of a batch's mean compute each (the clock counts evaluation, as
        MLPerf's and as the wall clock does)."""
        self._compute(FORWARD_SHARE * self.step_s * batches)

    def _compute(self, seconds: float, hand_on: bool = True) -> None:
        """The calling thread computes for ``seconds``; its next communication pays ``sync_s``."""
        if seconds > 0:
            self.scheduler.me().computed = True
        self.scheduler.advance(seconds, hand_on)

    def size_messages(self, model: torch.nn.Module) -> None:
        """With ``sim_model_mb``, charge every message as if ``model`` had that many MB of parameters,
        and count it so (``comm.sent_bytes``)."""
        if self.model_mb > 0:
            own = sum(p.numel() * p.element_size() for p in model.parameters())
            self.cluster.byte_scale = self.model_mb * 1e6 / own
        comm.set_message_scale(self.cluster.byte_scale)  # the bytes counted are the bytes charged

    columns = ("sim_compute_s", "sim_comm_s", "sim_idle_s")

    def breakdown(self) -> dict[str, float]:
        """Where this rank's virtual time went since it started (metrics.csv's ``columns``): the
        run's clock starts after the start-up messages, microseconds here."""
        a = self.actor
        return {"sim_compute_s": a.compute_s, "sim_comm_s": a.comm_s, "sim_idle_s": a.idle_s}

    def describe(self) -> dict[str, object]:
        net = self.network
        return {
            "clock": "simulated",
            "network": {
                "name": net.name,
                "intra": dataclasses.asdict(net.intra),
                "inter": dataclasses.asdict(net.inter),
                "sources": net.sources,
                "sync_s": net.sync_s,
                "skips_empty_segments": net.skips_empty_segments,
                "rails": net.rails,
                "mpi": dataclasses.asdict(net.mpi) if net.mpi else None,
                "mpi_overlap": net.mpi_overlap,
            },
            "sim_step_ms": self.step_ms,
            "sim_step_source": self.step_source,
            "sim_step_cv": self.step_cv,
            "sim_model_mb": self.model_mb,
            "sim_updater_speedup": self.updater_speedup,
            "message_scale": self.cluster.byte_scale,
        }
