"""Straggler injection, the same for every algorithm: some ranks sleep before a step's forward pass.

Kinds (the ``straggler`` setting):

- ``none``: nothing is injected.
- ``fixed``: WAGMA-SGD's imbalance (arXiv:2005.00124, Sec. 5.2). At every step exactly ``ranks``
  distinct workers sleep ``delay_ms``; they are drawn from a generator seeded by (seed, step), so every
  rank knows the same set without communicating (our reading of "randomly select two processes at
  every training step"). The paper delays 2 of 64 ranks by 320 ms.
- ``slow``: the last ``ranks`` workers sleep ``delay_ms`` before every step, for the whole run: a
  machine that is always slower (a failing node, a throttled GPU), the condition under which the
  wait-free algorithms should keep their rate and no algorithm may hang.
- ``gamma`` and ``gamma_het``: DANA's execution-time model (arXiv:1907.11612, App. A.4, Algs. 11-12,
  the CVB method of Ali et al. 2000). Every rank sleeps a gamma-distributed time of mean ``delay_ms``
  before each step.
  ``gamma`` is the homogeneous cluster: i.i.d. times with coefficient of variation 0.1.
  ``gamma_het`` is the heterogeneous cluster: each worker first draws its own mean speed from a gamma
  law with CV 0.6, then its per-batch times have CV 0.1 around it. The simulator draws its per-batch
  compute times from the same ``GammaTimes``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from algorithms import accelerator

KINDS = ("none", "fixed", "slow", "gamma", "gamma_het")
TASK_CV = 0.1  # V_task: per-batch variation on one machine (both environments)
MACHINE_CV = {"gamma": 0.1, "gamma_het": 0.6}  # V_mach: homogeneous, heterogeneous


class GammaTimes:
    """Per-batch execution times of ``workers`` workers under DANA's gamma model.

    The paper writes the mean as "B * V^2"; that is the gamma *scale*, with shape ``1/V^2``, so the
    mean is B (our reading of App. A.4, which Sec. 5's "mean execution time of B" supports): it gives
    the paper's straggler rates (P(t > 1.25 mean) = 0.93 % homogeneous, 27.86 % heterogeneous; App. A.4
    states 1 % and 27.9 %).

    Args:
        kind: ``gamma`` (homogeneous) or ``gamma_het`` (heterogeneous).
        workers: number of workers.
        mean: mean time of one batch (any unit; the simulator uses seconds).
        seed: seeds the generator; the times depend on nothing else, so every algorithm run with
            the same seed sees the same schedule.
    """

    def __init__(self, kind: str, workers: int, mean: float, seed: int) -> None:
        if kind not in MACHINE_CV:
            raise ValueError(f"Arg ``kind`` must be one of {tuple(MACHINE_CV)}, got {kind!r}.")
        self.rng = np.random.default_rng([seed, 0x5EED])
        shape = 1.0 / TASK_CV**2
        if kind == "gamma":  # every machine runs at the mean speed; batches vary by TASK_CV
            self.means = np.full(workers, float(mean))
        else:  # per-machine mean speed p_j ~ Gamma(1/V_mach^2, mean * V_mach^2), drawn once per run
            v = MACHINE_CV[kind]
            self.means = self.rng.gamma(1.0 / v**2, mean * v**2, size=workers)
        self.shape = shape

    def draw(self, worker: int) -> float:
        """The time of ``worker``'s next batch."""
        return float(self.rng.gamma(self.shape, self.means[worker] / self.shape))

    def draw_all(self) -> np.ndarray:
        """The times of every worker's next batch, in one draw (the virtual cluster's ranks each make
        the same draws from the same seed and read their own)."""
        return self.rng.gamma(self.shape, self.means / self.shape)

    def sample(self, worker: int, n: int) -> np.ndarray:
        """``n`` batch times of ``worker`` at once (for the tests' straggler rates)."""
        return self.rng.gamma(self.shape, self.means[worker] / self.shape, size=n)


class Stragglers:
    """Decides, per step, whether this rank is delayed, and sleeps if so.

    Only workers are delayed: a parameter server's master computes no gradient, so it is neither
    drawn nor slowed, and ``fixed`` delays exactly ``ranks`` workers at every step index (a worker's
    own step count where workers run at their own pace).

    Args:
        kind: one of ``KINDS``.
        rank: this rank.
        workers: the ranks that compute gradients (``Algorithm.worker_ranks()``).
        ranks: delayed workers per step (``fixed``), or slow workers (``slow``).
        delay_ms: the delay of each delayed worker (``fixed``, ``slow``) or the mean delay (``gamma*``), in ms.
        seed: the run's seed.
        device: the rank's device. On a GPU a delayed rank first lets its queued work finish: a
            sleep beside work the GPU had queued anyway would hide the delay.
        sleep: how a delayed rank waits (default: it sleeps; the virtual cluster's ranks advance
            their virtual clock).
    """

    def __init__(
        self,
        kind: str,
        rank: int,
        workers: Sequence[int],
        ranks: int = 1,
        delay_ms: float = 0.0,
        seed: int = 0,
        device: torch.device | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        workers = list(workers)
        if kind not in KINDS:
            raise ValueError(f"Arg ``straggler`` must be one of {KINDS}, got {kind!r}.")
        if kind in ("fixed", "slow") and not 0 < ranks <= len(workers):
            raise ValueError(f"Arg ``straggler_ranks`` must be in 1..{len(workers)} (the workers), got {ranks}.")
        if delay_ms < 0:
            raise ValueError(f"Arg ``straggler_delay_ms`` must be >= 0, got {delay_ms}.")
        self.kind, self.rank, self.workers = kind, rank, workers
        self.ranks, self.delay_s, self.seed = ranks, delay_ms / 1000.0, seed
        self.device, self.sleep = device, sleep
        self.delayed_steps = 0
        # gamma: one generator for the whole job (so the heterogeneous means are drawn once, alike on
        # every rank); each worker advances it identically and reads its own column.
        self.times = GammaTimes(kind, len(workers), self.delay_s, seed) if kind in MACHINE_CV else None

    def delayed(self, step: int) -> list[int]:
        """The workers delayed at ``step`` by ``fixed`` or ``slow`` (identical on every rank)."""
        if self.kind == "slow":
            return self.workers[-self.ranks :]
        if self.kind != "fixed":
            return []
        return random.Random(self.seed * 1_000_003 + step).sample(self.workers, self.ranks)

    def before_step(self, step: int) -> None:
        if self.rank not in self.workers:
            return
        if self.times is not None:
            delays = [self.times.draw(w) for w in range(len(self.workers))]
            self._sleep(delays[self.workers.index(self.rank)])
        elif self.rank in self.delayed(step):
            self._sleep(self.delay_s)

    def _sleep(self, seconds: float) -> None:
        self.delayed_steps += 1
        if self.sleep is not None:
            self.sleep(seconds)
            return
        if seconds > 0:
            accelerator.synchronize(self.device)
        time.sleep(seconds)
