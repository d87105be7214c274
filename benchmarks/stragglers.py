"""Straggler injection, the same for every algorithm: some ranks sleep before a step's forward pass.

``fixed`` is WAGMA-SGD's imbalance (spec wagma.md, 4.3): at every step exactly ``ranks`` distinct
ranks, drawn from a generator seeded by (seed, step) and so the same on every rank without any
communication, sleep ``delay_ms`` (the paper: 2 of 64 ranks, 320 ms). ``none`` injects nothing.
"""

from __future__ import annotations

import random
import time

KINDS = ("none", "fixed")


class Stragglers:
    """Decides, per step, whether this rank is delayed, and sleeps if so.

    Args:
        kind: ``none`` or ``fixed``.
        rank: this rank; world_size: the number of ranks.
        ranks: delayed ranks per step (``fixed``).
        delay_ms: the delay of each delayed rank, in milliseconds (``fixed``).
        seed: the run's seed.
    """

    def __init__(self, kind: str, rank: int, world_size: int, ranks: int = 1, delay_ms: float = 0.0,
                 seed: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"Arg ``straggler`` must be one of {KINDS}, got {kind!r}.")
        if kind == "fixed" and not 0 < ranks <= world_size:
            raise ValueError(f"Arg ``straggler_ranks`` must be in 1..{world_size}, got {ranks}.")
        if delay_ms < 0:
            raise ValueError(f"Arg ``straggler_delay_ms`` must be >= 0, got {delay_ms}.")
        self.kind, self.rank, self.world_size = kind, rank, world_size
        self.ranks, self.delay_s, self.seed = ranks, delay_ms / 1000.0, seed
        self.delayed_steps = 0

    def delayed(self, step: int) -> list[int]:
        """The ranks delayed at ``step`` (identical on every rank)."""
        if self.kind == "none":
            return []
        return random.Random(self.seed * 1_000_003 + step).sample(range(self.world_size), self.ranks)

    def before_step(self, step: int) -> None:
        if self.kind != "none" and self.rank in self.delayed(step):
            self.delayed_steps += 1
            time.sleep(self.delay_s)
