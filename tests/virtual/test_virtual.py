"""The virtual cluster: exact tensors between thread-ranks, time from the network model, worked by hand,
and the runner's loop on it giving the real job's trajectory."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import algorithms
from algorithms import comm
from algorithms.horovod import Horovod
from algorithms.topology import Topology
from benchmarks.virtual import job, network
from benchmarks.virtual.scheduler import Deadlock

NET = network.Network(
    "test",
    intra=network.Link(latency_s=1e-6, bandwidth_bps=1e9),
    inter=network.Link(latency_s=1e-5, bandwidth_bps=1e8),
)


# -- the network model, by hand ------------------------------------------------------------------


def test_link_costs_by_hand():
    # 4 ranks, 2 per node: the ring crosses nodes, so it runs at the inter-node link's pace.
    n = 4000.0
    assert NET.ring_allreduce([0, 1, 2, 3], 2, n) == pytest.approx(2 * 3 * (1e-5 + 1000 / 1e8))
    assert NET.ring_allreduce([0, 1], 2, n) == pytest.approx(2 * 1 * (1e-6 + 2000 / 1e9))  # one node
    assert NET.p2p(0, 1, 2, n) == pytest.approx(1e-6 + 4000 / 1e9)
    assert NET.p2p(1, 2, 2, n) == pytest.approx(1e-5 + 4000 / 1e8)
    assert NET.broadcast([0, 1, 2, 3, 4], 2, n) == pytest.approx(3 * (1e-5 + 4000 / 1e8))
    assert NET.ring_allreduce([3], 2, n) == 0.0


def test_a_ring_that_skips_empty_segments_pays_the_latencies_of_its_elements_only():
    """gloo's ring cuts a buffer into 2p = 8 segments for 4 ranks: an all-reduce of 3 numbers waits 3
    of the 8 segments' latencies (6 steps x 1e-5 x 3/8), 8 numbers or more all of them; the NCCL
    presets charge every ring in full whatever its elements."""
    gloo = dataclasses.replace(NET, skips_empty_segments=True)
    ranks, n = [0, 1, 2, 3], 12.0
    bandwidth = 2 * 3 / 4 * n / 1e8
    assert gloo.ring_allreduce(ranks, 2, n, elements=3) == pytest.approx(6 * 1e-5 * 3 / 8 + bandwidth)
    assert gloo.ring_allreduce(ranks, 2, 32.0, elements=8) == NET.ring_allreduce(ranks, 2, 32.0)
    assert NET.ring_allreduce(ranks, 2, n, elements=3) == pytest.approx(6 * 1e-5 + bandwidth)


def test_the_virtual_all_reduce_charges_a_skipping_ring_by_its_tensors_elements():
    """4 ranks on 2 nodes all-reduce 3 floats, then 64: on a network that skips empty segments the
    first waits 3/8 of the ring's 6 latencies (the bandwidth term is the same either way), the
    second all of them, as the by-hand rule above gives."""
    gloo = dataclasses.replace(NET, skips_empty_segments=True)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        dist.all_reduce(torch.ones(3))
        tiny = cl.scheduler.now()
        dist.all_reduce(torch.ones(64))
        return tiny, cl.scheduler.now() - tiny

    tiny, full = job.run(4, 2, gloo, body)[0]
    assert tiny == pytest.approx(gloo.ring_allreduce(range(4), 2, 12, elements=3))
    assert tiny == pytest.approx(6 * 1e-5 * 3 / 8 + 2 * 3 / 4 * 12 / 1e8)
    assert full == pytest.approx(NET.ring_allreduce(range(4), 2, 256))


def test_presets_name_their_sources():
    for net in network.PRESETS.values():
        assert net.sources and net.intra.bandwidth_bps >= net.inter.bandwidth_bps
    booster = network.PRESETS["juwels_booster"]
    assert booster.inter.bandwidth_bps == 25e9 and booster.intra.bandwidth_bps == 300e9


def test_a_job_larger_than_a_cell_of_the_fabric_is_told_what_is_not_modelled(tmp_path):
    """Inside a cell (a dragonfly group, a DragonFly+ cell) only the adapters are shared; a job on more
    nodes than a cell is told that the links between cells are not modelled, and a network file keeps
    its cell size."""
    daint, booster = network.PRESETS["piz_daint"], network.PRESETS["juwels_booster"]
    assert daint.spans_cells(256) is None and booster.spans_cells(32) is None  # the papers' jobs fit
    assert "384" in daint.spans_cells(512) and "not modelled" in booster.spans_cells(64)
    assert network.Network("flat", NET.intra, NET.inter).spans_cells(10_000) is None
    network.save(daint, tmp_path / "daint.json")
    assert network.load(str(tmp_path / "daint.json")).cell_nodes == 384


def test_the_daso_network_reproduces_its_papers_table_2():
    """juwels_booster_heat's MPI rate is fitted to DASO's Table 2: the time a blocking
    global sync adds per batch (B=1 against B=32 at S=0), at 256 images per GPU per batch, is a
    ring all-reduce of ResNet-50's fp32 parameters in DASO's chunks of 10 M across the nodes, one
    after another on the group's stream, then a broadcast inside the node, at both GPU counts."""
    heat, params, images = network.PRESETS["juwels_booster_heat"], 25_557_032, 1_281_167
    net = network.Network("mpi", heat.intra, heat.mpi)  # the global syncs go at MPI's pace
    chunks = [10_000_000, 10_000_000, params - 20_000_000]
    for gpus, hours_b1, hours_b32 in ((32, 4.5606, 3.2224), (128, 1.2064, 0.8231)):
        steps = 90 * images / (gpus * 256)
        per_sync = (hours_b1 - hours_b32) * 3600 / ((1 - 1 / 32) * steps)
        nodes = range(0, gpus, 4)  # one GPU of each node
        model = sum(net.ring_allreduce(nodes, 4, 4 * c) for c in chunks) + net.broadcast(range(4), 4, 4 * params)
        assert model == pytest.approx(per_sync, rel=0.03), gpus
    # A hidden non-blocking sync's cost to the compute: B=1 S=1 at 32 GPUs against B=1 S=0 and the
    # compute alone (B=32 S=0 less its 1/31 of B=1's extra time).
    alone = 3.2224 - (4.5606 - 3.2224) / 31
    assert heat.mpi_overlap == pytest.approx((4.2545 - alone) / (4.5606 - alone), abs=0.005)


