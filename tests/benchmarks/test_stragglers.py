"""Straggler injection: exactly k distinct ranks per step, the same on every rank, and the delay."""

from __future__ import annotations

import time

import pytest

from benchmarks.stragglers import Stragglers


def test_fixed_picks_exactly_k_distinct_ranks_the_same_everywhere():
    views = [Stragglers("fixed", rank, range(64), ranks=2, delay_ms=320, seed=3) for rank in range(64)]
    for step in range(50):
        chosen = [tuple(v.delayed(step)) for v in views]
        assert len(set(chosen)) == 1 and len(set(chosen[0])) == 2
    counts = [sum(r in views[0].delayed(s) for s in range(3200)) for r in range(64)]
    assert min(counts) > 50 and max(counts) < 150  # about 2/64 of 3200 = 100 each


def test_a_delayed_rank_sleeps_and_none_never_does():
    s = Stragglers("fixed", 0, range(1), ranks=1, delay_ms=30)
    start = time.perf_counter()
    s.before_step(0)
    assert time.perf_counter() - start >= 0.03 and s.delayed_steps == 1
    assert Stragglers("none", 0, range(4)).delayed(7) == []
    with pytest.raises(ValueError, match="``straggler``"):
        Stragglers("lognormal", 0, range(4))


def test_slow_delays_the_same_last_workers_at_every_step():
    workers = [1, 2, 3]  # a parameter server's: rank 0 is the master
    views = [Stragglers("slow", rank, workers, ranks=2, delay_ms=20, seed=5) for rank in range(4)]
    assert all(v.delayed(step) == [2, 3] for v in views for step in range(100))
    start = time.perf_counter()
    views[3].before_step(0)
    views[1].before_step(1)
    assert time.perf_counter() - start >= 0.02 and views[3].delayed_steps == 1 and views[1].delayed_steps == 0
    with pytest.raises(ValueError, match="1..3"):
        Stragglers("slow", 1, workers, ranks=0)


def test_gamma_delays_are_drawn_alike_on_every_rank_and_slept_by_each():
    """Every rank holds the job's generator: the heterogeneous machine means agree without communication."""
    views = [Stragglers("gamma_het", r, range(4), delay_ms=5.0, seed=3) for r in range(4)]
    assert all((v.times.means == views[0].times.means).all() for v in views)
    assert len(set(views[0].times.means.tolist())) == 4  # each worker its own mean speed
    homogeneous = Stragglers("gamma", 1, range(4), delay_ms=10.0, seed=3)  # CV 0.1: each sleep is about 10 ms
    start = time.perf_counter()
    for step in range(4):
        homogeneous.before_step(step)
    assert time.perf_counter() - start >= 0.025 and homogeneous.delayed_steps == 4


def test_a_parameter_servers_master_is_never_drawn_and_exactly_k_workers_are():
    """With 1 master and 3 workers and 1 straggler, a worker (never rank 0) is delayed at every step."""
    import algorithms
    from algorithms.topology import Topology

    workers = algorithms.build("dana_slim", Topology(0, nodes=1, procs_per_node=4)).worker_ranks()
    assert list(workers) == [1, 2, 3]
    views = [Stragglers("fixed", rank, workers, ranks=1, delay_ms=5, seed=1) for rank in range(4)]
    for step in range(300):
        chosen = views[0].delayed(step)
        assert len(chosen) == 1 and chosen[0] in (1, 2, 3)
        assert sum(rank in v.delayed(step) for rank, v in enumerate(views)) == 1
    master = views[0]
    master.before_step(0)
    assert master.delayed_steps == 0  # the master never sleeps
    with pytest.raises(ValueError, match="1..3"):
        Stragglers("fixed", 1, workers, ranks=4)
    het = [Stragglers("gamma_het", r, workers, delay_ms=5.0, seed=3) for r in range(4)]
    assert len(het[1].times.means) == 3  # one mean speed per worker, none for the master
