"""Straggler injection: exactly k distinct ranks per step, the same on every rank, and the delay."""

from __future__ import annotations

import time

import pytest

from benchmarks.stragglers import Stragglers


def test_fixed_picks_exactly_k_distinct_ranks_the_same_everywhere():
    views = [Stragglers("fixed", rank, 64, ranks=2, delay_ms=320, seed=3) for rank in range(64)]
    for step in range(50):
        chosen = [tuple(v.delayed(step)) for v in views]
        assert len(set(chosen)) == 1 and len(set(chosen[0])) == 2
    counts = [sum(r in views[0].delayed(s) for s in range(3200)) for r in range(64)]
    assert min(counts) > 50 and max(counts) < 150  # about 2/64 of 3200 = 100 each


def test_a_delayed_rank_sleeps_and_none_never_does():
    s = Stragglers("fixed", 0, 1, ranks=1, delay_ms=30)
    start = time.perf_counter()
    s.before_step(0)
    assert time.perf_counter() - start >= 0.03 and s.delayed_steps == 1
    assert Stragglers("none", 0, 4).delayed(7) == []
    with pytest.raises(ValueError, match="``straggler``"):
        Stragglers("lognormal", 0, 4)


def test_gamma_delays_are_drawn_alike_on_every_rank_and_slept_by_each():
    """Every rank holds the job's generator: the heterogeneous machine means agree without communication."""
    views = [Stragglers("gamma_het", r, 4, delay_ms=5.0, seed=3) for r in range(4)]
    assert all((v.times.means == views[0].times.means).all() for v in views)
    assert len(set(views[0].times.means.tolist())) == 4  # each worker its own mean speed
    homogeneous = Stragglers("gamma", 1, 4, delay_ms=10.0, seed=3)  # CV 0.1: each sleep is about 10 ms
    start = time.perf_counter()
    for step in range(4):
        homogeneous.before_step(step)
    assert time.perf_counter() - start >= 0.025 and homogeneous.delayed_steps == 4
