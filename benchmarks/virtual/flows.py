"""Transfers that share links: max-min fair rates, advanced event by event in virtual time.

A transfer is a *flow*: some bytes over a set of links. Flows that cross one link at once share its
bandwidth max-min fairly (Bertsekas and Gallager, "Data Networks", 1992, Sec. 6.5.2: no flow can get
more without taking from one that has less), the sharing of SimGrid's flow-level network model
(Velho, Schnorr, Casanova and Legrand, "On the validity of flow-level TCP network models for grid and
cloud simulations", ACM TOMACS 23(4), 2013), without its correction factors. The rates are found by
progressive filling: every unfrozen flow's rate rises alike until a link is full, whose flows then
freeze at that rate.

A flow may stand for several transfers that move in lockstep, as the p neighbour transfers of a
ring all-reduce do: ``links`` maps a link to how many of them cross it, and ``nbytes`` is what each
of them carries. Such a bundle moves at one rate, that of its most contended link, as a ring's step
ends when its slowest transfer does.

A flow starts moving bytes ``latency`` after it is added, and is done when its bytes are through.
``Fabric`` keeps the flows in flight and the time up to which they have moved; the scheduler asks
it for its next event (a start or an end) and lets it reach that time before any rank runs past it,
so every rate holds exactly over the interval it is used for.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

# A flow with less than this share of its bytes left is done (what floating-point progress leaves).
_DONE = 1e-9


@dataclass(eq=False)
class Flow:
    """``nbytes`` over ``links`` (link -> how many of the bundle's transfers cross it)."""

    nbytes: float
    links: dict[Hashable, int]
    start: float  # when its bytes start moving (added + latency)
    remaining: float = field(init=False)
    rate: float = 0.0  # bytes per second of each of its transfers, while active
    done_at: float | None = None
    on_done: list[Callable[[Flow], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.remaining = self.nbytes


def max_min_rates(flows: list[Flow], capacity: Callable[[Hashable], float]) -> None:
    """Set each flow's ``rate`` to its max-min fair share of the links it crosses (progressive filling,
    weighted by how many of its transfers cross each link). A flow that crosses no link of finite
    capacity gets an infinite rate."""
    used: dict[Hashable, float] = {}
    weight: dict[Hashable, int] = {}  # the unfrozen transfers crossing each link
    for f in flows:
        for link, members in f.links.items():
            weight[link] = weight.get(link, 0) + members
            used.setdefault(link, 0.0)
    unfrozen = set(flows)
    while unfrozen:
        shares = {link: (capacity(link) - used[link]) / w for link, w in weight.items() if w > 0}
        if not shares:  # the rest cross no shared link
            for f in unfrozen:
                f.rate = float("inf")
            return
        level = max(min(shares.values()), 0.0)
        full = {link for link, share in shares.items() if share <= level * (1 + 1e-12)}
        for f in [f for f in unfrozen if not full.isdisjoint(f.links)]:
            f.rate = level
            unfrozen.discard(f)
            for link, members in f.links.items():
                used[link] += members * level
                weight[link] -= members


class Fabric:
    """The flows in flight on a network whose links have ``capacity(link)`` bytes per second."""

    def __init__(self, capacity: Callable[[Hashable], float]) -> None:
        self.capacity = capacity
        self.now = 0.0
        self.active: list[Flow] = []
        self.waiting: list[tuple[float, int, Flow]] = []  # (start, number, flow): latency not yet over
        self.added = 0
        self._next: float | None = None  # the next event's time, while no flow changes

    def add(self, now: float, nbytes: float, links: dict[Hashable, int], latency: float = 0.0) -> Flow:
        """A flow added at ``now`` (no earlier than any event not yet reached)."""
        self.reach(now)
        flow = Flow(nbytes, {link: m for link, m in links.items() if m > 0}, now + latency)
        if nbytes <= 0 or not flow.links:
            flow.remaining, flow.rate = 0.0, float("inf")
        heapq.heappush(self.waiting, (flow.start, self.added, flow))
        self.added += 1
        self._next = None
        return flow

    def next_event(self) -> float | None:
        """When the next flow starts or ends, if no flow is added before then (None: none in flight)."""
        if self._next is None:
            times = [self.waiting[0][0]] if self.waiting else []
            times += [self.now + f.remaining / f.rate for f in self.active if f.rate > 0]
            self._next = min(times, default=float("inf"))
        return None if self._next == float("inf") else self._next

    def reach(self, t: float) -> list[Flow]:
        """Move every flow to time ``t``, event by event; return the flows that ended, in order."""
        ended: list[Flow] = []
        while (event := self.next_event()) is not None and event <= t:
            ended += self._step(event)
        self._move(t)
        return ended

    def _move(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self.active:
                f.remaining -= f.rate * dt if f.rate != float("inf") else f.remaining
            self.now = t

    def _step(self, t: float) -> list[Flow]:
        """Reach the event at ``t``: end the flows whose bytes are through, start those whose latency
        is over, and share the links anew."""
        self._move(t)
        # done: its bytes are through, up to rounding (at a large t, the time its last few take can
        # be below t's resolution, and moving to it would not move it)
        ended = [f for f in self.active if f.remaining <= _DONE * f.nbytes or t + f.remaining / f.rate <= t]
        while self.waiting and self.waiting[0][0] <= t:
            f = heapq.heappop(self.waiting)[2]
            (ended if f.remaining <= 0 else self.active).append(f)
        for f in ended:
            f.done_at, f.remaining = t, 0.0
        if ended:
            done = set(ended)
            self.active = [f for f in self.active if f not in done]
        max_min_rates(self.active, self.capacity)
        self._next = None
        return ended