# -- the scheduler and the groups, on threads ----------------------------------------------------


def test_all_reduce_is_exact_and_ends_at_the_last_arrival_plus_the_ring():
    def body(rank, cl):
        job.init_process_group(rank, cl)
        cl.scheduler.advance(0.001 * (rank + 1))  # rank 3 arrives last, at 4 ms
        t = torch.full((1000,), float(rank + 1))
        dist.all_reduce(t)
        return t[0].item(), cl.scheduler.now()

    results = job.run(4, 2, NET, body)
    ring = NET.ring_allreduce([0, 1, 2, 3], 2, 4000)
    for total, clock in results:
        assert total == 10.0 and clock == pytest.approx(0.004 + ring)


@pytest.mark.parametrize("segments", [1, 3])
def test_a_delay_crosses_the_ring_within_a_step_when_the_model_goes_in_rounds(segments):
    """D-PSGD on a ring of 6, rank 0 delayed 1 s before its exchange. One message: rank 3, three hops
    away, waits for nobody that waited; 3 rounds, each waited for: the delay reaches rank 3 by the
    third round (rank 1 in round 1, rank 2 in round 2), so it ends after 1 s; the values equal."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        algo = algorithms.build("dpsgd", Topology(rank, nodes=6, procs_per_node=1), segments=segments)
        if rank == 0:
            cl.scheduler.advance(1.0)
        own, received = algo.exchange([torch.full((6,), float(rank))])
        return cl.scheduler.now(), sorted(float(t[0]) for t in received.values())

    results = job.run(6, 1, NET, body)
    assert results[3][1] == [2.0, 4.0]
    waited = [now > 1.0 for now, _ in results]
    assert waited[1] and waited[5]  # rank 0's neighbours wait either way
    assert waited[2] == waited[3] == waited[4] == (segments == 3)


def test_messages_can_be_charged_as_a_larger_models():
    """``sim_model_mb``: the digits CNN computes, ResNet-50's bytes are charged on the wire."""

    def body(rank, cl):
        cl.byte_scale = 250.0
        job.init_process_group(rank, cl)
        dist.all_reduce(torch.ones(1000))
        return cl.scheduler.now()

    assert job.run(2, 1, NET, body) == [pytest.approx(NET.ring_allreduce([0, 1], 1, 4000 * 250.0))] * 2


def _receive_from_any(cl, count: int, numel: int = 1) -> list[tuple[int, float]]:
    """``count`` receives from any rank: each message's first value and the receiver's clock after it."""
    got = []
    for _ in range(count):
        t = torch.zeros(numel)
        dist.irecv(t).wait()  # any source
        got.append((int(t[0].item()), round(cl.scheduler.now(), 9)))
    return got


def test_messages_arrive_in_virtual_time_not_in_thread_order():
    """Rank 1 sends late in virtual time but runs first on the machine; rank 2 sends early. A receive
    from any rank takes rank 2's message first, as on a real network."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        if rank == 0:
            return _receive_from_any(cl, 2)
        cl.scheduler.advance(0.5 if rank == 1 else 0.1)
        dist.send(torch.full((1,), float(rank)), dst=0)
        return None

    got = job.run(3, 1, NET, body)[0]
    message = NET.p2p(1, 0, 1, 4)
    assert got == [(2, round(0.1 + message, 9)), (1, round(0.5 + message, 9))]


def test_one_senders_messages_are_not_overtaken():
    """A large message then a small one from the same rank: the small one would arrive first, but a
    receive takes a sender's messages in the order sent (MPI's non-overtaking rule), so it waits for
    the large one; a receive from any rank takes the earliest of the senders' first messages."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        if rank == 0:
            return _receive_from_any(cl, 3, numel=250_000)
        if rank == 1:
            large = dist.isend(torch.full((250_000,), 1.0), dst=0)  # 1 MB: arrives at 10 ms + latency
            dist.send(torch.full((1,), 11.0), dst=0)  # sent at once: would arrive at 10 us
            large.wait()
        else:
            cl.scheduler.advance(0.005)
            dist.send(torch.full((1,), 2.0), dst=0)
        return None

    got = job.run(3, 1, NET, body)[0]
    # Rank 0's adapter is shared: each small message moves at half its rate beside the large one
    # (as if 8 bytes alone), and the large one gives up 4 bytes' time to each of them.
    large, small = NET.p2p(1, 0, 1, 1_000_008), NET.p2p(2, 0, 1, 8)
    assert got == [(2, round(0.005 + small, 9)), (1, round(large, 9)), (11, round(large, 9))]
    assert small < 0.005


