"""Hogwild rules of LAP-SGD and LPP-SGD: the update rules as pure functions, and one updater's step
(``Updater``); how U updaters run, as processes or as the virtual cluster's threads, is
``algorithms/updaters.py``. The rules follow the LPP-SGD paper (arXiv:2203.06638) and,
where it is silent, its code (github.com/bapi/LPP-SGD, ``train/LPPSGD.py``): equal-parameter-count
contiguous blocks (the code's ``get_indices``; paper Sec. 3, Eq. 10), the per-updater full/partial
toggle after T_st (the code; Sec. 3, Block Selection Rule), the averaging period (Sec. 3,
Synchronization Frequency Scheme), the learning rate (Sec. 4, Hyperparameters; Table 13's caption),
Nesterov momentum with coupled weight decay (the code's ``opt``; the paper names neither), read&inc
after the gradient (the code; Algorithm 1 reads it first, line 2), and the averaging step
x += avg - snapshot (Algorithm 1, lines 13-16).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn


def contiguous_blocks(sizes: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Split a list of tensors (their ``numel``) into ``parts`` contiguous ``[start, stop)`` ranges.

    Blocks hold ``ceil(total / parts)`` coordinates each, and a tensor belongs to the block in which
    its first coordinate falls: the equal-parameter-count split of the official code
    (``get_indices`` in ``train/LPPSGD.py``, whose boundaries it reproduces; Sec. 3 of the paper
    only says the b_i should minimise the partial-backpropagation cost). Updater ``r`` owns block ``r``.
    """
    if parts < 1:
        raise ValueError(f"Arg ``parts`` must be a positive integer, got {parts}.")
    chunk = math.ceil(sum(sizes) / parts)
    starts = [0, *itertools.accumulate(sizes)][: len(sizes)]
    bounds = [sum(1 for s in starts if s < m * chunk) for m in range(parts)] + [len(sizes)]
    blocks = list(zip(bounds[:-1], bounds[1:]))
    if any(lo == hi for lo, hi in blocks):
        raise ValueError(
            f"Arg ``updaters`` ({parts}) leaves an empty block: a tensor of the model spans more "
            f"than 1/{parts} of its parameters; use fewer updaters."
        )
    return blocks


def warmed_up_lr(base_lr: float, batch_size: int, workers: int, base_batch: int, boost: float = 1.0) -> float:
    """alpha_w = base_lr x B_loc x Q / B_base (x 1.25 for LPP-SGD): the rate reached after warm-up (3.5).

    U does not enter: the updaters of one worker share its learning rate.
    """
    return base_lr * batch_size * workers / base_batch * boost


def lr_at(epoch: float, start_lr: float, peak_lr: float, warmup_epochs: int, epochs: int) -> float:
    """The rate at fractional epoch ``epoch``: linear warm-up, then cosine annealing to 0 (3.5).

    The cosine period is ``epochs + 0.1 - warmup_epochs`` as in the official code, so the last
    update still has a small positive rate.
    """
    if epoch < warmup_epochs:
        return start_lr + (peak_lr - start_lr) * epoch / warmup_epochs
    t_max = epochs + 0.1 - warmup_epochs
    return peak_lr * (1.0 + math.cos(math.pi * (epoch - warmup_epochs) / t_max)) / 2.0


def averaging_period(epoch: float, switch_epoch: int, period: int) -> int:
    """K: 1 (average as often as possible) before ``switch_epoch``, then H = ``period`` (3.4)."""
    return 1 if epoch < switch_epoch else period


