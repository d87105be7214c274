"""The virtual cluster: P ranks as threads of one process, on a virtual clock, running the real code.

Each rank is a thread that runs the same training loop, the same algorithm and the same calls to
``torch.distributed`` as a rank of a real job. Its process groups are ``VirtualGroup``s: they carry
the tensors between the threads, exactly, and charge each operation what the network model of
``benchmarks/cluster.py`` says it costs. Every rank has its own clock; the loop advances it by the
compute time model at each batch, and a communication ends at the virtual time the model gives.
So an algorithm's rule is written once: what is simulated is time, never arithmetic.

Only one rank runs at a time, the one whose next event is earliest (a conservative discrete-event
simulation): a rank runs until it must wait for another (a collective, a receive, a non-blocking
operation's ``wait``), then the rank with the smallest clock among those that can go on runs next.
A message is therefore delivered in the order of virtual time, whatever the order of the threads on
the machine, and a run is deterministic. Running ranks one at a time also gives each the machine's
cores for its own compute, and lets the rank switch swap the random-number state, so that every
rank draws from its own generator as a process would.

The thread-local ``torch.distributed`` state (each thread its own default group and group map)
follows the way PyTorch's own multi-threaded test process group does it
(``torch/testing/_internal/distributed/multi_threaded_pg.py``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import heapq
import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from algorithms import comm
from algorithms.horovod import HorovodModel
from benchmarks import cluster
from benchmarks.cluster import Network
from benchmarks.launcher import Launch
from benchmarks.stragglers import MACHINE_CV, GammaTimes

BACKEND = "virtual"
# The forward pass's share of a batch's compute; backward costs about twice the forward (two matrix
# products per layer against one: Kaplan et al., "Scaling Laws for Neural Language Models", 2020, Sec. 2.1).
FORWARD_SHARE = 1.0 / 3.0


class Deadlock(RuntimeError):
    """Every rank waits for another: the program would hang on a real cluster too."""


def _taken_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class Actor:
    """A thread of the virtual cluster as the scheduler sees it: a rank's main thread, or a thread
    that a rank started (WAGMA's progress thread, AD-PSGD's gossip thread), with a clock of its own."""

    rank: int
    index: int = 0  # its place in the scheduler's list: ties between equal times go to the lowest
    clock: float = 0.0
    ready: Callable[[], float | None] | None = None  # while it waits: when it may go on (None: not yet)
    done: bool = False
    rng: torch.Tensor | None = None
    waiting_for: str = ""
    waits_on: object = None  # what its ``ready`` depends on: whoever changes that pokes it (``Scheduler.poke``)
    stamp: int = 0  # its entry in the scheduler's queue is current only with this stamp
    # where its virtual time went: computing (straggler delays included), in communication (the
    # modelled cost of what it waited for), idle (waiting for other ranks or its own threads)
    compute_s: float = 0.0
    comm_s: float = 0.0
    idle_s: float = 0.0
    computed: bool = False  # it has computed since its last communication (``Network.sync_s``)
    # the copies its sends have taken since it last waited or computed, by the sent tensor's id: a
    # tensor sent to several ranks at once is copied once (``VirtualGroup.send``). Its clock moves
    # only in ``advance`` and ``wait``, which clear it, so no send of it completes while it is kept
    sent: dict[int, _Payload] = field(default_factory=dict)
    # released when it is its turn; its thread takes it to go on. A bare lock is the cheapest hand-off
    # Python has (an Event's set and wait take a condition and a fresh lock each, 40 % more per switch)
    go: threading.Lock = field(default_factory=_taken_lock)


class Scheduler:
    """Runs one actor at a time: the one whose next event (its clock, or the time the thing it waits
    for completes) is earliest; ties go to the lowest index (the ranks first, in rank order).

    The candidates are kept in a heap of (time, index): an actor enters it when it hands the machine
    on, at its clock, or, when it waits, at the time its ``ready`` gives, once that is known. An
    actor waits on something (``waits_on``: a mailbox, a collective call, a lock, an event, a
    thread); whoever changes that thing calls ``poke``, which asks its waiters again. So a switch
    costs O(log actors) instead of asking every actor (at 256 ranks with a thread or two each, most
    of them waiting, that scan was the whole cost of a run). An entry is checked when it reaches the
    top of the heap: a time that has moved since is queued again, an actor that can no longer go on
    (a lock taken meanwhile) waits for its next poke.
    """

    def __init__(self, world_size: int) -> None:
        self.actors = [Actor(r, r) for r in range(world_size)]
        self.threads: list[threading.Thread] = []
        self.current: Actor | None = None
        self.error: BaseException | None = None
        self.local = threading.local()
        self.queue: list[tuple[float, int, int, Actor]] = []  # (time, index, stamp, actor)
        self.waiters: dict[object, set[Actor]] = {}  # what is waited on -> who waits on it
        self.polled: set[Actor] = set()  # waiting on nothing named: asked at every switch

    # -- used by the ranks' threads -------------------------------------------------------------
    def me(self) -> Actor:
        return self.local.actor

    def now(self) -> float:
        return self.me().clock

    def advance(self, seconds: float) -> None:
        """The calling rank computes for ``seconds`` of virtual time; others may run meanwhile."""
        me = self.me()
        me.clock += seconds
        me.compute_s += seconds
        me.sent.clear()
        self._switch(me)

    def wait(self, ready: Callable[[], float | None], what: str, on: object = None) -> float:
        """Block the calling rank until ``ready()`` gives a time; its clock then moves there. ``on``
        is what ``ready`` reads, which its changers ``poke``, or a list of such things (None:
        ``ready`` is asked at every switch). Returns the virtual time it waited (counted idle; a
        communication's wait moves its cost to comm)."""
        me = self.me()
        me.sent.clear()  # once a send is waited for, its tensor may be written: the next send copies it again
        if (t := ready()) is not None and t <= me.clock:
            return 0.0
        me.ready, me.waiting_for, me.waits_on = ready, what, on
        keys = on if isinstance(on, list) else [] if on is None else [on]
        for key in keys:
            self.waiters.setdefault(key, set()).add(me)
        self._switch(me)
        for key in keys:
            waiting = self.waiters[key]
            waiting.discard(me)
            if not waiting:  # keys may be one-off (a counter's value): keep the map small
                del self.waiters[key]
        before, me.clock = me.clock, max(me.clock, ready())
        me.ready, me.waiting_for, me.waits_on = None, "", None
        me.idle_s += me.clock - before
        return me.clock - before

    def poke(self, on: object) -> None:
        """``on`` changed: queue those waiting on it that can now go on, at their time."""
        for actor in list(self.waiters.get(on, ())):
            if actor is not self.current:
                self._queue(actor)

    # -- the threads ----------------------------------------------------------------------------
    def run(self, body: Callable[[int], object]) -> list[object]:
        """Run ``body(rank)`` for every rank, one at a time by virtual time; return their results."""
        results: list[object] = [None] * len(self.actors)
        state = torch.get_rng_state()
        for actor in list(self.actors):
            actor.rng = state.clone()
            self._start(actor, lambda a=actor: results.__setitem__(a.rank, body(a.rank)), f"rank{actor.rank}")
            self._queue(actor)
        self._hand_to(self._next())
        while True:  # the ranks' threads, and those they started
            running = [t for t in self.threads if t.is_alive()]
            if not running:
                break
            for t in running:
                t.join()
        torch.set_rng_state(state)
        if self.error is not None:
            raise self.error
        return results

    def spawn(self, target: Callable[[], None], name: str) -> Actor:
        """Start ``target`` as a thread of the calling rank, with a clock starting at the caller's."""
        parent = self.me()
        child = Actor(parent.rank, len(self.actors), parent.clock, rng=torch.get_rng_state())
        self.actors.append(child)
        world = _ThreadWorlds.local.data  # it uses its rank's process groups
        self._start(child, target, name, world)
        self._queue(child)
        return child

    def _start(self, actor: Actor, target: Callable[[], None], name: str, world: dict | None = None) -> None:
        def main() -> None:
            self.local.actor = actor
            if world is not None:
                _ThreadWorlds.local.data = world
            try:
                self._await_turn(actor)
                # Backward on this thread: the switch is per thread, and autograd otherwise runs a CUDA
                # model's backward, and DDP's comm hook with it, on its device thread, no rank's actor.
                with torch.autograd.set_multithreading_enabled(False):
                    target()
            except BaseException as error:  # noqa: BLE001 - handed to the caller, and stops every rank
                self._fail(error)
            finally:
                actor.done = True
                self.poke(actor)  # those joining it
                if self.error is None:
                    # Hand the machine on. A deadlock among the threads left is recorded by _switch,
                    # which wakes them to raise it; this thread, already done, has nothing to add.
                    with contextlib.suppress(Deadlock):
                        self._switch(actor)

        thread = threading.Thread(target=main, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError("another rank of the virtual cluster failed") from None

    def _when(self, actor: Actor) -> float | None:
        """When ``actor`` can go on: its clock, or when what it waits for completes (None: not yet)."""
        if actor.ready is None:
            return actor.clock
        r = actor.ready()
        return None if r is None else max(actor.clock, r)

    def _queue(self, actor: Actor) -> None:
        """(Re)enter ``actor`` in the queue at its time, or, until it has one, among the waiters."""
        actor.stamp += 1  # its earlier entry, if any, is stale
        if actor.done:
            return
        t = self._when(actor)
        if t is not None:
            heapq.heappush(self.queue, (t, actor.index, actor.stamp, actor))
        elif actor.waits_on is None:
            self.polled.add(actor)

    def _next(self) -> Actor | None:
        for actor in list(self.polled):  # waits on nothing named: asked at every switch
            if self._when(actor) is not None:
                self.polled.discard(actor)
                self._queue(actor)
        while self.queue:
            t, index, stamp, actor = self.queue[0]
            if stamp != actor.stamp or actor.done:
                heapq.heappop(self.queue)
                continue
            now = self._when(actor)
            if now is None:  # can no longer go on (say, a lock taken meanwhile): waits for a poke
                heapq.heappop(self.queue)
                if actor.waits_on is None:
                    self.polled.add(actor)
                continue
            if now != t:  # moved since it was queued: queue it at its time
                heapq.heapreplace(self.queue, (now, index, stamp, actor))
                continue
            heapq.heappop(self.queue)
            actor.stamp += 1
            return actor
        return None

    def _switch(self, me: Actor) -> None:
        """Hand the machine to the actor whose next event is earliest, and wait for our turn."""
        if not me.done:
            self._queue(me)
        nxt = self._next()
        if nxt is None and not all(a.done for a in self.actors):
            waits = "; ".join(
                f"rank {a.rank}{'' if a.index == a.rank else ' (a thread of it)'}: {a.waiting_for}"
                for a in self.actors
                if not a.done
            )
            error = Deadlock(f"every rank of the virtual cluster waits: {waits}")
            self._fail(error)
            raise error
        if nxt is me:
            return
        me.rng = torch.get_rng_state()
        self._hand_to(nxt)
        if not me.done:
            self._await_turn(me)

    def _hand_to(self, actor: Actor | None) -> None:
        """Wake ``actor`` alone (one event each: waking every thread at each switch costs O(threads))."""
        self.current = actor
        if actor is not None:
            actor.go.release()

    def _await_turn(self, me: Actor) -> None:
        me.go.acquire()
        self._check()
        torch.set_rng_state(me.rng)

    def _fail(self, error: BaseException) -> None:
        """Stop every thread: each wakes and raises; ``run`` raises ``error``."""
        if self.error is None:
            self.error = error
        for actor in self.actors:
            with contextlib.suppress(RuntimeError):  # its turn is already given
                actor.go.release()


# -- a rank's threads and their locks, on the virtual clock ------------------------------------------


class _Threads:
    """What ``algorithms.comm.threads()`` gives on the virtual cluster: ``threading``'s Thread, Lock,
    Event and Condition, whose waits are waits on the virtual clock. Only one thread runs at a time,
    so a wait that ``threading`` would spend blocked hands the machine to the next thread in time
    order; what it waits for (a release, a set, a notify) happens at the virtual time of its maker."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def Thread(self, target: Callable[[], None], name: str = "", daemon: bool = True) -> _Thread:  # noqa: N802
        return _Thread(self.scheduler, target, name)

    def Lock(self) -> _Lock:  # noqa: N802
        return _Lock(self.scheduler)

    def Event(self) -> _Event:  # noqa: N802
        return _Event(self.scheduler)

    def Condition(self) -> _Condition:  # noqa: N802
        return _Condition(self.scheduler)


class _Thread:
    def __init__(self, scheduler: Scheduler, target: Callable[[], None], name: str) -> None:
        self.scheduler, self.target, self.name, self.actor = scheduler, target, name, None

    def start(self) -> None:
        self.actor = self.scheduler.spawn(self.target, self.name)

    def join(self, timeout: float | None = None) -> None:  # noqa: ARG002 - a virtual wait has no timeout
        actor = self.actor
        self.scheduler.wait(lambda: actor.clock if actor.done else None, f"thread {self.name} to end", actor)

    def is_alive(self) -> bool:
        return self.actor is not None and not self.actor.done


class _Lock:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.owner, self.released_at = scheduler, None, 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:  # noqa: ARG002
        if self.owner is not None:
            self.scheduler.wait(lambda: self.released_at if self.owner is None else None, "a lock", self)
        self.owner = self.scheduler.me()
        return True

    def release(self) -> None:
        self.owner, self.released_at = None, self.scheduler.now()
        self.scheduler.poke(self)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class _Event:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.flag, self.set_at = scheduler, False, 0.0

    def set(self) -> None:
        if not self.flag:
            self.flag, self.set_at = True, self.scheduler.now()
            self.scheduler.poke(self)

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout: float | None = None) -> bool:  # noqa: ARG002
        if not self.flag:
            self.scheduler.wait(lambda: self.set_at if self.flag else None, "an event", self)
        return True


class _Condition:
    """``threading.Condition``: ``wait`` returns at the first notify after it began (callers loop on
    their predicate, as ``threading`` requires)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.lock = scheduler, _Lock(scheduler)
        self.notifications, self.notified_at = 0, 0.0

    def __enter__(self) -> bool:
        return self.lock.acquire()

    def __exit__(self, *exc) -> None:
        self.lock.release()

    def wait(self, timeout: float | None = None) -> bool:  # noqa: ARG002 - woken by a notify only
        seen = self.notifications
        self.lock.release()
        self.scheduler.wait(lambda: self.notified_at if self.notifications > seen else None, "a condition", self)
        self.lock.acquire()
        return True

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:  # noqa: ARG002
        while not predicate():
            self.wait()
        return True

    def notify_all(self) -> None:
        self.notifications += 1
        self.notified_at = self.scheduler.now()
        self.scheduler.poke(self)

    notify = notify_all  # a spurious wake-up is allowed


# -- the process groups -------------------------------------------------------------------------


@dataclass
class _Collective:
    """One collective call of a group: what each member brought, and when it completes."""

    size: int
    inputs: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    clocks: dict[int, float] = field(default_factory=dict)
    result: object = None
    done_at: float | None = None
    cost: float = 0.0
    after_compute: bool = False  # a member came to it from computing: it pays ``Network.sync_s``


@dataclass(eq=False)
class _Counters:
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


class Cluster:
    """What the ranks share: the scheduler, the network model, the groups' state, the mailboxes."""

    def __init__(self, world_size: int, procs_per_node: int, network: Network) -> None:
        self.world_size, self.procs_per_node, self.network = world_size, procs_per_node, network
        self.scheduler = Scheduler(world_size)
        self.collectives: dict[tuple[str, int], _Collective] = {}
        self.inboxes: dict[tuple[str, int, int], _Inbox] = {}  # (group, destination, tag) -> its messages
        self.messages = 0  # messages sent so far: each one's number
        # Messages are charged as if they were this many times larger: a paper's model on the wire
        # (``sim_model_mb``) while the embedded task's small model computes the numbers.
        self.byte_scale = 1.0
        self.updates = _Counters()  # LAP/LPP-SGD's Hogwild counters (``VirtualClock.wait_updates``)


@dataclass(eq=False)
class _Payload:
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
class _Message:
    tensors: list[_Payload]
    arrives: float  # virtual time
    cost: float  # the link's time for it
    number: int  # its place among every message sent


class _Inbox:
    """The messages in flight to one rank of a group with one tag: a queue per sender, delivered in
    the order sent, and a heap of the queues' heads, so that a receive from any rank finds the
    earliest arrival (ties: the lowest sender) without looking at every sender."""

    def __init__(self) -> None:
        self.queues: dict[int, deque[_Message]] = {}
        self.heads: list[tuple[float, int, int]] = []  # (arrival, sender, number), stale once delivered

    def post(self, sender: int, message: _Message) -> None:
        queue = self.queues.setdefault(sender, deque())
        queue.append(message)
        if len(queue) == 1:
            heapq.heappush(self.heads, (message.arrives, sender, message.number))

    def head(self, sender: int) -> _Message | None:
        queue = self.queues.get(sender)
        return queue[0] if queue else None

    def pop(self, sender: int) -> _Message:
        queue = self.queues[sender]
        message = queue.popleft()
        if queue:
            heapq.heappush(self.heads, (queue[0].arrives, sender, queue[0].number))
        return message

    def first(self) -> int | None:
        """The sender whose message at the head of its queue arrives first."""
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
    ):
        super().__init__()
        self.cluster, self.ready, self.finish, self.what, self.finished = cluster, ready, finish, what, False
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

    def getBackendName(self) -> str:  # noqa: N802 - ProcessGroup's name
        return BACKEND

    # -- collectives ----------------------------------------------------------------------------
    def _collective(
        self, tensors: list[torch.Tensor], cost: Callable[[int], float], combine: Callable[[_Collective], object], what
    ):
        """Bring ``tensors`` to this call of the collective; the last member to arrive computes the
        result (``combine``) and the completion time (the last arrival plus ``cost(bytes)``).

        The inputs are the callers' own tensors, not copies: as with any backend, a tensor in a
        collective is not written until its work is waited on, and no member's wait completes before
        the last arrival's ``combine`` has read every input. A ``combine`` whose result is an input
        (broadcast, all-gather) copies it, since a member that has waited may write its tensor
        before another reads the result. (A copy of every input was a third of an all-reduce's cost
        at 64 ranks.)"""
        key = (self.name, self.calls)
        self.calls += 1
        c = self.cluster.collectives.setdefault(key, _Collective(self.size()))
        me, actor = self.rank(), self.cluster.scheduler.me()
        c.inputs[me] = [t.detach() for t in tensors]
        c.clocks[me] = actor.clock
        c.after_compute |= actor.computed
        actor.computed = False
        if len(c.inputs) == c.size:
            c.result = combine(c)
            c.cost = cost(_nbytes(tensors) * self.cluster.byte_scale) + self.cluster.network.sync_s * c.after_compute
            c.done_at = max(c.clocks.values()) + c.cost
            self.cluster.scheduler.poke(key)
        return c, key

    def _work(self, c: _Collective, key, finish: Callable[[], None], what: str, tensors=None) -> VirtualWork:
        def done() -> None:
            finish()
            c.inputs.pop(self.rank(), None)
            if not c.inputs:  # every member has its result
                self.cluster.collectives.pop(key, None)

        return VirtualWork(
            self.cluster, lambda: c.done_at, done, f"{what} on group {self.ranks}", tensors, lambda: c.cost, key
        )

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        net, ppn = self.cluster.network, self.cluster.procs_per_node

        def combine(c: _Collective) -> list[torch.Tensor]:
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

        def cost(nbytes: float) -> float:
            return net.ring_allreduce(self.ranks, ppn, nbytes, elements)

        c, key = self._collective(tensors, cost, combine, "all_reduce")

        def finish() -> None:
            for t, r in zip(tensors, c.result):
                t.copy_(r)

        return self._work(c, key, finish, "all_reduce", tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        net, ppn = self.cluster.network, self.cluster.procs_per_node
        c, key = self._collective(
            tensors,
            lambda n: net.broadcast(self.ranks, ppn, n),
            lambda c: [t.clone() for t in c.inputs[root]],
            "broadcast",
        )

        def finish() -> None:
            for t, r in zip(tensors, c.result):
                t.copy_(r)

        return self._work(c, key, finish, "broadcast", tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        net, ppn = self.cluster.network, self.cluster.procs_per_node
        # An all-gather of n bytes a rank is the all-gather half of a ring all-reduce of p*n bytes.
        c, key = self._collective(
            input_tensors,
            lambda n: net.ring_allreduce(self.ranks, ppn, n * self.size()) / 2,
            lambda c: [[t.clone() for t in c.inputs[r]] for r in range(c.size)],
            "all_gather",
        )

        def finish() -> None:
            for i, outs in enumerate(output_tensors):
                for r, out in enumerate(outs):
                    out.copy_(c.result[r][i])

        return self._work(c, key, finish, "all_gather")

    def barrier(self, opts=None):
        c, key = self._collective([], lambda n: 0.0, lambda c: None, "barrier")
        return self._work(c, key, lambda: None, "barrier")

    # -- point to point -------------------------------------------------------------------------
    def _inbox(self, dst: int, tag: int) -> _Inbox:
        return self.cluster.inboxes.setdefault((self.name, dst, tag), _Inbox())

    def send(self, tensors, dst, tag):
        cluster, me, actor = self.cluster, self.ranks[self.rank()], self.cluster.scheduler.me()
        to = self.ranks[dst]
        cost = cluster.network.p2p(me, to, cluster.procs_per_node, _nbytes(tensors) * cluster.byte_scale)
        cost += cluster.network.sync_s * actor.computed
        actor.computed = False
        arrives = cluster.scheduler.now() + cost
        inbox = self._inbox(dst, tag)
        inbox.post(self.rank(), _Message([self._payload(actor, t) for t in tensors], arrives, cost, cluster.messages))
        cluster.messages += 1
        cluster.scheduler.poke(inbox)
        return VirtualWork(cluster, lambda: arrives, lambda: None, f"send to {to}", cost=lambda: cost)

    @staticmethod
    def _payload(actor: Actor, t: torch.Tensor) -> _Payload:
        """A copy of ``t`` for a message: the one a send of the same unchanged tensor took since
        the sender last waited or computed, else a new one. (A tensor in flight is not written until
        its send is waited for, as with any backend.)"""
        shared = actor.sent.get(id(t))
        if shared is not None and not shared.taken and shared.source is t and shared.version == t._version:
            shared.readers += 1
            return shared
        actor.sent[id(t)] = payload = _Payload(t, t._version, t.detach().clone())
        return payload

    def _deliver(self, inbox: _Inbox, sender: int, tensors: list[torch.Tensor]) -> None:
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


# -- one torch.distributed world per thread -----------------------------------------------------


class _ThreadWorlds(c10d._World):
    """``torch.distributed``'s global group state, one per thread (each thread is a rank)."""

    local = threading.local()

    def _data(self) -> dict:
        data = getattr(self.local, "data", None)
        if data is None:
            data = self.local.data = dict(
                default_pg=None,
                pg_map={},
                pg_names={},
                pg_group_ranks={},
                pg_backend_config={},
                group_count=0,
                tags_to_pg={},
                pg_to_tag={},
                pg_coalesce_state={},
                comms=[],
            )
        return data

    def __init__(self) -> None:
        """Nothing per process: ``_World.__init__`` would set the per-process attributes that the
        properties below replace with each thread's own."""


def _property(name: str, settable: bool = False) -> property:
    def get(self):
        return self._data()[name]

    def put(self, value):
        self._data()[name] = value

    return property(get, put if settable else None)


for _name in ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag"):
    setattr(_ThreadWorlds, _name, _property(_name))
for _name in ("pg_coalesce_state", "comms"):
    setattr(_ThreadWorlds, _name, _property(_name))
for _name in ("default_pg", "group_count"):
    setattr(_ThreadWorlds, _name, _property(_name, settable=True))

_active: Cluster | None = None


def _create_group(opts, _backend_options) -> VirtualGroup:
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return VirtualGroup(_active, opts.group_rank, ranks, opts.group_id)


dist.Backend.register_backend(BACKEND, _create_group, extended_api=True, devices=["cpu", "cuda"])


def run(world_size: int, procs_per_node: int, network: Network, body: Callable[[int, Cluster], object]) -> list:
    """Run ``body(rank, cluster)`` on every rank of a virtual cluster; return the ranks' results.

    ``body`` calls ``init_process_group(rank, cluster)`` first, as a real rank would.
    """
    global _active
    if _active is not None:
        raise RuntimeError("a virtual cluster is already running in this process")
    cluster = Cluster(world_size, procs_per_node, network)
    saved_world = c10d._world
    c10d._world = _ThreadWorlds()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # C++'s registry of groups by name, per thread
    _active = cluster
    real_threads = comm.use_threads(_Threads(cluster.scheduler))
    # The objects alive now (torch's modules and the caller's) stay out of the garbage collector's
    # full passes while the ranks run: they are most of the heap, and each full pass walked them all
    # (0.67 of 15.3 CPU-s of WAGMA at 16 x 4 for three epochs; 0.23 frozen). Unfrozen at the end,
    # so that whatever of them has become garbage meanwhile is collected as usual.
    gc.freeze()
    try:
        return cluster.scheduler.run(lambda rank: body(rank, cluster))
    finally:
        gc.unfreeze()
        comm.use_threads(real_threads)
        comm.set_message_scale(1.0)
        _active = None
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        c10d._world = saved_world


def init_process_group(rank: int, cluster: Cluster) -> None:
    """This thread's default group: the whole virtual cluster (what ``launcher.init_process_group``
    does for the runner's ranks; for code that runs on ``run()`` directly, as the tests)."""
    dist.init_process_group(BACKEND, rank=rank, world_size=cluster.world_size, store=dist.HashStore())


# -- the runner's ranks on the virtual cluster ---------------------------------------------------


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
        self.step_s = s["sim_step_ms"] / 1000.0
        self.step_source = s["sim_step_source"]
        self.times = (
            GammaTimes(s["straggler"], cfg.world_size, self.step_s, cfg.seed) if s["straggler"] in MACHINE_CV else None
        )
        # Machine noise: each batch's time varies by ``sim_step_cv`` around the mean (a gamma law, this
        # rank's own stream). A deterministic clock ties every rank to the nanosecond, which no machine
        # does, and a tie can change what a protocol does (every rank of a WAGMA round activates it).
        self.step_cv = s["sim_step_cv"]
        self.noise = np.random.default_rng([cfg.seed, rank, 0x5717]) if self.step_cv > 0 else None
        self.network, self.cluster = cluster.network, cluster
        self.actor = cluster.scheduler.actors[rank]  # the rank's main thread
        self.model_mb = s["sim_model_mb"]
        self.updater_speedup = s["sim_updater_speedup"]
        self._batch_s: float | None = None  # this batch's compute time, once drawn
        self._charged_s = 0.0  # the part of it charged so far

    def __call__(self) -> float:
        return self.scheduler.now()

    def compute(self, until: float | None = None) -> None:
        """Charge the batch's compute time: all of it that is left (the runner, after backward), or up
        to the fraction ``until`` of it (DDP's buckets during backward, ``overlap_backward``)."""
        if self._batch_s is None:
            self._batch_s = self._draw()
        target = self._batch_s * (1.0 if until is None else min(until, 1.0))
        self._compute(max(target - self._charged_s, 0.0))
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
        horovod = isinstance(module, HorovodModel)  # Horovod's messages: its type, its averaging
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
                clock.compute(FORWARD_SHARE + (1.0 - FORWARD_SHARE) * min(state["done"] / total, 1.0))
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
        """Charge one Hogwild update of a LAP/LPP-SGD updater thread (``hogwild.ThreadUpdaters``).

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
        busy loop, which would see nothing new before (``hogwild.ThreadUpdaters``)."""
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

    def _compute(self, seconds: float) -> None:
        """The calling thread computes for ``seconds``; its next communication pays ``sync_s``."""
        if seconds > 0:
            self.scheduler.me().computed = True
        self.scheduler.advance(seconds)

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
            },
            "sim_step_ms": self.step_s * 1000.0,
            "sim_step_source": self.step_source,
            "sim_step_cv": self.step_cv,
            "sim_model_mb": self.model_mb,
            "sim_updater_speedup": self.updater_speedup,
            "message_scale": self.cluster.byte_scale,
        }


def run_job(cfg, train: Callable) -> int:
    """Run ``train(cfg, launch, clock)`` (the runner's) on every rank of ``cfg``'s virtual cluster;
    return the job's exit code (the first failing rank's, else 0)."""
    network = cluster.network(cfg.settings["sim_network"], cfg.settings["sim_inter_speed"])

    def rank_main(rank: int, cluster: Cluster) -> int:
        launch = Launch(rank, cfg.world_size, "virtual", "", 0, None, local_rank=0, local_size=1)
        code = train(cfg, launch, VirtualClock(cluster, rank, cfg))
        if dist.is_initialized():
            dist.destroy_process_group()
        return code

    codes = run(cfg.world_size, cfg.procs_per_node, network, rank_main)
    return next((c for c in codes if c), 0)
