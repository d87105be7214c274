"""The virtual cluster's process group: exact tensors between the thread-ranks, time from the network.

A collective completes at its last member's arrival plus what the network model charges it; a
message arrives when the network has carried it. The group is registered as ``torch.distributed``'s
backend ``virtual``, so the algorithms' own calls (``dist.all_reduce``, ``isend``, DDP's buckets)
run on it unchanged.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from benchmarks.virtual.flows import Flow
from benchmarks.virtual.network import Transfer

if TYPE_CHECKING:
    from benchmarks.virtual.job import Cluster
    from benchmarks.virtual.scheduler import Actor

BACKEND = "virtual"


@dataclass
class Collective:
    """One collective call of a group: what each member brought, and when it completes."""

    size: int
    inputs: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    clocks: dict[int, float] = field(default_factory=dict)
    result: object = None
    done_at: float | None = None
    cost: float = 0.0
    after_compute: bool = False  # a member came to it from computing: it pays ``Network.sync_s``


@dataclass(eq=False)
class Payload:
    """A copy of a sent tensor, taken when it was sent, for the messages that carry it: ``readers``
    of them are still undelivered; the last one may hand its storage to the receive (``_take``)."""

    source: torch.Tensor  # the tensor sent (kept, so that its id is not reused while the copy is shared)
    version: int  # the source's version counter when copied: an in-place write since makes a new copy
    copy: torch.Tensor | None
    readers: int = 1
    taken: bool = False  # a receive owns the copy's storage now: no send may share it


_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)  # PyTorch's own tests use it; no public form


def _use_count(t: torch.Tensor) -> int:
    """How many tensors hold ``t``'s storage (views, ``.data`` aliases), ``t`` included; 2 where this
    PyTorch cannot tell, so that the receive copies."""
    if _storage_use_count is None:
        return 2
    return _storage_use_count(t.untyped_storage()._cdata) - 1  # less the storage object of the call


def _take(t: torch.Tensor, copy: torch.Tensor) -> bool:
    """Make the receive buffer ``t`` hold ``copy``'s storage in place of its own, when no other
    tensor can see the difference: ``t`` is a whole plain tensor that nothing else shares (not a
    view, not a parameter's ``.data``), of the same shape and type. This saves a copy of every
    message a model-sized receive gets (D-PSGD's neighbours, WAGMA's butterfly, push-sum's shares),
    a pass over memory that 64 ranks' models in one machine pay from main memory."""
    if (
        type(t) is not torch.Tensor
        or t.requires_grad
        or t.shape != copy.shape
        or t.dtype != copy.dtype
        or t.device != copy.device
        or not t.is_contiguous()
        or t.storage_offset() != 0
        or t.untyped_storage().nbytes() != t.numel() * t.element_size()
        or _use_count(t) != 1
    ):
        return False
    t.set_(copy)
    return True


@dataclass(eq=False)
class Message:
    tensors: list[Payload]
    sent: float  # virtual time
    number: int  # its place among every message sent
    arrives: float | None = None  # once the network has carried it
    cost: float = 0.0  # the network's time for it, from its send to its arrival


class Inbox:
    """The messages in flight to one rank of a group with one tag: a queue per sender, delivered in
    the order sent (a message does not overtake an earlier one of its sender, as in MPI), and a
    heap of the arrived heads, so that a receive from any rank finds the earliest arrival (ties:
    the lowest sender) without looking at every sender."""

    def __init__(self) -> None:
        self.queues: dict[int, deque[Message]] = {}
        self.heads: list[tuple[float, int, int]] = []  # (arrival, sender, number), stale once delivered

    def post(self, sender: int, message: Message) -> None:
        queue = self.queues.setdefault(sender, deque())
        queue.append(message)

    def arrived(self, sender: int, message: Message) -> None:
        """``message`` has arrived: a head that has arrived can be received."""
        if self.queues[sender][0] is message:
            heapq.heappush(self.heads, (message.arrives, sender, message.number))

    def head(self, sender: int) -> Message | None:
        queue = self.queues.get(sender)
        return queue[0] if queue else None

    def pop(self, sender: int) -> Message:
        queue = self.queues[sender]
        message = queue.popleft()
        if queue and queue[0].arrives is not None:
            heapq.heappush(self.heads, (queue[0].arrives, sender, queue[0].number))
        return message

    def first(self) -> int | None:
        """The sender whose message at the head of its queue arrived first (None: none has yet)."""
        while self.heads:
            _, sender, number = self.heads[0]
            head = self.head(sender)
            if head is not None and head.number == number:
                return sender
            heapq.heappop(self.heads)
        return None


class VirtualWork(dist._Work):
    """A communication in flight; ``wait`` blocks the rank (on the virtual clock) until it completes."""

    def __init__(
        self,
        cluster: Cluster,
        ready: Callable[[], float | None],
        finish: Callable[[], None],
        what: str,
        tensors: list[torch.Tensor] | None = None,
        cost: Callable[[], float] = lambda: 0.0,
        on: object = None,
        overlap: float = 0.0,
    ):
        super().__init__()
        self.cluster, self.ready, self.finish, self.what, self.finished = cluster, ready, finish, what, False
        self.overlap = overlap  # the share of its hidden time that the rank's compute pays (``Network.mpi_overlap``)
        self.tensors, self.cost, self.on = tensors or [], cost, on  # ``on``: what ``ready`` reads
        self.source: int | None = None  # a receive from any rank: the group rank it came from

    def _source_rank(self) -> int:  # what torch.distributed.recv returns for a receive from any rank
        return self.source

    def is_completed(self) -> bool:
        t = self.ready()
        return t is not None and t <= self.cluster.scheduler.now()

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - a virtual wait has no timeout
        if not self.finished:
            waited = self.cluster.scheduler.wait(self.ready, self.what, self.on)
            me = self.cluster.scheduler.me()
            comm = min(waited, self.cost())  # the rest of the wait was for the other ranks
            me.comm_s += comm
            me.idle_s -= comm
            hidden = self.cost() - comm  # what ran behind the rank's own work
            if self.overlap > 0 and hidden > 0:
                self.cluster.scheduler.advance(self.overlap * hidden)
                me.compute_s -= self.overlap * hidden
                me.comm_s += self.overlap * hidden
            self.finish()
            self.finished = True
        return True

    def get_future(self) -> torch.futures.Future:
        """A completed future of the result: the wait happens here, on the virtual clock (a future
        waited on in C++, as DDP's reducer does, could not hand the machine to another rank)."""
        self.wait()
        future = torch.futures.Future()
        future.set_result(self.tensors)
        return future


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class VirtualGroup(dist.ProcessGroup):
    """A process group of the virtual cluster: exact tensors, modelled time."""

    def __init__(self, cluster: Cluster, group_rank: int, ranks: list[int], name: str) -> None:
        super().__init__(group_rank, len(ranks))
        self.cluster, self.ranks, self.name = cluster, ranks, name
        self.calls = 0
        # its traffic goes at MPI's pace (``comm.carried_by_mpi``; every group across nodes: ``Network.mpi_for_all``)
        network, per_node = cluster.network, cluster.procs_per_node
        self.mpi = network.mpi_for_all and network.mpi is not None and len({r // per_node for r in ranks}) > 1

    def carried_by_mpi(self) -> None:
        self.mpi = True

    def _carried(self, transfer: Transfer, key: object) -> Transfer:
        return self.cluster.network.over_mpi(transfer, key) if self.mpi else transfer

    def _overlap(self) -> float:
        return self.cluster.network.mpi_overlap if self.mpi else 0.0

    def getBackendName(self) -> str:  # noqa: N802 - ProcessGroup's name
        return BACKEND

    # -- collectives ----------------------------------------------------------------------------
    def _collective(
        self,
        tensors: list[torch.Tensor],
        transfer: Callable[[float], Transfer],
        combine: Callable[[Collective], object],
        what: str,
    ):
        """Bring ``tensors`` to this call of the collective; the last member to arrive computes the
        result (``combine``) and puts the collective's transfers (``transfer(bytes)``) on the
        group's stream: they start when the group's earlier collectives are done, as on one NCCL
        communicator's stream, and the collective completes when the network has carried them.

        The inputs are the callers' own tensors, not copies: as with any backend, a tensor in a
        collective is not written until its work is waited on, and no member's wait completes before
        the last arrival's ``combine`` has read every input. A ``combine`` whose result is an input
        (broadcast, all-gather) copies it, since a member that has waited may write its tensor
        before another reads the result. (A copy of every input was a third of an all-reduce's cost
        at 64 ranks.)"""
        key = (self.name, self.calls)
        self.calls += 1
        c = self.cluster.collectives.setdefault(key, Collective(self.size()))
        me, actor = self.rank(), self.cluster.scheduler.me()
        c.inputs[me] = [t.detach() for t in tensors]
        c.clocks[me] = actor.clock
        c.after_compute |= actor.computed
        actor.computed = False
        if len(c.inputs) == c.size:
            c.result = combine(c)
            arrival = max(c.clocks.values())
            extra = self.cluster.network.sync_s * c.after_compute

            def done(flow: Flow) -> None:
                c.done_at = flow.done_at
                c.cost = c.done_at - arrival
                self.cluster.scheduler.poke(key)

            carried = self._carried(transfer(_nbytes(tensors) * self.cluster.byte_scale), key)
            self.cluster.on_stream(self.name, arrival, carried, extra, done)
        return c, key

    def _work(self, c: Collective, key, finish: Callable[[], None], what: str, tensors=None) -> VirtualWork:
        def done() -> None:
            finish()
            c.inputs.pop(self.rank(), None)
            if not c.inputs:  # every member has its result
                self.cluster.collectives.pop(key, None)

        return VirtualWork(
            self.cluster,
            lambda: c.done_at,
            done,
            f"{what} on group {self.ranks}",
            tensors,
            lambda: c.cost,
            key,
            self._overlap(),
        )

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        net, ppn = self.cluster.network, self.cluster.procs_per_node

        def combine(c: Collective) -> list[torch.Tensor]:
            out = []
            for i in range(len(tensors)):
                inputs = [c.inputs[r][i] for r in range(c.size)]
                if op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG:  # (a ReduceOp is not found by ``in``)
                    # Added in rank order, in place: a stack of P copies (P x the model's bytes at
                    # every step) cost 10x more at 256 ranks; equal to the stack's sum up to 4 ranks.
                    total = inputs[0].clone()
                    for t in inputs[1:]:
                        total.add_(t)
                    out.append(total if op == dist.ReduceOp.SUM else total.div_(c.size))
                elif op == dist.ReduceOp.MAX:
                    out.append(torch.stack(inputs).max(0).values)
                elif op == dist.ReduceOp.MIN:
                    out.append(torch.stack(inputs).min(0).values)
                else:  # no algorithm of the suite uses another; a new one gets told which exist
                    raise ValueError(f"the virtual cluster's all-reduce takes SUM, AVG, MAX or MIN, got {op}")
            return out

        elements = sum(t.numel() for t in tensors)

        c, key = self._collective(tensors, lambda n: net.ring(self.ranks, ppn, n, elements), combine, "all_reduce")

        def finish() -> None:
            for t, r in zip(tensors, c.result):
                t.copy_(r)

        return self._work(c, key, finish, "all_reduce", tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        net, ppn = self.cluster.network, self.cluster.procs_per_node
        c, key = self._collective(
            tensors,
            lambda n: net.tree(self.ranks, ppn, n),
            lambda c: [t.clone() for t in c.inputs[root]],
            "broadcast",
        )

        def finish() -> None:
            for t, r in zip(tensors, c.result):
                t.copy_(r)

        return self._work(c, key, finish, "broadcast", tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        net, ppn = self.cluster.network, self.cluster.procs_per_node
        c, key = self._collective(
            input_tensors,
            lambda n: net.gather_ring(self.ranks, ppn, n),
            lambda c: [[t.clone() for t in c.inputs[r]] for r in range(c.size)],
            "all_gather",
        )

        def finish() -> None:
            for i, outs in enumerate(output_tensors):
                for r, out in enumerate(outs):
                    out.copy_(c.result[r][i])

        return self._work(c, key, finish, "all_gather")

    def barrier(self, opts=None):
        c, key = self._collective([], lambda n: Transfer(0.0, {}, 0.0), lambda c: None, "barrier")
        return self._work(c, key, lambda: None, "barrier")

    # -- point to point -------------------------------------------------------------------------
    def _inbox(self, dst: int, tag: int) -> Inbox:
        return self.cluster.inboxes.setdefault((self.name, dst, tag), Inbox())

    def send(self, tensors, dst, tag):
        cluster, me, actor = self.cluster, self.ranks[self.rank()], self.cluster.scheduler.me()
        to, now, sender = self.ranks[dst], cluster.scheduler.now(), self.rank()
        transfer = cluster.network.message(me, to, cluster.procs_per_node, _nbytes(tensors) * cluster.byte_scale)
        transfer = self._carried(transfer, ("message", cluster.messages))
        latency = transfer.latency + cluster.network.sync_s * actor.computed
        actor.computed = False
        inbox = self._inbox(dst, tag)
        message = Message([self._payload(actor, t) for t in tensors], now, cluster.messages)
        inbox.post(sender, message)
        cluster.messages += 1
        flow = cluster.fabric.add(now, transfer.nbytes, transfer.links, latency)

        def arrived(flow: Flow) -> None:
            message.arrives, message.cost = flow.done_at, flow.done_at - now
            inbox.arrived(sender, message)
            cluster.scheduler.poke(inbox)
            cluster.scheduler.poke(flow)

        flow.on_done.append(arrived)
        return VirtualWork(
            cluster,
            lambda: flow.done_at,
            lambda: None,
            f"send to {to}",
            None,
            lambda: message.cost,
            flow,
            self._overlap(),
        )

    @staticmethod
    def _payload(actor: Actor, t: torch.Tensor) -> Payload:
        """A copy of ``t`` for a message: the one a send of the same unchanged tensor took since
        the sender last waited or computed, else a new one. (A tensor in flight is not written until
        its send is waited for, as with any backend.)"""
        shared = actor.sent.get(id(t))
        if shared is not None and not shared.taken and shared.source is t and shared.version == t._version:
            shared.readers += 1
            return shared
        actor.sent[id(t)] = payload = Payload(t, t._version, t.detach().clone())
        return payload

    def _deliver(self, inbox: Inbox, sender: int, tensors: list[torch.Tensor]) -> None:
        for t, payload in zip(tensors, inbox.pop(sender).tensors):
            payload.readers -= 1
            if payload.readers == 0 and _take(t, payload.copy):
                payload.taken, payload.copy = True, None  # the receive holds the storage alone
            else:
                t.copy_(payload.copy)
        self.cluster.scheduler.poke(inbox)  # another receive of the same inbox sees a new head

    def recv(self, tensors, src, tag):
        inbox = self._inbox(self.rank(), tag)

        def ready() -> float | None:
            head = inbox.head(src)
            return None if head is None else head.arrives

        def cost() -> float:
            head = inbox.head(src)
            return 0.0 if head is None else head.cost

        return VirtualWork(
            self.cluster,
            ready,
            lambda: self._deliver(inbox, src, tensors),
            f"receive from {self.ranks[src]}",
            cost=cost,
            on=inbox,
        )

    def recv_anysource(self, tensors, tag):
        inbox = self._inbox(self.rank(), tag)

        def ready() -> float | None:
            sender = inbox.first()
            return None if sender is None else inbox.head(sender).arrives

        def finish() -> None:
            work.source = inbox.first()
            self._deliver(inbox, work.source, tensors)

        work = VirtualWork(
            self.cluster,
            ready,
            finish,
            "receive from any rank",
            cost=lambda: inbox.head(inbox.first()).cost,
            on=inbox,
        )
        return work


_active: list[Cluster | None] = [None]  # the running job's cluster, which new groups belong to


def activate(cluster: Cluster | None) -> None:
    """Make ``cluster`` the one whose ranks create groups from now on (None: no job runs)."""
    _active[0] = cluster


def active() -> Cluster | None:
    return _active[0]


def _create_group(opts, _backend_options) -> VirtualGroup:
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return VirtualGroup(_active[0], opts.group_rank, ranks, opts.group_id)


dist.Backend.register_backend(BACKEND, _create_group, extended_api=True, devices=["cpu", "cuda"])
