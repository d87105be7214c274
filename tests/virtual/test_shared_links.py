"""Links that are shared on the virtual cluster, worked by hand: transfers that cross one link at once
share its bandwidth, a node's ranks share its adapters (rails), a group's collectives queue on its
stream, and a ring alone still costs what Thakur, Rabenseifner and Gropp give."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from algorithms import comm
from benchmarks.virtual import flows, job
from benchmarks.virtual.network import PRESETS, Link, Network

# No latency: every time below is bytes over a bandwidth.
NET = Network("test", intra=Link(0.0, 1e9), inter=Link(0.0, 1e8))
MB = 250_000  # floats in a megabyte


def _send_at_once(peers: dict[int, list[int]], net: Network, procs_per_node: int, world: int) -> list:
    """Each rank of ``peers`` sends 1 MB to each of its peers at time 0; every rank returns when
    each of its sends ended, in the order of ``peers``."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        works = [dist.isend(torch.ones(MB), dst=peer) for peer in peers.get(rank, [])]
        receives = [dist.irecv(torch.empty(MB), src=src) for src, dsts in peers.items() if rank in dsts]
        ended = []
        for work in works:
            work.wait()
            ended.append(round(cl.scheduler.now(), 9))
        for work in receives:
            work.wait()
        return ended

    return job.run(world, procs_per_node, net, body)


def test_two_transfers_over_one_link_take_twice_one_transfer():
    """1 MB at 100 MB/s takes 10 ms; rank 0 sending it to two other nodes at once takes 20 ms for
    both, its adapter shared by the two (D-PSGD's two neighbours on one Piz Daint node)."""
    alone = _send_at_once({0: [1]}, NET, 1, 3)[0]
    both = _send_at_once({0: [1, 2]}, NET, 1, 3)[0]
    assert alone == [pytest.approx(0.01)]
    assert both == [pytest.approx(0.02), pytest.approx(0.02)]


def test_a_nodes_ranks_share_its_rails():
    """Ranks 0 and 1 (node 0) each send 1 MB to a rank of node 1 at once: through one adapter they
    share it (20 ms each), through two (one a rank) neither waits for the other (10 ms)."""
    one_rail = _send_at_once({0: [2], 1: [3]}, NET, 2, 4)
    two_rails = _send_at_once({0: [2], 1: [3]}, Network("two", NET.intra, NET.inter, rails=2), 2, 4)
    assert one_rail[:2] == [[pytest.approx(0.02)], [pytest.approx(0.02)]]
    assert two_rails[:2] == [[pytest.approx(0.01)], [pytest.approx(0.01)]]


def test_a_groups_collectives_queue_on_its_stream():
    """Two all-reduces of 1 MB started at once on one group (DDP's buckets) run one after the other,
    as on one NCCL stream: the first ends at one all-reduce's time, the second at twice it. Two
    groups' all-reduces over different links do not wait for each other."""
    one = NET.ring_allreduce([0, 1], 1, 1e6)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        works = [dist.all_reduce(torch.ones(MB), async_op=True) for _ in range(2)]
        ended = []
        for work in works:
            work.wait()
            ended.append(cl.scheduler.now())
        return ended

    assert job.run(2, 1, NET, body)[0] == [pytest.approx(one), pytest.approx(2 * one)]


def test_a_collective_posted_ahead_starts_at_its_own_time():
    """DDP's buckets are posted by ranks that run ahead (no switch at each bucket): each rank posts
    an all-reduce at 1 s and another at 3 s, rank 0 both before rank 1 runs at all. The first ends
    at 1 s + one all-reduce; the second, queued on the stream while the first was in flight, starts
    at 3 s (not when the first ended) and ends at 3 s + one all-reduce."""
    one = NET.ring_allreduce([0, 1], 1, 1e6)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        works = []
        for t in (1.0, 3.0):
            cl.scheduler.advance(t - cl.scheduler.now(), hand_on=False)
            works.append(dist.all_reduce(torch.ones(MB), async_op=True))
        for work in works:
            work.wait()
        return [work.ready() for work in works]  # when each ended (the rank's clock was at 3 s by then)

    assert job.run(2, 1, NET, body) == [[pytest.approx(1 + one), pytest.approx(3 + one)]] * 2