def apply_average_(live: list[torch.Tensor], snapshot: torch.Tensor, average: torch.Tensor) -> None:
    """x += (average - snapshot), slice by slice, in place and without a lock (Algorithm 1, 15-16).

    Adding the difference instead of copying the average keeps what the updaters wrote into ``live``
    after the snapshot was taken.
    """
    delta = average - snapshot
    offset = 0
    for t in live:
        t.add_(delta[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def sgd_step_(
    params: list[torch.Tensor],
    grads: Sequence[torch.Tensor],
    bufs: list[torch.Tensor],
    started: torch.Tensor,
    lr: float,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
) -> None:
    """One SGD step of the official code's optimizer (3.6) on ``params``, in place.

    Coupled L2 weight decay on the live value, PyTorch's momentum (the buffer starts as the first
    direction, dampening 0), Nesterov if asked. ``started[i]`` tells whether ``bufs[i]`` holds a
    direction yet; the flags live beside the buffers so that they survive a checkpoint.
    """
    with torch.no_grad():
        for i, (p, g, buf) in enumerate(zip(params, grads, bufs)):
            d = g.add(p, alpha=weight_decay) if weight_decay else g
            if momentum:
                if started[i]:
                    buf.mul_(momentum).add_(d)
                else:
                    buf.copy_(d)
                    started[i] = True
                d = d.add(buf, alpha=momentum) if nesterov else buf
            p.add_(d, alpha=-lr)


@dataclass(frozen=True)
class Schedule:
    """What an updater needs to know of the run's schedule, counted in this worker's updates s.

    Args:
        steps_per_epoch: N_b, batches per epoch of one worker's shard (the epoch is e = s / N_b).
        epochs: E. start_lr, peak_lr, warmup_epochs: as ``lr_at``.
        partial_start_epoch: T_st in epochs for LPP-SGD (partial steps from there on); ``None``
            for LAP-SGD (full gradients always).
    """

    steps_per_epoch: int
    epochs: int
    start_lr: float
    peak_lr: float
    warmup_epochs: int
    partial_start_epoch: int | None

    def lr(self, s: int) -> float:
        return lr_at(s / self.steps_per_epoch, self.start_lr, self.peak_lr, self.warmup_epochs, self.epochs)

    def alternates(self, s: int) -> bool:
        """Whether the updater flips between full and partial steps after update ``s``."""
        return self.partial_start_epoch is not None and s / self.steps_per_epoch >= self.partial_start_epoch


class Updater:
    """One updater's step on the shared model: its block, its momentum buffers, its full/partial toggle.

    Args:
        model: the shared model (forward reads the live parameters: Hogwild's torn snapshot).
        block: ``[start, stop)`` of the tensors this updater owns for partial steps.
        bufs: one momentum buffer per parameter tensor; started: their flags (bool, one per tensor).
        toggle: one-element int tensor, 1 when the next step is partial (shared, for checkpoints).
        momentum, nesterov, weight_decay: the run's optimizer settings.
    """

    def __init__(
        self,
        model: nn.Module,
        block: tuple[int, int],
        bufs: list[torch.Tensor],
        started: torch.Tensor,
        toggle: torch.Tensor,
        momentum: float,
        nesterov: bool,
        weight_decay: float,
    ) -> None:
        self.model, self.params = model, list(model.parameters())
        self.block, self.bufs, self.started, self.toggle = block, bufs, started, toggle
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay

    def gradients(self, batch: tuple, loss_fn: Callable) -> tuple[float, tuple[int, int], tuple[torch.Tensor, ...]]:
        """The loss and the gradients w.r.t. the whole model or, on a partial step, only this
        updater's block: autograd then skips the other weight gradients (partial back-propagation)."""
        x, y = batch
        loss = loss_fn(self.model(x), y)
        lo, hi = self.block if int(self.toggle) else (0, len(self.params))
        return loss.item(), (lo, hi), torch.autograd.grad(loss, self.params[lo:hi])

    def apply(self, span: tuple[int, int], grads: Sequence[torch.Tensor], lr: float, alternate: bool) -> None:
        """Update the tensors of ``span`` (their momentum only), then flip the toggle if alternating."""
        lo, hi = span
        sgd_step_(
            self.params[lo:hi],
            grads,
            self.bufs[lo:hi],
            self.started[lo:hi],
            lr,
            self.momentum,
            self.nesterov,
            self.weight_decay,
        )
        if alternate:
            self.toggle.fill_(1 - int(self.toggle))

    def step(
        self,
        batch: tuple,
        loss_fn: Callable,
        schedule: Schedule,
        computed: Callable[[tuple[int, int]], None],
        read_and_increment: Callable[[], int],
        stats: torch.Tensor,
    ) -> None:
        """One update of Algorithm 1, the same for the processes and the virtual cluster's threads:
        the gradient; ``computed(span)`` once it is (a process frees its batch's slot, a thread is
        charged the compute on the virtual clock); read&inc after the gradient, as the official code
        (Algorithm 1 reads first, line 2); the update at that count's lr; this updater's ``stats`` row
        (loss sum, updates, partial updates)."""
        loss, span, grads = self.gradients(batch, loss_fn)
        computed(span)
        s = read_and_increment()
        self.apply(span, grads, schedule.lr(s), schedule.alternates(s))
        partial = span[1] - span[0] < len(self.params)
        stats += torch.tensor([loss, 1.0, float(partial)], dtype=torch.float64)