def test_a_tensor_sent_to_two_ranks_is_copied_once_and_each_receiver_owns_its_values():
    """Rank 0 sends one tensor to ranks 1 and 2 without waiting in between (as D-PSGD's exchange
    does): one copy is taken for both. Rank 1 receives first, into a plain buffer, which it then
    writes in place; rank 2, the copy's last reader, receives into a plain buffer that takes the
    copy's storage, and still sees the values sent. After waiting, rank 0 writes the tensor through
    ``.data`` (which leaves its version counter alone) and sends it again: the receivers, whose first
    messages are still undelivered, get the new values, not the first copy."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        if rank == 0:
            x = torch.arange(4.0)
            for _ in range(2):
                works = [dist.isend(x, 1), dist.isend(x, 2)]
                assert cl.scheduler.me().sent[id(x)].readers == 2  # one copy for both
                for w in works:
                    w.wait()
                x.data.add_(10.0)
            return None
        cl.scheduler.advance(0.1 * rank)  # after rank 0 has sent twice; rank 1 before rank 2
        buf, base = torch.zeros(4), torch.zeros(6)
        dist.recv(buf, 0)
        if rank == 1:
            buf.mul_(-1.0)  # its own values: rank 2's message is untouched
        dist.recv(base[1:5], 0)  # a view: copied into its base
        return buf.tolist(), base.tolist()

    results = job.run(3, 1, NET, body)
    assert results[1] == ([-0.0, -1.0, -2.0, -3.0], [0.0, 10.0, 11.0, 12.0, 13.0, 0.0])
    assert results[2] == ([0.0, 1.0, 2.0, 3.0], [0.0, 10.0, 11.0, 12.0, 13.0, 0.0])


def test_a_receive_into_a_shared_or_odd_buffer_is_copied_into_and_a_plain_one_takes_the_message():
    """The storage of a message's copy goes to the receive buffer only when no other tensor can see
    the swap. A parameter's ``.data`` alias, a view, and a buffer of another type or shape (1 x 4) are
    copied into, keeping their storage, so the parameter and the base see the values; a plain
    buffer of the same shape and type takes the copy's storage (its data pointer moves)."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        if rank == 0:
            for _ in range(5):
                dist.send(torch.arange(4.0), 1)
            return None
        param, base = torch.nn.Parameter(torch.zeros(4)), torch.zeros(8)
        buffers = [param.data, base[2:6], torch.zeros(4, dtype=torch.float64), torch.zeros(1, 4), torch.zeros(4)]
        before = [b.data_ptr() for b in buffers]
        for b in buffers:
            dist.recv(b, 0)
        moved = [b.data_ptr() != p for b, p in zip(buffers, before)]
        return param.tolist(), base.tolist(), [b.flatten().tolist() for b in buffers[2:]], moved

    param, base, others, moved = job.run(2, 1, NET, body)[1]
    assert param == [0.0, 1.0, 2.0, 3.0]
    assert base == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0]
    assert others == [[0.0, 1.0, 2.0, 3.0]] * 3
    assert moved == [False, False, False, False, True]


def test_a_receive_from_any_of_255_senders_takes_them_in_arrival_order():
    """256 ranks: rank r sends at (256 - r) ms, so rank 0 receives from 255 down to 1, each at its
    arrival; then an all-reduce of every rank ends at the last arrival plus the ring."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        got = _receive_from_any(cl, 255) if rank == 0 else None
        if rank > 0:
            cl.scheduler.advance(0.001 * (256 - rank))
            dist.send(torch.full((1,), float(rank)), dst=0)
        total = torch.ones(1)
        dist.all_reduce(total)
        return got, total.item(), cl.scheduler.now()

    results = job.run(256, 1, NET, body)
    got = results[0][0]
    message = NET.p2p(1, 0, 1, 4)
    assert [r for r, _ in got] == list(range(255, 0, -1))
    assert [t for _, t in got] == [pytest.approx(0.001 * (256 - r) + message) for r in range(255, 0, -1)]
    arrived = got[-1][1]
    ring = NET.ring_allreduce(list(range(256)), 1, 4)
    assert all(total == 256.0 and end == pytest.approx(arrived + ring) for _, total, end in results)


def test_every_rank_and_its_threads_run_backward_on_their_own_thread():
    """Autograd's switch is per thread: off in each rank's thread and in the threads it starts, so a
    CUDA model's backward, and DDP's comm hook with it, runs on the rank's thread, not on autograd's
    device thread, which is no rank's (seen on a GPU: the hook found no actor)."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        seen = []
        thread = comm.threads().Thread(target=lambda: seen.append(torch.autograd.is_multithreading_enabled()))
        thread.start()
        thread.join()
        return torch.autograd.is_multithreading_enabled(), seen

    assert job.run(2, 1, NET, body) == [(False, [False])] * 2
    assert torch.autograd.is_multithreading_enabled()  # the caller's own setting is untouched


