"""DASO: hierarchical, selective and asynchronous data parallelism, on torch.distributed alone.

The reference implementation (Heat's ``ht.optim.DASO``) needs MPI beside NCCL and at least two GPUs
per node. This one uses only ``torch.distributed`` process groups: DDP over a node-local group for
the per-batch gradient averaging, and one cross-node group per local index for the global parameter
averaging, started with ``all_reduce(async_op=True)`` and merged S batches later. The schedule (which
batch sends, which merges) is a pure function, ``batch_events``, checked in the tests against the
timeline of Heat 1.0.0's ``DASO.step`` (``heat/optim/dp_optimizer.py``; the papers draw it in Fig. 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from algorithms import comm
from algorithms.base import Algorithm, Plan
from algorithms.comm import broadcast_, flatten, unflatten_into
from algorithms.ddp import BucketBytes
from algorithms.topology import Topology

DOWNCAST = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def merge(local: torch.Tensor, received_sum: torch.Tensor, staleness: int, group_size: int) -> torch.Tensor:
    """Eq. (2) of the journal paper: x = (2S x_local + sum_i x_i) / (2S + P), with P the group size.

    The local parameters (after S more local steps) weigh 2S against 1 for each stale copy received,
    the sender's own included. As in Heat, S = 0 weighs the local copy 1 (not 0).
    """
    numer = 2.0 * staleness if staleness else 1.0
    return local * (numer / (numer + group_size)) + received_sum / (numer + group_size)


@dataclass(frozen=True)
class Pending:
    """A global send in flight: group ``k`` sent at batch ``t_send``, to be merged with weight 2s."""

    k: int
    t_send: int
    s: int


@dataclass(frozen=True)
class Event:
    """One action of a batch: ``average`` (blocking plain average of group k's parameters, in
    ``low_precision`` during warm-up and cool-down), ``send`` (start group k's non-blocking
    all-reduce), ``merge`` (finish a pending send with Eq. (2)). Each ends with a node-local
    broadcast from local rank k."""

    kind: str
    k: int
    low_precision: bool = False
    pending: Pending | None = None


def batch_events(
    t: int, last_batch: int, B: int, S: int, rot: int, pending: Pending | None, groups: int, heat_quirks: bool = True
) -> tuple[list[Event], int, Pending | None]:
    """The global-sync events of batch ``t`` (after its local step), and the next ``rot`` and pending.

    B = 0 encodes the blocking phases (warm-up, cool-down): one group averages every batch. In the
    cycling phase a group sends every B batches; the result is merged S batches later, or at the next
    send if that comes first; the last batch of an epoch always ends in a blocking average, so all
    models are equal at every epoch end. ``heat_quirks`` reproduces the reference code's receive
    test (Heat 1.0.0's ``DASO.step``: a receive due on the batch before a send slips to that send,
    and the test uses S clipped at the current batch); without it a send is merged exactly S batches later.
    """
    nxt = lambda r: 0 if t == last_batch else (r + 1) % groups  # noqa: E731 - rotation resets each epoch
    if B == 0:
        return [Event("average", rot, low_precision=True)], nxt(rot), None
    g = t % B
    s_now = min(S, last_batch - t)  # never schedule a receive after the epoch's last batch
    if t == last_batch or g == 0:
        events = [Event("send", rot)]
        if pending is not None:  # due at or before this send (S >= B - 1): merged after the new send
            events.append(Event("merge", pending.k, pending=pending))
        if t == last_batch or s_now == 0:  # blocking receive of the new send: plain average
            events.append(Event("average", rot))
            return events, nxt(rot), None
        return events, nxt(rot), Pending(rot, t, s_now)
    if pending is None:
        return [], rot, None
    if heat_quirks:
        due = (t + 1) % B != 0 and g == s_now
    else:
        due = t - pending.t_send == pending.s
    if due:
        return [Event("merge", pending.k, pending=pending)], rot, None
    return [], rot, pending


class PlateauDetector:
    """Heat's ``DetectMetricPlateau``: a plateau is ``patience + 1`` epochs in a row without a
    ``threshold`` relative improvement on the best loss so far (``best`` is not reset after one)."""

    def __init__(self, threshold: float = 0.05, patience: int = 2) -> None:
        self.threshold, self.patience = threshold, patience
        self.best, self.bad = math.inf, 0

    def step(self, loss: float) -> bool:
        bound = self.best * (1 - self.threshold) if self.best >= 0 else self.best * (1 + self.threshold)
        if loss < bound:
            self.best, self.bad = loss, 0
            return False
        self.bad += 1
        if self.bad > self.patience:
            self.bad = 0
            return True
        return False


class DASO(Algorithm):
    """DASO: node-local gradient averaging every batch, rotating non-blocking global parameter averaging.

    Paper: Coquelin, Debus, Götz, von der Lehr, Kahn, Siggel, Streit, "Accelerating neural network
    training with distributed asynchronous and selective optimization (DASO)", Journal of Big Data
    9:14, 2022, https://arxiv.org/abs/2104.05588.

    Why: inside a node (NVLink) communication is cheap, across nodes it is not. DASO averages
    gradients inside the node every batch (DDP over the node's group), and across nodes only one
    GPU per node, one group of the G cross-node groups in turn, averages its parameters every B
    batches, without blocking; the result is merged S batches later with the local parameters
    weighted 2S (``merge``) and broadcast inside the node. Warm-up and cool-down epochs average
    every batch, blocking, with the parameters cast to ``downcast`` for the transfer; the cycling
    phase sends fp32. On a training-loss plateau B and S halve, down to 1; at 1 they reset to
    ``max_global_skips`` and ``max_global_skips // 4`` (or ``batches_to_wait``). With
    ``fixed_cycle`` B and S stay at ``max_global_skips`` and ``batches_to_wait`` throughout the
    cycling phase, as in the papers' parameter study (J. Big Data 2022, Table 2, which also turns
    the warm-up and cool-down off: ``sync_warmup_epochs=0, sync_cooldown_epochs=0``). Every epoch
    ends with a blocking average, so all models are equal at each epoch end (batch-norm buffers and
    momentum stay per node).

    With one process per node there is no node-local group: each rank forms its own "node", all
    ranks are in the single cross-node group and every global sync involves all of them, so DASO
    reduces to periodic, stale-merged parameter averaging (the paper's selectivity needs G > 1).

    Args:
        max_global_skips: B_max, batches between global syncs at the start of each cycle (default
            4, the papers' experiments); S starts at ``batches_to_wait``.
        batches_to_wait: S at the start of each cycle, the batches a global sync is waited for
            before its merge, 0 (a blocking average in the batch of the send) to
            ``max_global_skips``; None (default): ``max(1, max_global_skips // 4)``, the papers' rule.
        fixed_cycle: hold B = ``max_global_skips`` and S = ``batches_to_wait`` for the whole
            cycling phase: no halving on a plateau, no reset (the papers'
            Table 2). False (default): B and S follow the plateaus.
        stability_level: relative loss improvement below which an epoch counts as stable (0.05).
        patience: stable epochs tolerated before a plateau fires (2: fires on the 3rd, as Heat).
        sync_warmup_epochs: blocking epochs at the start (default 4, Heat's default).
        sync_cooldown_epochs: blocking epochs at the end (default 5, as the code that produced the
            published runs: Heat's Feb-2021 ``SkipBatches``; Heat 1.0.0 uses 4; the papers give no
            number, arXiv v1 Sec. 3).
        downcast: transfer type of the blocking phases, ``bfloat16`` (default, the papers),
            ``float16`` or ``float32``.
        heat_quirks: receive timing exactly as Heat (True, default) or exactly S batches after the
            send (False); see ``batch_events``.
        chunk_size: elements per all-reduce of a global send (default 10,000,000 as Heat).

    Example::

        algo = DASO(topology, max_global_skips=4)
        model = algo.prepare(model, optimizer, plan)
        for epoch in range(plan.epochs):
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                algo.step()
            algo.end_epoch(train_loss)
    """

    family = "hierarchical"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py
    short_run_knobs = {"sync_warmup_epochs": 1, "sync_cooldown_epochs": 0}  # past its warm-up: sends in flight

    def __init__(
        self,
        topology: Topology,
        *,
        max_global_skips: int = 4,
        batches_to_wait: int | None = None,
        fixed_cycle: bool = False,
        stability_level: float = 0.05,
        patience: int = 2,
        sync_warmup_epochs: int = 4,
        sync_cooldown_epochs: int = 5,
        downcast: str = "bfloat16",
        heat_quirks: bool = True,
        chunk_size: int = 10_000_000,
    ) -> None:
        super().__init__(topology)
        for name, value in (("max_global_skips", max_global_skips), ("chunk_size", chunk_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Arg ``{name}`` must be a positive integer, got {value}.")
        for name, value in (
            ("sync_warmup_epochs", sync_warmup_epochs),
            ("sync_cooldown_epochs", sync_cooldown_epochs),
            ("patience", patience),
        ):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"Arg ``{name}`` must be a non-negative integer, got {value}.")
        if batches_to_wait is not None and (
            isinstance(batches_to_wait, bool)
            or not isinstance(batches_to_wait, int)
            or not 0 <= batches_to_wait <= max_global_skips
        ):
            raise ValueError(
                f"Arg ``batches_to_wait`` must be None or an integer from 0 to ``max_global_skips`` "
                f"({max_global_skips}), got {batches_to_wait}: lower it, or raise ``max_global_skips``."
            )
        if downcast not in DOWNCAST:
            raise ValueError(f"Arg ``downcast`` must be one of {sorted(DOWNCAST)}, got {downcast!r}.")
        self.max_global_skips, self.downcast, self.heat_quirks = max_global_skips, DOWNCAST[downcast], heat_quirks
        self.batches_to_wait = max(1, max_global_skips // 4) if batches_to_wait is None else batches_to_wait
        self.fixed_cycle = fixed_cycle
        self.warmup, self.cooldown, self.chunk_size = sync_warmup_epochs, sync_cooldown_epochs, chunk_size
        self.plateau = PlateauDetector(stability_level, patience)
        self.B, self.S, self.epoch, self.t, self.rot = 0, 0, 0, 0, 0
        self.pending: Pending | None = None
        self.in_flight: dict[int, tuple[list, torch.Tensor]] = {}  # t_send -> (works, buffer), sender only
        self.syncs = self.sync_bytes = 0
        self.last_epoch = {"B": 0, "S": 0, "phase": "warmup", "global_syncs": 0, "global_sync_bytes": 0}

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        topo, g = self.topology, self.topology.procs_per_node
        # Every rank creates every group, in the same order, as torch.distributed requires.
        node_groups = [dist.new_group(topo.node_ranks(n)) for n in range(topo.nodes)]
        self.cross_groups = [dist.new_group(topo.cross_node_ranks(k)) for k in range(g)]
        for group in self.cross_groups:  # Heat's global syncs go through MPI (the virtual cluster's rate)
            if group != dist.GroupMember.NON_GROUP_MEMBER:
                comm.carried_by_mpi(group)
        self.node_group = node_groups[topo.node]
        # The model's device, not whether CUDA exists: DDP refuses device ids for a CPU model (gloo
        # runs and the tests on a GPU machine).
        device = next(model.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=self.node_group)
        self.node_bytes = BucketBytes(model, g)  # what the node-local DDP sends
        super().prepare(model, optimizer, plan)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.n_params = sum(p.numel() for p in self.params)
        if self.warmup == 0:
            self._start_cycle()
        return self.ddp

    def step(self) -> None:
        self.node_bytes.step()
        self.optimizer.step()
        events, self.rot, self.pending = batch_events(
            self.t,
            self.plan.steps_per_epoch - 1,
            self.B,
            self.S,
            self.rot,
            self.pending,
            self.topology.procs_per_node,
            self.heat_quirks,
        )
        for event in events:
            getattr(self, f"_{event.kind}")(event)
            if event.kind == "send" or event.low_precision:  # a new global sync (not a receive)
                self.syncs += 1
                self.sync_bytes += (
                    self.n_params * (self.downcast.itemsize if event.low_precision else 4) * self.topology.nodes
                )
        self.t = 0 if self.t == self.plan.steps_per_epoch - 1 else self.t + 1
        self.step_count += 1

    def _mine(self, k: int) -> bool:
        return self.topology.local_rank == k

    def _send(self, event: Event) -> None:
        if self._mine(event.k):
            buffer = flatten([p.data for p in self.params])  # fp32: casting would delay the send
            works = [
                comm.all_reduce(c, group=self.cross_groups[event.k], async_op=True)
                for c in buffer.split(self.chunk_size)
            ]
            self.in_flight[self.t] = (works, buffer)

    def _merge(self, event: Event) -> None:
        if self._mine(event.k):
            works, buffer = self.in_flight.pop(event.pending.t_send)
            start = self._timed_start()
            for work in works:
                work.wait()
            self._timed_stop(start)
            local = flatten([p.data for p in self.params])
            unflatten_into(merge(local, buffer, event.pending.s, self.topology.nodes), [p.data for p in self.params])
        self._node_broadcast(event.k)

    def _average(self, event: Event) -> None:
        start = self._timed_start()
        if self._mine(event.k):
            if event.low_precision:  # pack in 16 bits, sum in 16 bits as Heat's MPI op, then cast back
                buffer = flatten([p.data for p in self.params]).to(self.downcast)
                comm.all_reduce(buffer, group=self.cross_groups[event.k])
            else:  # the blocking receive of the send this batch started
                works, buffer = self.in_flight.pop(self.t)
                for work in works:
                    work.wait()
            unflatten_into(buffer.float() / self.topology.nodes, [p.data for p in self.params])
        self._timed_stop(start)
        self._node_broadcast(event.k)

    def _node_broadcast(self, k: int) -> None:
        """Fig. 4's local update: local rank k's parameters to the rest of its node."""
        if self.topology.procs_per_node > 1:
            start = self._timed_start()
            broadcast_(
                [p.data for p in self.params],
                src=self.topology.node_ranks(self.topology.node)[k],
                group=self.node_group,
            )
            self._timed_stop(start)

    def _start_cycle(self) -> None:
        self.B, self.S = self.max_global_skips, self.batches_to_wait

    def end_epoch(self, train_loss: float) -> None:
        """Phase logic (arXiv v1 Sec. 3; details as Heat 1.0.0's ``epoch_loss_logic``): warm-up, cycling
        with plateau-driven B/S (held with ``fixed_cycle``), cool-down."""
        self.last_epoch = {
            "B": self.B,
            "S": self.S,
            "phase": self.phase,
            "global_syncs": self.syncs,
            "global_sync_bytes": self.sync_bytes,
        }
        self.epoch += 1
        self.syncs = self.sync_bytes = 0
        e = self.epoch
        if e < self.warmup or e >= self.plan.epochs - self.cooldown:
            self.B, self.S = 0, 0
            return
        if e == self.warmup:
            self._start_cycle()
        if self.fixed_cycle:
            return
        if self.plateau.step(train_loss):
            if self.B > 1:  # S = 0 stays 0 (a blocking receive); S >= 1 halves down to 1
                self.B, self.S = self.B // 2, min(self.S, max(1, self.S // 2))
            else:
                self._start_cycle()

    @property
    def phase(self) -> str:
        if self.B:
            return "cycling"
        return "warmup" if self.epoch < self.warmup else "cooldown"

    columns = ("B", "S", "phase", "global_syncs", "global_sync_bytes")

    def metrics(self) -> dict[str, object]:
        """The epoch just ended: its B, S and phase, and its global syncs (count, and bytes put on the
        inter-node links: the payload times the group size N)."""
        return dict(self.last_epoch)

    def state_dict(self) -> dict[str, object]:
        """B, S, the phase (from the epoch), the plateau detector, and the position in the epoch's
        schedule: batch ``t``, rotation, the pending receive. A global send still in flight is waited
        for and its summed buffer stored, so the merge S batches later finds it after a resume."""
        in_flight = {}
        for t_send, (works, buffer) in self.in_flight.items():
            for work in works:
                work.wait()
            in_flight[t_send] = buffer
        self.in_flight = {t_send: ([], buffer) for t_send, buffer in in_flight.items()}
        pending = None if self.pending is None else (self.pending.k, self.pending.t_send, self.pending.s)
        return {
            **super().state_dict(),
            "B": self.B,
            "S": self.S,
            "epoch": self.epoch,
            "plateau": (self.plateau.best, self.plateau.bad),
            "t": self.t,
            "rot": self.rot,
            "pending": pending,
            "in_flight": in_flight,
            "syncs": self.syncs,
            "sync_bytes": self.sync_bytes,
            "last_epoch": dict(self.last_epoch),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the schedule's position and the sums in flight, these onto the parameters' device
        (a checkpoint is read onto the CPU; the merge adds them to the parameters)."""
        super().load_state_dict(state)
        self.B, self.S, self.epoch = int(state["B"]), int(state["S"]), int(state["epoch"])
        self.plateau.best, self.plateau.bad = state["plateau"]
        self.t, self.rot = int(state["t"]), int(state["rot"])
        self.pending = None if state["pending"] is None else Pending(*state["pending"])
        device = self.params[0].device
        self.in_flight = {int(t): ([], buffer.to(device)) for t, buffer in state["in_flight"].items()}
        self.syncs, self.sync_bytes = int(state["syncs"]), int(state["sync_bytes"])
        self.last_epoch = dict(state["last_epoch"])
