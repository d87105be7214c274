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

import numpy as np

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
    # its links as numbers of a ``Links`` index, and how many of its transfers cross each
    ids: np.ndarray = field(init=False, repr=False)
    members: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.remaining = self.nbytes


class Links:
    """A number for every link seen, and its capacity: the solver works on arrays."""

    def __init__(self, capacity: Callable[[Hashable], float]) -> None:
        self.capacity, self.number, self.capacities = capacity, {}, []

    def index(self, flow: Flow) -> None:
        ids = []
        for link in flow.links:
            if (i := self.number.get(link)) is None:
                i = self.number[link] = len(self.capacities)
                self.capacities.append(self.capacity(link))
            ids.append(i)
        flow.ids, flow.members = np.array(ids, dtype=np.intp), np.array(list(flow.links.values()), dtype=float)


def max_min_rates(flows: list[Flow], capacity: Callable[[Hashable], float]) -> None:
    """Set each flow's ``rate`` to its max-min fair share of the links it crosses (progressive filling,
    weighted by how many of its transfers cross each link). A flow that crosses no link gets an
    infinite rate."""
    links = Links(capacity)
    for f in flows:
        links.index(f)
    _fill(flows, np.array(links.capacities, dtype=float))


def _fill(flows: list[Flow], capacities: np.ndarray) -> None:
    """Progressive filling over the flows' (indexed) links, vectorised over the (flow, link) pairs:
    at 256 ranks, D-PSGD has 512 transfers in flight, and the rates are found again at every start
    and end."""
    if not flows:
        return
    rate = np.full(len(flows), np.inf)
    link_of = np.concatenate([f.ids for f in flows])
    if len(link_of):
        members = np.concatenate([f.members for f in flows])
        flow_of = np.repeat(np.arange(len(flows)), [len(f.ids) for f in flows])
        free = capacities.copy()  # what the frozen flows leave of each link
        crossing = np.ones(len(link_of), dtype=bool)  # the pairs of unfrozen flows
        while crossing.any():
            weight = np.bincount(link_of[crossing], members[crossing], minlength=len(free))
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(weight > 0, free / weight, np.inf)
            level = max(float(share.min()), 0.0)
            full = share <= level * (1 + 1e-12)
            hit = np.zeros(len(flows), dtype=bool)
            hit[flow_of[crossing & full[link_of]]] = True
            rate[hit] = level
            now_frozen = crossing & hit[flow_of]
            free -= np.bincount(link_of[now_frozen], members[now_frozen] * level, minlength=len(free))
            crossing &= ~now_frozen
    for f, r in zip(flows, rate.tolist()):
        f.rate = r


class Fabric:
    """The flows in flight on a network whose links have ``capacity(link)`` bytes per second."""

    def __init__(self, capacity: Callable[[Hashable], float]) -> None:
        self.links = Links(capacity)
        self.now = 0.0
        self.active: list[Flow] = []
        self.waiting: list[tuple[float, int, Flow]] = []  # (start, number, flow): latency not yet over
        self.added = 0
        self._next: float | None = None  # the next event's time, while no flow changes

    def add(self, now: float, nbytes: float, links: dict[Hashable, int], latency: float = 0.0) -> Flow:
        """A flow added at ``now``: no earlier than the time the fabric has reached, and possibly
        later (a rank that runs ahead posts its collectives at their own times): until its start it
        waits among the events, and the flows in flight move on as if it were not there."""
        if now < self.now:
            raise ValueError(f"a flow added at {now} s, before the time the network has reached ({self.now} s)")
        flow = Flow(nbytes, {link: m for link, m in links.items() if m > 0}, now + latency)
        self.links.index(flow)
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
        _fill(self.active, np.array(self.links.capacities, dtype=float))
        self._next = None
        return ended
