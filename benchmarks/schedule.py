"""The learning-rate schedule every algorithm of a run shares: a multiplier of the peak lr.

One object answers "what is the lr factor at global step t" for the runner's ``LambdaLR``, for the
parameter-server family (``Epoch.lr_factor``) and for the simulator, so that all of them follow the
same schedule. LAP-SGD and LPP-SGD are the exception: they apply their paper's own rule (warm-up,
then cosine; ``algorithms/hogwild.py:lr_at``) whatever the task's schedule. It starts with a linear warm-up from the single-worker lr (Goyal et al. 2017), then:

- ``constant``: 1;
- ``cosine``: half a cosine from 1 to 0 over the remaining steps;
- ``step``: ``gamma`` to the power of the ``milestones`` (epochs) passed;
- ``inverse_sqrt``: ``sqrt(W / t)`` after a warm-up of W steps, the Transformer's (Vaswani et al.
  2017; fairseq's ``inverse_sqrt``), so that the peak is reached at the end of the warm-up;
- ``plateau``: reduce-on-plateau, the DASO papers' schedule ("when the training loss plateaus ...
  the scheduler decreases the learning rate by a set factor"): after the warm-up, at the end of each
  epoch, PyTorch's ``ReduceLROnPlateau(mode="min", factor=gamma, patience=plateau_patience,
  threshold=plateau_threshold, threshold_mode="rel", min_lr=min_lr)`` reads the job-wide mean
  training loss. As in PyTorch, the lr drops on the ``patience + 1``-th consecutive epoch whose loss
  is not below ``best * (1 - threshold)``: our reading of the DASO papers' "stable for 5 epochs"
  (arXiv v1 Sec. 4.1; J. Big Data Table 1), as Heat's ``examples/nn/imagenet-DASO.py`` uses it.

Only ``plateau`` has state (the best loss, the count of bad epochs, the current factor); the runner
saves it in each checkpoint (``state_dict``).
"""

from __future__ import annotations

import math

import torch

SCHEDULES = ("constant", "cosine", "step", "plateau", "inverse_sqrt")


class LRSchedule:
    """Multiplier of the peak lr at each optimizer step: ``schedule(step) -> float``.

    Args:
        h: the run's hyper-parameters (``benchmarks.tasks.HPARAM_KEYS``).
        steps_per_epoch: optimizer steps per epoch on each worker.
        world_size: workers; the warm-up starts at ``1 / world_size`` of the peak.

    Example::

        schedule = LRSchedule(h, steps_per_epoch=len(loader), world_size=world)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule(step))
        ...  # each batch: optimizer.step(); scheduler.step()
        schedule.end_epoch(epoch, train_loss)  # once per epoch, the job-wide mean loss
    """

    def __init__(self, h: dict[str, object], steps_per_epoch: int, world_size: int) -> None:
        if h["schedule"] not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {h['schedule']!r}")
        self.kind = h["schedule"]
        self.steps_per_epoch = steps_per_epoch
        self.total = h["epochs"] * steps_per_epoch
        self.warmup_epochs = h["warmup_epochs"]
        self.warmup = h["warmup_epochs"] * steps_per_epoch
        self.start = 1.0 / world_size
        self.gamma, self.milestones = h["gamma"], list(h["milestones"])
        self._plateau = None
        if self.kind == "plateau":
            # PyTorch's scheduler, on a one-parameter stand-in whose lr is the multiplier: its rule
            # (relative threshold, patience, minimum) is used as is, not re-implemented here.
            self._proxy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
            self._plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self._proxy,
                mode="min",
                factor=h["gamma"],
                patience=h["plateau_patience"],
                threshold=h["plateau_threshold"],
                threshold_mode="rel",
                min_lr=min(1.0, h["min_lr"] / h["lr"]),
            )

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.start + (1.0 - self.start) * step / self.warmup
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * (step - self.warmup) / max(1, self.total - self.warmup)))
        if self.kind == "step":
            return self.gamma ** sum(step >= m * self.steps_per_epoch for m in self.milestones)
        if self.kind == "plateau":
            return self._proxy.param_groups[0]["lr"]
        if self.kind == "inverse_sqrt":
            return math.sqrt(max(1, self.warmup) / max(1, step))
        return 1.0

    def end_epoch(self, epoch: int, train_loss: float) -> bool:
        """Feed reduce-on-plateau the mean training loss of ``epoch`` (0-based) once it ends; True
        when the factor changed.

        Epochs of the warm-up are not fed: the loss falls fast there, and the schedule starts at
        the peak lr once the warm-up is over.
        """
        if self._plateau is None or epoch + 1 <= self.warmup_epochs or not math.isfinite(train_loss):
            return False
        before = self._proxy.param_groups[0]["lr"]
        self._plateau.step(train_loss)
        return self._proxy.param_groups[0]["lr"] != before

    def state_dict(self) -> dict[str, object]:
        if self._plateau is None:
            return {}
        return {"plateau": self._plateau.state_dict(), "factor": self._proxy.param_groups[0]["lr"]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        if self._plateau is not None and state:  # empty: a checkpoint of a schedule without state
            self._plateau.load_state_dict(state["plateau"])
            self._proxy.param_groups[0]["lr"] = state["factor"]


def make_optimizer(params, h: dict[str, object]) -> torch.optim.Optimizer:
    """The run's optimizer: SGD with momentum (the papers' image tasks), Adam (the Transformer's and
    DD-PPO's) or AdamW (decoupled weight decay: DiLoCo's inner optimizer); algorithms that average
    models or gradients apply it after their communication."""
    if h["optimizer"] in ("adam", "adamw"):
        adam = torch.optim.AdamW if h["optimizer"] == "adamw" else torch.optim.Adam
        return adam(params, lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"], weight_decay=h["weight_decay"])
    return torch.optim.SGD(
        params, lr=h["lr"], momentum=h["momentum"], nesterov=h["nesterov"], weight_decay=h["weight_decay"]
    )