def test_non_blocking_all_reduce_overlaps_compute():
    def body(rank, cl):
        job.init_process_group(rank, cl)
        work = dist.all_reduce(torch.ones(250_000), async_op=True)  # 1 MB: 2 x 1/2 MB x ... on one node
        cl.scheduler.advance(0.01)
        work.wait()
        return cl.scheduler.now()

    comm = NET.ring_allreduce([0, 1], 2, 1_000_000)
    assert 0 < comm < 0.01
    assert job.run(2, 2, NET, body) == [pytest.approx(0.01)] * 2  # hidden behind the compute
    # and a wait longer than the compute ends with the communication
    slow = network.Network("slow", network.Link(0.0, 1e7), network.Link(0.0, 1e7))
    assert job.run(2, 2, slow, body) == [pytest.approx(slow.ring_allreduce([0, 1], 2, 1_000_000))] * 2


def test_the_first_communication_after_compute_waits_sync_s_and_the_next_ones_do_not():
    """``Network.sync_s`` (a machine whose ranks share cores): 2 ranks on one node compute 100 ms,
    then all-reduce 4 kB twice: the first ends at 100 ms + ring + 5 ms, the second a ring later.
    Then each sends the other 4 kB (a blocking send ends when its message lands): rank 0, after
    another 100 ms of compute, a p2p + 5 ms later; rank 1, with no compute since its collective, a
    p2p later."""
    shared = network.Network("shared", NET.intra, NET.inter, sync_s=0.005)
    ring, p2p = shared.ring_allreduce([0, 1], 2, 4000), shared.p2p(0, 1, 2, 4000)
    cfg = _clock_config(2)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        clock = job.VirtualClock(cl, rank, cfg)
        clock.compute()
        x = torch.ones(1000)
        dist.all_reduce(x)
        first = clock()
        dist.all_reduce(x)
        second = clock()
        if rank == 0:
            clock.compute()
        start = clock()
        dist.send(x.clone(), 1 - rank)
        sent = clock() - start
        dist.recv(x, 1 - rank)
        return first, second, sent

    (first0, second0, sent0), (first1, second1, sent1) = job.run(2, 2, shared, body)
    assert first0 == first1 == pytest.approx(0.1 + ring + 0.005)
    assert second0 == second1 == pytest.approx(0.1 + 2 * ring + 0.005)
    assert sent0 == pytest.approx(p2p + 0.005) and sent1 == pytest.approx(p2p)
    assert job.run(2, 2, NET, body)[0][0] == pytest.approx(0.1 + ring)  # a cluster's network: 0


def test_a_rank_that_waits_for_nothing_that_comes_is_a_deadlock():
    def body(rank, cl):
        job.init_process_group(rank, cl)
        if rank == 0:
            dist.recv(torch.zeros(1), src=1)

    with pytest.raises(Deadlock, match="rank 0: receive from 1"):
        job.run(2, 1, NET, body)


def test_each_rank_draws_from_its_own_random_stream():
    def body(rank, cl):
        job.init_process_group(rank, cl)
        torch.manual_seed(100 + rank)
        first = torch.rand(3)
        dist.barrier()  # the other rank runs and draws in between
        return torch.cat([first, torch.rand(3)])

    results = job.run(2, 1, NET, body)
    for rank, drawn in enumerate(results):
        torch.manual_seed(100 + rank)
        assert torch.equal(drawn, torch.rand(6))  # as a process of its own would draw