def test_a_ring_across_nodes_alone_costs_what_thakur_gives():
    """An all-reduce of n bytes over p ranks, alone: 2(p-1)/p n over the slowest link, plus 2(p-1)
    latencies (Thakur et al. 2005). One rank a node: the adapter's bandwidth. Four ranks a node and
    four rails: four rings (NCCL's channels), each crossing on an adapter of its own, so the node's
    four adapters' bandwidth; one rail: one adapter's."""
    lat = Network("lat", Link(2e-6, 1e9), Link(5e-6, 1e8))
    four_rails = Network("rails", lat.intra, lat.inter, rails=4)
    n = 4e6

    def time_of(net, world, ppn):
        def body(rank, cl):
            job.init_process_group(rank, cl)
            dist.all_reduce(torch.ones(1_000_000))
            return cl.scheduler.now()

        return job.run(world, ppn, net, body)[0]

    thakur = 2 * 3 * lat.inter.latency_s + comm.ring_allreduce_bytes(n, 4) / lat.inter.bandwidth_bps
    assert time_of(lat, 4, 1) == pytest.approx(thakur)
    assert time_of(lat, 8, 4) == pytest.approx(2 * 7 * 5e-6 + comm.ring_allreduce_bytes(n, 8) / 1e8)
    assert time_of(four_rails, 8, 4) == pytest.approx(2 * 7 * 5e-6 + comm.ring_allreduce_bytes(n, 8) / 4e8)


def test_on_piz_daint_two_neighbours_cost_twice_one():
    """D-PSGD sends its model to two neighbours, SGP to one peer: on Piz Daint (one GPU and one
    10 GB/s adapter a node) the two sends share the adapter, so D-PSGD's communication is twice SGP's."""
    daint = PRESETS["piz_daint"]
    ring = {r: [(r - 1) % 4, (r + 1) % 4] for r in range(4)}
    one_peer = {r: [(r + 1) % 4] for r in range(4)}
    two = _send_at_once(ring, daint, 1, 4)[0][-1]
    one = _send_at_once(one_peer, daint, 1, 4)[0][-1]
    assert two / one == pytest.approx(2.0, rel=0.02)  # (each message's 1.3 us latency is not shared)


def test_max_min_rates_by_hand():
    """Three flows on a 10-unit link, one of them also on a 2-unit link: it gets 2, the other two
    share the 8 left (4 each). A bundle of two transfers on one link counts twice there."""
    cap = {"a": 10.0, "b": 2.0}.__getitem__
    f1, f2, f3 = (flows.Flow(1.0, links, 0.0) for links in ({"a": 1, "b": 1}, {"a": 1}, {"a": 1}))
    flows.max_min_rates([f1, f2, f3], cap)
    assert (f1.rate, f2.rate, f3.rate) == (pytest.approx(2.0), pytest.approx(4.0), pytest.approx(4.0))
    bundle, single = flows.Flow(1.0, {"a": 2}, 0.0), flows.Flow(1.0, {"a": 1}, 0.0)
    flows.max_min_rates([bundle, single], cap)
    assert (bundle.rate, single.rate) == (pytest.approx(10 / 3), pytest.approx(10 / 3))


def test_a_group_carried_by_mpi_goes_at_mpis_pace_and_a_hidden_sync_costs_its_share():
    """DASO's global group is carried by MPI (``comm.carried_by_mpi``): its all-reduce of 1 MB over
    2 nodes moves at the MPI rate, 10 MB/s, not the adapters' 100 MB/s: 2 x 1/2 MB at 10 MB/s = 0.1 s.
    Started without blocking and hidden behind 1 s of compute, it still costs the compute 0.25 of
    its 0.1 s at the wait (``mpi_overlap``)."""
    net = Network("mpi", NET.intra, NET.inter, mpi=Link(0.0, 1e7), mpi_overlap=0.25)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        group = dist.new_group([0, 1])
        comm.carried_by_mpi(group)
        dist.all_reduce(torch.ones(MB), group=group)
        blocking = cl.scheduler.now()
        work = dist.all_reduce(torch.ones(MB), group=group, async_op=True)
        cl.scheduler.advance(1.0)
        work.wait()
        return blocking, cl.scheduler.now() - blocking

    assert job.run(2, 1, net, body)[0] == (pytest.approx(0.1), pytest.approx(1.0 + 0.25 * 0.1))


def test_with_mpi_for_all_every_group_across_nodes_goes_at_mpis_pace_and_a_node_local_one_does_not():
    """``mpi_for_all`` (DASO's claims with every method on Heat's transport, ``tools.daso_sweep``):
    the default group of 2 nodes x 2 processes, unmarked, all-reduces 1 MB at the MPI rate: a ring
    of 4 over 2 nodes moves 2 x 3/4 MB = 1.5 MB through its slowest transfer at 10 MB/s, 0.15 s
    (the adapters' 100 MB/s would give 0.015 s); a group inside one node keeps the node's link:
    2 x 1/2 MB at 1 GB/s, 1 ms."""
    net = Network("mpi", NET.intra, NET.inter, mpi=Link(0.0, 1e7), mpi_for_all=True)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        local = dist.new_group([0, 1])
        t0 = cl.scheduler.now()
        dist.all_reduce(torch.ones(MB))
        t1 = cl.scheduler.now()
        if rank in (0, 1):
            dist.all_reduce(torch.ones(MB), group=local)
        return t1 - t0, cl.scheduler.now() - t1

    across, inside = job.run(4, 2, net, body)[0]
    assert across == pytest.approx(0.15)
    assert inside == pytest.approx(0.001)
