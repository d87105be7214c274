"""Local SGD and post-local SGD: workers step alone and average their models every H steps."""

from __future__ import annotations

import torch
from torch import nn

from algorithms.base import Algorithm, Plan
from algorithms.comm import flat_average_
from algorithms.topology import Topology

MOMENTUM_MODES = ("local", "reset", "average")


def averages_at(step: int, period: int) -> bool:
    """Local SGD averages after every ``period``-th local step (steps counted from 0)."""
    return (step + 1) % period == 0


class LocalSGD(Algorithm):
    """Local SGD: ``period`` local optimizer steps, then a blocking all-reduce average of the models.

    Paper: Lin, Stich, Patel, Jaggi, "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020,
    https://arxiv.org/abs/1808.07217; the local-SGD baseline of WAGMA-SGD (arXiv:2005.00124, Secs. 2.2, 5.1).

    Communication falls by a factor H against per-step synchronisation, at the price of workers
    drifting apart in between. With ``period=1`` it is per-step model averaging, which WAGMA's paper
    uses as its main "local SGD" setting. The parameters are averaged after the local step; batch-norm
    buffers stay local; the evaluated model is the workers' average.

    Args:
        period: H, local steps between two global averages (default 10, WAGMA's local-SGD ablation
            value; 1 gives per-step model averaging).
        momentum_mode: what happens to the momentum buffers at an average: ``local`` keeps each
            worker's own (the papers' choice and default), ``reset`` zeroes them, ``average``
            averages them too (one more all-reduce of the same size).

    Example::

        algo = LocalSGD(topology, period=10)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    family = "periodic averaging"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py

    tracks_spread = True

    @classmethod
    def check(cls, knobs: dict[str, object], hparams: dict[str, object]) -> str | None:
        if hparams["optimizer"] != "sgd" and knobs.get("momentum_mode", "local") != "local":
            return (
                "--set momentum_mode: averaging or resetting momentum needs optimizer=sgd; "
                "with adam or adamw keep momentum_mode=local"
            )
        return None

    def __init__(self, topology: Topology, *, period: int = 10, momentum_mode: str = "local") -> None:
        super().__init__(topology)
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"Arg ``period`` must be a positive integer, got {period}.")
        if momentum_mode not in MOMENTUM_MODES:
            raise ValueError(f"Arg ``momentum_mode`` must be one of {MOMENTUM_MODES}, got {momentum_mode!r}.")
        self.period = period
        self.momentum_mode = momentum_mode

    def step(self) -> None:
        self.optimizer.step()
        if averages_at(self.step_count, self.period):
            self._average_models()
        self.step_count += 1

    def _average_models(self) -> None:
        params = [p.data for p in self.model.parameters()]
        momenta = [b for b in self._momentum_buffers()]
        start = self._timed_start()
        flat_average_(params + (momenta if self.momentum_mode == "average" else []))
        self._timed_stop(start)
        if self.momentum_mode == "reset":
            for buf in momenta:
                buf.zero_()

    def _momentum_buffers(self) -> list[torch.Tensor]:
        state = self.optimizer.state
        return [
            state[p]["momentum_buffer"]
            for p in self.model.parameters()
            if p in state and state[p].get("momentum_buffer") is not None
        ]

    def eval_model(self) -> nn.Module:
        return self.averaged_model()


class PostLocalSGD(LocalSGD):
    """Post-local SGD: synchronous data-parallel SGD until a switch point, then local SGD.

    Paper: Lin, Stich, Patel, Jaggi, "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020,
    https://arxiv.org/abs/1808.07217 (section 4); LPP-SGD's "PL-SGD" baseline (arXiv:2203.06638, Sec. 4).

    Before the switch the gradients are all-reduced every step (mini-batch SGD: all models equal);
    from the switch on each worker steps alone and the models are averaged every ``period`` steps.
    The schedule is that of PyTorch's ``PostLocalSGDOptimizer`` with ``PeriodicModelAverager`` and
    the ``post_localSGD_hook``: the first average falls on the first local step, then every H steps;
    a test checks that both give the same parameters. One knob sets the switch, so the hook's
    ``start_localSGD_iter`` and the averager's ``warmup_steps`` cannot disagree.

    Args:
        period: H, local steps between averages after the switch (default 16, as Lin et al. and
            LPP-SGD on CIFAR; LPP-SGD's ResNet-20 script uses 8).
        switch_epoch: epoch at which local SGD starts. -1 (default) switches at the first
            learning-rate decay (Lin et al.), or at half the epochs for schedules without decay
            milestones, reduce-on-plateau included (LPP-SGD's ``pre_post_epochs``, e.g. 150 of 300).
        momentum_mode: as for ``local_sgd`` (default ``local``).

    Example::

        algo = PostLocalSGD(topology, period=16)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    def __init__(
        self, topology: Topology, *, period: int = 16, switch_epoch: int = -1, momentum_mode: str = "local"
    ) -> None:
        super().__init__(topology, period=period, momentum_mode=momentum_mode)
        if not isinstance(switch_epoch, int) or switch_epoch < -1:
            raise ValueError(f"Arg ``switch_epoch`` must be -1 (first lr decay) or an epoch >= 0, got {switch_epoch}.")
        self.switch_epoch = switch_epoch
        self.switch_step = 0

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        epoch = self.switch_epoch
        if epoch == -1:
            epoch = min(plan.milestones) if plan.milestones else plan.epochs // 2
        self.switch_step = epoch * plan.steps_per_epoch
        return super().prepare(model, optimizer, plan)

    def step(self) -> None:
        s = self.step_count
        if s < self.switch_step:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            start = self._timed_start()
            flat_average_(grads)
            self._timed_stop(start)
            self.optimizer.step()
        else:
            self.optimizer.step()
            if (s - self.switch_step) % self.period == 0:
                self._average_models()
        self.step_count += 1

    columns = ("local",)  # 1 once it averages every H steps

    def metrics(self) -> dict[str, float]:
        return {"local": float(self.step_count >= self.switch_step)}