def test_subgroups_and_objects():
    def body(rank, cl):
        job.init_process_group(rank, cl)
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=pairs[rank // 2])
        names = [None] * 4
        dist.all_gather_object(names, f"r{rank}")
        return t.item(), names

    results = job.run(4, 2, NET, body)
    assert [r[0] for r in results] == [1.0, 1.0, 5.0, 5.0]
    assert all(r[1] == ["r0", "r1", "r2", "r3"] for r in results)


# -- the runner's loop on the virtual cluster: the real job's trajectory ----------------------------


def _rows(out):
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(
    "algorithm",
    ["ddp", "allreduce", "local_sgd", "post_local_sgd", "dpsgd", "sgp", "daso", "diloco", "powersgd", "horovod"],
)
def test_a_simulated_run_follows_the_real_jobs_trajectory(tmp_path, run_benchmark, algorithm, monkeypatch):
    """2 nodes x 2, no stragglers, same seed and data order: the simulated run's validation loss at
    every evaluation equals the real 4-process run's (to 1e-4 relative; measured: 2e-7 or better).

    Horovod (fp16 messages) to 3e-4. Its real run is not deterministic as Horovod is configured for
    the cluster: what its fusion buffer holds depends on which gradients are ready at each 1 ms cycle,
    and that decides the order of the ring's additions. Three real runs on a loaded machine ended
    1.4e-4 apart (val_loss 0.501690-0.501759), which failed this test twice in two full suites run
    side by side. With fusion off (one all-reduce a tensor, as here) the real run is bit-identical
    from run to run, and the model, which rounds to fp16 as Horovod does but sums in another order,
    lies 1.5e-4 from it after 2 epochs."""
    if algorithm == "horovod" and Horovod.unavailable() is not None:
        pytest.skip(Horovod.unavailable())
    common = ["--algorithm", algorithm, "--task", "digits", "--nodes", "2", "--procs-per-node", "2"]
    epochs = 3 if algorithm == "daso" else 2  # DASO: one epoch of each phase (warm-up, cycling, cool-down)
    common += ["--set", "wandb=false", "--set", f"epochs={epochs}"]
    if algorithm == "daso":
        common += ["--set", "sync_warmup_epochs=1", "--set", "sync_cooldown_epochs=1"]
    if algorithm == "diloco":  # outer steps every 8 of the 22 steps an epoch
        common += ["--set", "inner_steps=8"]
    if algorithm == "powersgd":  # compressed from the 10th of the 44 steps, through PyTorch's hook
        common += ["--set", "start_powerSGD_iter=10"]
    if algorithm == "horovod":  # the DASO papers' Horovod: fp16 messages (the real one against its model)
        common += ["--set", "fp16_compression=true"]
        monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")  # a fixed order of additions (the docstring)
    real = run_benchmark(*common, "--out", str(tmp_path / "real"))
    simulated = run_benchmark(*common, "--out", str(tmp_path / "sim"), "--set", "clock=simulated")
    assert real.returncode == 0 and simulated.returncode == 0, simulated.stderr[-2000:]
    a, b = _rows(tmp_path / "real"), _rows(tmp_path / "sim")
    assert len(a) == len(b) == epochs
    for x, y in zip(a, b):
        assert float(y["val_loss"]) == pytest.approx(float(x["val_loss"]), rel=3e-4 if algorithm == "horovod" else 1e-4)
        assert float(y["sent_mb"]) == pytest.approx(float(x["sent_mb"]), rel=1e-9)  # the bytes the link charges
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    env = json.loads((tmp_path / "sim" / "env.json").read_text())
    assert summary["clock"] == "simulated" and env["network"]["name"] == "juwels_booster"
    # epochs of 22 batches of 100 ms and an evaluation of 90 samples a rank (5.6 batches of 16, forward
    # only: a third of 100 ms each), plus what the network costs
    by_hand = epochs * (2.2 + 90 / 16 * 0.1 / 3)
    assert by_hand <= summary["wall_s"] < by_hand * 1.05


def _simulate(run_benchmark, out, algorithm, *sets):
    args = ["--algorithm", algorithm, "--task", "digits", "--nodes", "2", "--procs-per-node", "2", "--out", str(out)]
    for item in ("wandb=false", "epochs=2", "clock=simulated", *sets):
        args += ["--set", item]
    result = run_benchmark(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads((out / "summary.json").read_text()), _rows(out)


def test_wait_avoiding_algorithms_run_their_threads_on_the_virtual_clock(tmp_path, run_benchmark):
    """WAGMA's progress thread and AD-PSGD's gossip thread run as threads of their rank on the virtual
    clock: with one of the 4 workers delayed 320 ms at each step, allreduce waits for it every step
    (by hand: 2 epochs x 22 steps x (100 + 320) ms and 2 evaluations, plus microseconds of all-reduce), the
    wait-avoiding ones do not; and a threaded run is as deterministic as the others."""
    straggler = ("straggler=fixed", "straggler_ranks=1", "straggler_delay_ms=320")
    sync, sync_rows = _simulate(run_benchmark, tmp_path / "allreduce", "allreduce", *straggler)
    assert sync["wall_s"] == pytest.approx(2 * (22 * 0.420 + 90 / 16 * 0.1 / 3), rel=1e-3)  # + 2 evaluations
    for row in sync_rows:  # rank 0's time: computing (its delays included), communicating, waiting
        parts = [float(row[k]) for k in ("sim_compute_s", "sim_comm_s", "sim_idle_s")]
        assert sum(parts) == pytest.approx(float(row["wall_s"]), rel=1e-4)  # + the start-up messages
        assert parts[2] > parts[1] > 0  # it waits for the delayed rank far longer than the network takes
    for algorithm in ("wagma", "adpsgd"):
        summary, rows = _simulate(run_benchmark, tmp_path / algorithm, algorithm, *straggler)
        assert summary["final_metric"] > 0.5, algorithm  # trained (chance: 0.1)
        assert summary["wall_s"] < 0.7 * sync["wall_s"], algorithm
        again, rows_again = _simulate(run_benchmark, tmp_path / f"{algorithm}-again", algorithm, *straggler)
        assert rows_again == rows, algorithm
    exchanges = [float(r["exchanges"]) for r in _rows(tmp_path / "adpsgd")]
    assert exchanges[-1] > exchanges[0] > 0  # the gossip thread exchanged, epoch after epoch
    stale = [float(r["stale_share"]) for r in _rows(tmp_path / "wagma")]
    assert all(0 <= s <= 1 for s in stale)


def test_an_updaters_update_costs_its_share_of_the_gpu_by_hand():
    """LAP/LPP-SGD's updaters on the virtual clock: U=4 updaters running together at 2x one process's
    throughput make a full update cost 100 ms x 4 / 2 = 200 ms. LPP's partial update of tensors [1, 2)
    of sizes [30, 10, 60] costs the forward (1/3), the input gradients through the 70 % of the
    parameters from the block up (1/3 x 0.7) and the block's own 10 % of weight gradients (1/3 x 0.1):
    0.6 of a full one, 120 ms."""
    cfg = _clock_config(1, sim_updater_speedup=2.0)

    def body(rank, cl):
        clock = job.VirtualClock(cl, rank, cfg)
        clock.update(4, [30, 10, 60], (0, 3))
        full = clock()
        clock.update(4, [30, 10, 60], (1, 2))
        return full, clock() - full

    [(full, partial)] = job.run(1, 1, NET, body)
    assert full == pytest.approx(0.2) and partial == pytest.approx(0.12)


def _clock_config(world_size: int, **settings) -> SimpleNamespace:
    """What ``VirtualClock`` reads of a run's configuration: 100 ms batches, no straggler, no noise."""
    defaults = {
        "sim_step_ms": 100.0,
        "sim_step_source": "set by hand",
        "sim_step_cv": 0.0,
        "straggler": "none",
        "sim_model_mb": 0.0,
    }
    chosen = {**defaults, "sim_updater_speedup": 1.0, **settings}
    return SimpleNamespace(settings=SimpleNamespace(**chosen), world_size=world_size, seed=0)


def test_machine_noise_varies_each_batch_by_its_cv_from_each_ranks_own_stream():
    """``sim_step_cv``: each batch's compute time is drawn around ``sim_step_ms`` with that CV (a gamma
    law), from a stream of the rank's own, the same for the same seed; 0 keeps every batch exact."""

    def draws(cv: float, seed: int = 0) -> list[list[float]]:
        cfg = _clock_config(2, sim_step_cv=cv)

        def body(rank, cl):
            clock = job.VirtualClock(cl, rank, cfg)
            times = []
            for _ in range(2000):
                start = clock()
                clock.compute()
                times.append(clock() - start)
            return times

        return job.run(2, 1, NET, body)

    noisy = torch.tensor(draws(0.1), dtype=torch.float64)
    assert noisy.mean(1) == pytest.approx([0.1, 0.1], rel=0.01)
    assert (noisy.std(1) / noisy.mean(1)) == pytest.approx([0.1, 0.1], rel=0.1)
    assert not torch.equal(noisy[0], noisy[1]) and torch.equal(noisy, torch.tensor(draws(0.1), dtype=torch.float64))
    assert draws(0.0) == [[pytest.approx(0.1)] * 2000] * 2


def test_the_averagers_next_poll_waits_until_some_counter_reaches_its_threshold():
    """The stand-in for LAP/LPP's busy poll: rank 1's counter reaches 5 at 0.3 s and 7 at 0.5 s; rank 0,
    waiting for some counter to reach 4 then 6, goes on at 0.3 s then 0.5 s, and at once for 3."""
    cfg = _clock_config(2)

    def body(rank, cl):
        clock = job.VirtualClock(cl, rank, cfg)
        if rank == 1:
            for seconds, count in ((0.3, 5), (0.2, 7)):
                clock.sleep(seconds)
                clock.count_updates(count)
            return None
        times = []
        for threshold in (4, 6, 3):
            clock.wait_updates(threshold)
            times.append(clock())
        return times

    times, _ = job.run(2, 1, NET, body)
    assert times == pytest.approx([0.3, 0.5, 0.5])


def test_with_machine_noise_one_rank_activates_each_wagma_round_and_the_late_ones_send_stale_buffers(
    tmp_path, run_benchmark
):
    """On an exact clock the 4 ranks reach every round at the same instant: all activate it and all
    contribute fresh models. With 1 % noise on 100 ms batches they arrive about a millisecond apart,
    far more than an activation's microseconds on the wire: the first activates the round and the
    others, still computing, contribute their stale send buffers (WAGMA's wait-avoidance), so rank 0
    is stale in about 3 rounds of 4, the ones it does not activate itself."""
    _, exact = _simulate(run_benchmark, tmp_path / "exact", "wagma")
    _, noisy = _simulate(run_benchmark, tmp_path / "noisy", "wagma", "sim_step_cv=0.01")
    assert float(exact[-1]["stale_share"]) == 0.0
    assert 0.5 < float(noisy[-1]["stale_share"]) < 1.0


def test_lpp_sgds_averagers_decide_alike_on_the_virtual_clock_with_uneven_ranks():
    """The real test's invariants (``test_lpp_sgd.py``, 200 rounds with uneven updaters) on the virtual
    clock: rank 1's batches come three times later, by a delay that varies per step; both averagers
    still take the same decisions (the same rounds), every update is counted once (40 an epoch, 3 epochs), and
    the state round-trips."""
    cfg = _clock_config(2, sim_step_ms=1.0)

    def body(rank, cl):
        job.init_process_group(rank, cl)
        clock = job.VirtualClock(cl, rank, cfg)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        algo = algorithms.build("lpp_sgd", Topology(rank, nodes=1, procs_per_node=2), updaters=2, partial_start_epoch=1)
        algo.clock = clock
        algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=40, epochs=100))  # K = 1 throughout
        uneven = SimpleNamespace(before_step=lambda step: clock.sleep(0.0005 * (1 + 2 * rank) * (step % 3)))
        task = SimpleNamespace(loss=torch.nn.functional.cross_entropy, hparams={"batch_size": 8})
        g = torch.Generator().manual_seed(rank)
        for epoch in range(3):
            batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(40)]
            work = (
                epoch,
                batches,
                task,
                optimizer,
                lambda s: 1.0,
                epoch * 40,
                uneven,
                torch.device("cpu"),
                lambda n: None,
            )
            loss_sum, n = algo.train_epoch(algorithms.Epoch(*work))
            assert n == 40 and loss_sum > 0
            dist.all_reduce(torch.tensor([loss_sum, float(n)], dtype=torch.float64))  # the runner's epoch end
        state = algo.state_dict()
        algo.load_state_dict(state)
        result = (algo.rounds, state["updates"], int(state["stats"][:, 1].sum()), algo.metrics()["partial_share"])
        algo.close()
        return result

    first, second = job.run(2, 2, NET, body)
    assert first[:3] == second[:3] and first[1] == first[2] == 120  # the same decisions; every update once
    assert first[0] >= 60 and 0.3 < first[3] < 0.5  # averaging after about every update; partial steps from epoch 1


