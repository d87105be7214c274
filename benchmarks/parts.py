"""An epoch in parts: the run evaluates at the end of each part (``evals_per_epoch``), not only at the
epoch's end.

Time to target is read at evaluations, so the step between two of them bounds how finely it resolves
a difference: a run that reaches its target at its third evaluation is timed to a third of its time.
Every family is cut at the same batches: the stepped algorithms' loop, and the ``train_epoch`` of
those that own their loop, which gets one part at a time (a parameter server serves a part's
updates, LAP/LPP-SGD's updaters run a part's batches). What belongs to an epoch stays at its end:
``end_epoch`` hooks, the lr schedule's epoch decisions, the checkpoint of an owned loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def part_ends(steps_per_epoch: int, parts: int) -> list[int]:
    """The batch counts at which the ``parts`` parts of an epoch of ``steps_per_epoch`` end: as equal as
    whole batches allow, the last at the epoch's end; fewer parts where the epoch has fewer batches.

    >>> part_ends(22, 4)
    [6, 11, 16, 22]
    """
    parts = max(1, min(parts, steps_per_epoch))
    return sorted({round(steps_per_epoch * (i + 1) / parts) for i in range(parts)})


class EpochBatches:
    """One epoch's batches of ``loader``, handed out a part at a time from one iterator.

    The iterator is made at the first batch asked for, so that an algorithm that deals its own data
    (a parameter server's workers) never starts the loader's worker processes. ``part(n)`` is what an
    ``Epoch`` carries: ``len`` is the part's batches, and the loader's ``dataset``, ``sampler`` and
    ``batch_size`` read through it.
    """

    def __init__(self, loader: Any) -> None:
        self.loader, self._iterator = loader, None

    def part(self, n: int) -> Part:
        return Part(self, n)

    def start(self) -> None:
        """Make the loader's iterator now (it draws its workers' seeds), if it is not made yet."""
        if self._iterator is None:
            self._iterator = iter(self.loader)

    def next(self) -> Any:
        self.start()
        return next(self._iterator)


class Part:
    """``n`` batches of an epoch, in order; the loader's attributes read through."""

    def __init__(self, epoch: EpochBatches, n: int) -> None:
        self.epoch, self.n = epoch, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        self.epoch.start()  # where ``iter(loader)`` would have been
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        for _ in range(self.n):
            try:
                yield self.epoch.next()
            except StopIteration:  # the loader ran out (a resumed epoch's skipped batches): the part ends
                return

    def __getattr__(self, name: str) -> Any:
        return getattr(self.epoch.loader, name)
