"""A job on the virtual cluster: what its ranks share, and running them."""

from __future__ import annotations

import gc
import sys
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from algorithms import comm
from benchmarks.virtual import group
from benchmarks.virtual import network as networks
from benchmarks.virtual.clock import Counters, VirtualClock
from benchmarks.virtual.flows import Fabric
from benchmarks.virtual.group import BACKEND, Collective, Inbox
from benchmarks.virtual.network import Network, Transfer
from benchmarks.virtual.scheduler import Scheduler
from benchmarks.virtual.threads import Threads, ThreadWorlds


class Cluster:
    """What the ranks share: the scheduler, the network model, the groups' state, the mailboxes."""

    def __init__(self, world_size: int, procs_per_node: int, network: Network) -> None:
        self.world_size, self.procs_per_node, self.network = world_size, procs_per_node, network
        self.scheduler = Scheduler(world_size)
        # a rank's threads use its process groups: they take over its torch.distributed state
        self.scheduler.thread_context = lambda: ThreadWorlds.local.data
        self.scheduler.enter_context = lambda world: setattr(ThreadWorlds.local, "data", world)
        self.collectives: dict[tuple[str, int], Collective] = {}
        self.inboxes: dict[tuple[str, int, int], Inbox] = {}  # (group, destination, tag) -> its messages
        self.messages = 0  # messages sent so far: each one's number
        # Messages are charged as if they were this many times larger: a paper's model on the wire
        # (``sim_model_mb``) while the embedded task's small model computes the numbers.
        self.byte_scale = 1.0
        self.updates = Counters()  # LAP/LPP-SGD's Hogwild counters (``VirtualClock.wait_updates``)
        # The transfers in flight, sharing the links; the scheduler lets the network reach each of
        # its events before any rank runs past it.
        self.fabric = Fabric(network.capacity)
        self.scheduler.network_event = self.fabric.next_event
        self.scheduler.network_reach = self._reach
        self.streams: dict[str, deque] = {}  # a group's collectives waiting for its stream, in order
        self.shared: dict[object, object] = {}  # what the ranks share (``VirtualClock.shared``)

    def _reach(self, t: float) -> None:
        for flow in self.fabric.reach(t):
            for done in flow.on_done:
                done(flow)

    def on_stream(self, group: str, t: float, transfer: Transfer, extra: float, done: Callable) -> None:
        """Put ``transfer`` (a collective of ``group`` whose last member came at ``t``, with ``extra``
        latency) on the group's stream: it starts once the group's earlier collectives are done, and
        ``done(flow)`` is called when the network has carried it."""
        queue = self.streams.setdefault(group, deque())
        queue.append((t, transfer, extra, done))
        if len(queue) == 1:
            self._start(group, t)

    def _start(self, group: str, free: float) -> None:
        """Start the stream's first collective once the stream is ``free`` and its last member has
        come (later, where that member ran ahead: ``Scheduler.advance``)."""
        t, transfer, extra, done = self.streams[group][0]
        flow = self.fabric.add(max(t, free), transfer.nbytes, transfer.links, transfer.latency + extra)

        def next_on_stream(flow) -> None:
            queue = self.streams[group]
            queue.popleft()
            done(flow)
            if queue:
                self._start(group, flow.done_at)

        flow.on_done.append(next_on_stream)


def run(world_size: int, procs_per_node: int, network: Network, body: Callable[[int, Cluster], object]) -> list:
    """Run ``body(rank, cluster)`` on every rank of a virtual cluster; return the ranks' results.

    ``body`` calls ``init_process_group(rank, cluster)`` first, as a real rank would.
    """
    if group.active() is not None:
        raise RuntimeError("a virtual cluster is already running in this process")
    cluster = Cluster(world_size, procs_per_node, network)
    saved_world = c10d._world
    c10d._world = ThreadWorlds()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # C++'s registry of groups by name, per thread
    group.activate(cluster)
    real_threads = comm.use_threads(Threads(cluster.scheduler))
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
        group.activate(None)
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        c10d._world = saved_world


def init_process_group(rank: int, cluster: Cluster) -> None:
    """This thread's default group: the whole virtual cluster (what ``launcher.init_process_group``
    does for the runner's ranks; for code that runs on ``run()`` directly, as the tests)."""
    dist.init_process_group(BACKEND, rank=rank, world_size=cluster.world_size, store=dist.HashStore())


def run_job(cfg, train: Callable, launch_of: Callable) -> int:
    """Run ``train(cfg, launch_of(rank, world_size), clock)`` (the runner's) on every rank of ``cfg``'s
    virtual cluster; return the job's exit code (the first failing rank's, else 0). The runner says
    what a rank's launch is: the engine knows no launcher."""
    network = networks.load(cfg.settings.sim_network, cfg.settings.sim_inter_speed)
    if note := network.spans_cells(cfg.world_size // cfg.procs_per_node):
        print(f"virtual cluster: {note}", file=sys.stderr, flush=True)

    def rank_main(rank: int, cluster: Cluster) -> int:
        code = train(cfg, launch_of(rank, cfg.world_size), VirtualClock(cluster, rank, cfg))
        if dist.is_initialized():
            dist.destroy_process_group()
        return code

    codes = run(cfg.world_size, cfg.procs_per_node, network, rank_main)
    return next((c for c in codes if c), 0)