def test_lap_and_lpp_run_their_updaters_as_threads_on_the_virtual_clock(tmp_path, run_benchmark):
    """2 updaters a worker at 2x one process's throughput: an update costs 100 ms, so LAP-SGD's epoch of
    22 batches is 11 updates of each updater, 1.1 s, plus the evaluation (by hand: 90 / 16 batches of
    forward passes, a third of 100 ms each); averaging after every update in the first epoch (K=1),
    then every 16 (K=16). LPP-SGD's partial updates cost less, and its run is as fast or faster; both
    train, and a threaded run is deterministic."""
    hogwild = ("updaters=2", "sim_updater_speedup=2")
    lap, lap_rows = _simulate(run_benchmark, tmp_path / "lap", "lap_sgd", *hogwild)
    assert lap["wall_s"] == pytest.approx(2 * (1.1 + 90 / 16 * 0.1 / 3), rel=1e-3)
    assert [r["K"] for r in lap_rows] == ["1.0", "16.0"]
    assert 11 <= float(lap_rows[0]["rounds"]) <= 22 and float(lap_rows[1]["rounds"]) - float(lap_rows[0]["rounds"]) <= 3
    lpp, lpp_rows = _simulate(run_benchmark, tmp_path / "lpp", "lpp_sgd", *hogwild, "partial_start_epoch=1")
    # the share so far: none in the first epoch, then about every second update of the second
    assert float(lpp_rows[0]["partial_share"]) == 0 and 0.2 < float(lpp_rows[1]["partial_share"]) <= 0.25
    assert float(lpp_rows[0]["wall_s"]) == pytest.approx(float(lap_rows[0]["wall_s"]))  # full steps only
    assert lpp["wall_s"] < lap["wall_s"]  # then half the updates are partial
    for summary in (lap, lpp):
        assert summary["final_metric"] > 0.5  # trained (chance: 0.1)
    _, again = _simulate(run_benchmark, tmp_path / "lpp-again", "lpp_sgd", *hogwild, "partial_start_epoch=1")
    assert again == lpp_rows


