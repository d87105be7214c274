"""Bytes sent (``algorithms/comm.py``): each collective's rule by hand, and each algorithm's bytes per
step as its collective or its graph implies, counted on 4 gloo processes step by step."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from algorithms import comm
from benchmarks.tasks import digits
from benchmarks.virtual import job, network
from tests.distributed import run_on, train_digits

NET = network.PRESETS["juwels_booster"]
N = sum(p.numel() * 4 for p in digits.make_model().parameters())  # the digits CNN's fp32 parameters: 174,664 B
STEPS = 12


def test_the_digits_model_is_the_size_the_hand_numbers_assume():
    # conv1 32*9+32, conv2 64*288+64, fc1 24*1024+24, fc2 10*24+10 parameters, 4 bytes each
    assert N == 4 * (320 + 18_496 + 24_600 + 250) == 174_664


def test_collectives_count_what_their_algorithm_sends_from_each_rank():
    """Four ranks of the virtual cluster; 1,000 float32 elements are 4,000 bytes."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        comm.set_sent_bytes(0.0)
        counts = []
        comm.all_reduce(torch.ones(1000))  # ring: 2(p-1)/p * 4000 = 6000 from each rank
        counts.append(comm.sent_bytes())
        comm.broadcast(torch.ones(1000), src=0)  # 3 messages of 4000 in all: 3000 a rank
        counts.append(comm.sent_bytes())
        if rank == 0:  # a point-to-point message counts on its sender only
            comm.send(torch.ones(10), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(10), src=0)
        counts.append(comm.sent_bytes())
        peer = rank ^ 1  # both send and receive: only the send counts
        ops = [dist.P2POp(dist.isend, torch.ones(5), peer), dist.P2POp(dist.irecv, torch.empty(5), peer)]
        for work in comm.batch_isend_irecv(ops):
            work.wait()
        counts.append(comm.sent_bytes())
        with comm.uncounted():  # evaluation, checkpoints: not the algorithm's
            comm.all_reduce(torch.ones(1000))
        counts.append(comm.sent_bytes())
        return counts

    results = job.run(4, 2, NET, body)
    assert results[0] == [6000, 9000, 9040, 9060, 9060]
    assert results[1] == [6000, 9000, 9000, 9020, 9020]
    assert results[2] == results[3] == [6000, 9000, 9000, 9020, 9020]


def test_the_virtual_cluster_counts_the_bytes_it_charges():
    """``sim_model_mb``: messages are charged, and counted, as the larger model's."""

    def body(rank, cl):
        job.init_process_group(rank, cl)
        cl.byte_scale = 250.0
        comm.set_message_scale(cl.byte_scale)
        comm.set_sent_bytes(0.0)
        comm.all_reduce(torch.ones(1000))
        return comm.sent_bytes(), cl.scheduler.now()

    for sent, now in job.run(2, 1, NET, body):
        assert sent == 4000 * 250.0  # 2(p-1)/p = 1 at p = 2
        assert now == pytest.approx(NET.inter.latency_s * 2 + sent / NET.inter.bandwidth_bps)
    assert comm.set_message_scale(1.0) == 1.0  # the cluster's end put the scale back


# -- each algorithm's bytes per step, on 4 gloo processes (2 nodes x 2) ---------------------------

RING = 2 * 3 / 4  # a ring all-reduce over 4 ranks sends 2(p-1)/p of the vector from each
START = 3 / 4 * N  # rank 0's parameters broadcast to the other 3 at the start


def _per_step(name: str, rank: int, t: int) -> float:
    """What ``name`` sends from ``rank`` at step ``t`` (0-based), worked out from its paper's rule."""
    if name in ("allreduce", "ddp"):
        return RING * N  # every gradient, averaged by all-reduce (DDP's buckets hold them all)
    if name == "dpsgd":
        return 2 * N  # its model to each of its 2 neighbours on the ring 0-1-2-3-0
    if name == "sgp":
        return N + 4  # one out-peer a step (SGP's 1-peer exponential graph): numerator and weight
    if name == "wagma":
        # mode=sync, S = 2 of 4: one recursive-doubling exchange of the model with the partner a step,
        # and every global_period = 10 steps a global all-reduce instead
        return RING * N if (t + 1) % 10 == 0 else N
    if name == "powersgd":
        if t < 2:  # start_powerSGD_iter = 2: the bucket whole, as all-reduce
            return RING * N
        # rank 1 (min_compression_rate 2): conv1 32x9 -> P 32 + Q 9; conv2 64x288 -> 64 + 288;
        # fc1 24x1024 -> 24 + 1024; fc2 10x24 -> 10 + 24; the biases (32, 64, 24, 10) whole
        return RING * 4 * (41 + 352 + 1048 + 34 + 32 + 64 + 24 + 10)
    raise AssertionError(name)


def _check(t: int, algo, model, name: str) -> None:
    expected = START + sum(_per_step(name, dist.get_rank(), s) for s in range(t + 1))
    assert comm.sent_bytes() == pytest.approx(expected, rel=1e-12), (name, t)


def _count_steps(rank: int, world: int, out: str) -> None:
    cases = {
        "allreduce": {},
        "ddp": {},
        "dpsgd": {},
        "sgp": {},
        "wagma": {"mode": "sync"},
        "powersgd": {"start_powerSGD_iter": 2},
    }
    for name, knobs in cases.items():
        comm.set_sent_bytes(0.0)
        train_digits(
            rank, world, name, knobs, f"{out}/{name}.pt", STEPS, STEPS, check=functools.partial(_check, name=name)
        )


def test_each_algorithm_sends_what_its_collective_or_graph_implies(tmp_path):
    run_on(4, _count_steps, str(tmp_path))
