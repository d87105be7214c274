"""The virtual cluster's scheduler: one actor (a rank, or a thread a rank started) runs at a time,
the one whose next event is earliest in virtual time.

This is a conservative discrete-event simulation: a rank runs until it must wait for another (a
collective, a receive, a non-blocking operation's ``wait``), then the actor with the smallest clock
among those that can go on runs next. A message is therefore delivered in the order of virtual
time, whatever the order of the threads on the machine, and a run is deterministic. Running actors
one at a time also gives each the machine's cores for its own compute, and lets the switch swap
the random-number state, so that every rank draws from its own generator as a process would.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from benchmarks.virtual.group import Payload


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
    sent: dict[int, Payload] = field(default_factory=dict)
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

    # What a rank's thread carries over to the threads it starts (its ``torch.distributed`` state):
    # the job sets these (``job.run``); a rank's main thread starts with none.
    thread_context: Callable[[], object] = staticmethod(lambda: None)
    enter_context: Callable[[object], None] = staticmethod(lambda context: None)
    # The network's next event (a transfer starting or ending; None: none in flight), and reaching
    # it: it comes before any actor whose time is the same or later (``job.Cluster``).
    network_event: Callable[[], float | None] = staticmethod(lambda: None)
    network_reach: Callable[[float], None] = staticmethod(lambda t: None)

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

    def advance(self, seconds: float, hand_on: bool = True) -> None:
        """The calling rank computes for ``seconds`` of virtual time; others may run meanwhile.

        With ``hand_on=False`` it runs on ahead of the others instead, keeping the machine. That is
        right only where all it does before its next switch is to post collectives, which start at
        the time each was posted whatever the order the threads post them in (``Cluster.on_stream``,
        ``Fabric.add``): DDP's buckets during backward (``VirtualClock.overlap_backward``). A switch
        at each of the 170 buckets of a 100 MB model was most of a simulated DDP step's cost."""
        me = self.me()
        me.clock += seconds
        me.compute_s += seconds
        me.sent.clear()
        if hand_on:
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
            if actor is not self.current or actor.ready is not None:  # (the current one, as it hands on)
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
        self._start(child, target, name, self.thread_context())  # it uses its rank's process groups
        self._queue(child)
        return child

    def _start(self, actor: Actor, target: Callable[[], None], name: str, context: object = None) -> None:
        def main() -> None:
            self.local.actor = actor
            if context is not None:
                self.enter_context(context)
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
        while True:
            for actor in list(self.polled):  # waits on nothing named: asked at every switch
                if self._when(actor) is not None:
                    self.polled.discard(actor)
                    self._queue(actor)
            event = self.network_event()
            if event is not None and (not self.queue or event <= self.queue[0][0]):
                self.network_reach(event)  # may poke waiters, and queue them
                continue
            if not self.queue:
                return None
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