SIMULATED = [name for name in algorithms.names() if algorithms.get(name).simulator]


@pytest.mark.parametrize("algorithm", SIMULATED)
def test_every_simulated_algorithm_runs_16_nodes_of_4(tmp_path, run_benchmark, algorithm):
    """64 workers in one process (digits: one step an epoch at batch 16 x 64)."""
    out = tmp_path / algorithm
    args = ["--algorithm", algorithm, "--task", "digits", "--nodes", "16", "--procs-per-node", "4"]
    args += ["--out", str(out), "--set", "clock=simulated", "--set", "wandb=false", "--set", "epochs=1"]
    if algorithm in ("lap_sgd", "lpp_sgd"):  # the embedded suites' U: the digits model has no 4 blocks
        args += ["--set", "updaters=2"]
    result = run_benchmark(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["clock"] == "simulated" and summary["steps"] > 0


def test_an_all_reduce_op_the_virtual_cluster_lacks_is_named():
    def body(rank, cl):
        job.init_process_group(rank, cl)
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.PRODUCT)

    with pytest.raises(ValueError, match="SUM, AVG, MAX or MIN"):
        job.run(2, 1, NET, body)


def test_a_run_that_cannot_be_signalled_never_asks_the_others_to_agree_on_stopping():
    """On the virtual cluster no signal can reach a rank: the stop flag's all-reduce, every 8 steps,
    would only make wait-avoiding ranks wait for the slowest. No process group exists here, so any
    communication would raise."""
    from benchmarks.checkpoint import StopRequest

    stop = StopRequest(signals=False)
    assert not any(stop.agreed() for _ in range(20)) and not stop.agreed(drain=True)
    stop.close()


def test_ddp_overlaps_its_all_reduce_with_backward_as_on_a_gpu(tmp_path, run_benchmark):
    """2 nodes x 1, messages charged as a 250 MB model over HDR200 (25 GB/s, 5 us), 100 ms a batch.
    allreduce sends after backward: 2 x (5 us + 125 MB / 25 GB/s) = 10.01 ms a step on top of the
    batch. DDP's buckets (25 MiB of the large model: 10 chunks of 25 MB) start as backward produces
    them, one every 6.7 ms from the forward's end (a third of the batch), each done 1.01 ms later:
    only the last one's 1.01 ms is left after the batch. By hand: DDP saves 9.0 ms a step."""
    sets = ("sim_model_mb=250", "epochs=1")
    args = ("--nodes", "2", "--procs-per-node", "1")
    runs = {}
    for algorithm in ("allreduce", "ddp"):
        out = tmp_path / algorithm
        result = run_benchmark(
            "--algorithm", algorithm, "--task", "digits", *args, "--out", str(out),
            *[x for item in ("wandb=false", "clock=simulated", *sets) for x in ("--set", item)],
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        runs[algorithm] = json.loads((out / "summary.json").read_text())
    steps = runs["ddp"]["steps"]
    assert steps == runs["allreduce"]["steps"] > 10
    saved = (runs["allreduce"]["wall_s"] - runs["ddp"]["wall_s"]) / steps
    assert saved == pytest.approx(0.009, rel=0.03)


def test_a_measured_link_is_fitted_to_the_ring_and_read_from_its_file(tmp_path):
    """calibrate's fit recovers the link that made the times; a network file names a run's links,
    and a bad one is refused before the run starts, naming what it expected."""
    from benchmarks import config as run_config
    from tools import calibrate

    truth = network.Network("made", network.Link(0, 1), network.Link(2e-4, 1.5e9))
    sizes = [256, 4096, 65536, 1 << 20, 1 << 22]
    times = [truth.ring_allreduce(range(4), 1, n) for n in sizes]
    fitted = calibrate.fit_ring(sizes, times, 4)
    assert fitted.latency_s == pytest.approx(2e-4) and fitted.bandwidth_bps == pytest.approx(1.5e9)
    here = network.Network("here", fitted, fitted, {"inter": "made by hand"}, 0.004, skips_empty_segments=True)
    network.save(here, tmp_path / "net.json")
    assert network.load(str(tmp_path / "net.json")) == here
    (tmp_path / "bad.json").write_text('{"name": "x", "intra": {"latency_s": 1}}')
    for spec, message in (
        ("bad.json", "expected the form of config/networks/example.json"),
        ("nowhere", "choose one of juwels_booster"),
    ):
        with pytest.raises(run_config.ConfigError, match=message):
            sets = ["clock=simulated", f"sim_network={tmp_path / spec}"]
            run_config.resolve("allreduce", "digits", 1, 2, 0, tmp_path / "o", sets)
    sets = ["clock=simulated", f"sim_network={tmp_path / 'net.json'}"]
    assert run_config.resolve("allreduce", "digits", 1, 2, 0, tmp_path / "o", sets)


_CAPTURED = dict(cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow  # its real runs start in a process of their own (a fork of this one could inherit a held lock)
def test_a_measured_batch_time_goes_with_its_source_to_the_run_and_the_report(tmp_path, run_benchmark):
    """``tools.step_time`` prints a batch time and its source as ``--set`` items; a simulated run
    given them writes both to config.json and env.json, and the runs table names the source."""
    from analysis import aggregate

    tool = [sys.executable, "-m", "tools.step_time", "--task", "digits"]
    # 8 epochs apart: 2 s of steps, beyond the noise of two start-ups (2 epochs apart came out negative in 2 of 3)
    measured = subprocess.run([*tool, "--epochs", "1", "9", "--repeats", "1", "--set", "batch_size=4"], **_CAPTURED)
    assert measured.returncode == 0, measured.stderr[-2000:]
    line = measured.stdout.splitlines()[-1]
    ms = float(re.search(r"--set sim_step_ms=([0-9.]+) ", line).group(1))
    source = re.search(r'--set "sim_step_source=(.+)"$', line).group(1)
    assert ms > 0 and "the runner's step of digits at batch 4, all cores' threads, median of 1" in source
    out = tmp_path / "run"
    args = ["--algorithm", "allreduce", "--task", "digits", "--nodes", "1", "--procs-per-node", "2", "--out", out]
    for item in ("clock=simulated", "wandb=false", "epochs=1", f"sim_step_ms={ms}", f"sim_step_source={source}"):
        args += ["--set", item]
    result = run_benchmark(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["settings"]["sim_step_source"] == source
    env = json.loads((out / "env.json").read_text())
    assert env["sim_step_ms"] == ms and env["sim_step_source"] == source
    runs = aggregate.runs_table([out])
    assert runs.loc[0, "time_source"] == source and f"{ms:g} ms a batch" in runs.loc[0, "time_model"]
    assert aggregate.time_source({"sim_step_ms": 620}, "simulated") == "set by hand"
    assert aggregate.time_source({}, "wall") is None
    refused = subprocess.run([*tool, "--set", "nosuch=1"], **_CAPTURED)  # named before anything runs
    assert refused.returncode == 2 and "--set nosuch: unknown key" in refused.stderr


def test_the_calibration_charges_lap_and_lpp_the_cores_their_averagers_take():
    """On this machine each rank runs U updater processes and an averager that polls without pause:
    U + 1 busy processes where the measured batch had one, so U updates take U + 1 batches, which
    the virtual clock (an update costs a batch x U / speedup) gives with speedup U / (U + 1)."""
    from tools import calibrate

    assert calibrate.updater_speedup("lap_sgd") == calibrate.updater_speedup("lpp_sgd")
    (item,) = calibrate.updater_speedup("lpp_sgd")  # the embedded default's updaters=2
    assert item == "sim_updater_speedup=0.666667"
    assert calibrate.updater_speedup("ddp") == []


@pytest.mark.slow  # it starts real runs (the plain step and the real layout), which the conftest cannot see
def test_the_cost_benchmark_sets_each_simulated_step_beside_a_plain_and_a_real_one(capsys):
    from tools import virtual_cost

    # Runs 2 epochs apart: one epoch (0.2 CPU-s) gave 2.4 to 4.9 CPU-ms a step in 3 tries.
    virtual_cost.main(
        ["--task", "digits", "--algorithms", "allreduce", "--layouts", "2x1", "--real-layout", "1x2"]
        + ["--epochs", "1", "3", "--repeats", "1"]
    )
    out = capsys.readouterr().out
    assert "a real worker-step of allreduce at 1x2" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("allreduce") and "2x1" in line)
    cpu, to_plain, to_real = float(row[2]), float(row[4]), float(row[6])  # each median is followed by its range
    assert cpu > 0 and to_plain > 0 and to_real > 0
    assert "hand-off" in out and "the same on 2 models, one process" in out
