"""DiLoCo: local steps with the run's optimizer, then an outer Nesterov step on the averaged pseudo-gradient."""

from __future__ import annotations

import copy

import torch
from torch import nn

from algorithms.base import Algorithm, Plan
from algorithms.comm import flat_average_, flatten, unflatten_into
from algorithms.topology import Topology


class DiLoCo(Algorithm):
    """DiLoCo: ``inner_steps`` local steps, then an outer Nesterov step on the averaged pseudo-gradient.

    Paper: Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen, "DiLoCo:
    Distributed Low-Communication Training of Language Models", 2023, https://arxiv.org/abs/2311.08105,
    Algorithm 1.

    Every worker starts an outer round from the global parameters theta and takes H steps alone with
    the run's optimizer (the inner optimizer: the paper's is AdamW, ``--set optimizer=adamw``; its
    state stays each worker's own). Then the pseudo-gradient Delta = theta - mean_i(theta_i) is
    all-reduced, and the outer optimizer, SGD with Nesterov momentum (the paper's: lr 0.7,
    momentum 0.9), steps theta with Delta as its gradient; every worker restarts from the new theta.
    One all-reduce of the parameters every H steps. Batch-norm buffers stay local. The evaluated
    model is theta, the model DiLoCo delivers, with the workers' averaged buffers: between two outer
    steps it is the last global model. With H = 1, outer lr 1 and outer momentum 0 the outer step is
    the workers' average after one step each from the same point, which for SGD (momentum and weight
    decay included, both linear in the gradient) is all-reduce SGD's update: a test checks it.

    Args:
        inner_steps: H, local steps between two outer steps (the paper: 500).
        outer_lr: the outer optimizer's learning rate (the paper: 0.7).
        outer_momentum: its Nesterov momentum (the paper: 0.9; 0 gives plain SGD on Delta).

    Example::

        algo = DiLoCo(topology, inner_steps=500)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    family = "periodic averaging"
    simulator = "virtual"
    calibration = "test"  # tools/calibrate.py
    short_run_knobs = {"inner_steps": 8}  # outer steps (default: every 500th)
    tracks_spread = True

    def __init__(
        self, topology: Topology, *, inner_steps: int = 500, outer_lr: float = 0.7, outer_momentum: float = 0.9
    ) -> None:
        super().__init__(topology)
        if not isinstance(inner_steps, int) or inner_steps < 1:
            raise ValueError(f"Arg ``inner_steps`` must be a positive integer, got {inner_steps}.")
        if outer_lr <= 0:
            raise ValueError(f"Arg ``outer_lr`` must be positive, got {outer_lr}.")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"Arg ``outer_momentum`` must be in [0, 1), got {outer_momentum}.")
        self.inner_steps, self.outer_lr, self.outer_momentum = inner_steps, outer_lr, outer_momentum

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        model = super().prepare(model, optimizer, plan)  # every worker starts from rank 0's theta
        self.outer = [p.detach().clone() for p in model.parameters()]
        self.outer_optimizer = torch.optim.SGD(
            self.outer, lr=self.outer_lr, momentum=self.outer_momentum, nesterov=self.outer_momentum > 0
        )
        return model

    def step(self) -> None:
        self.optimizer.step()
        self.step_count += 1
        if self.step_count % self.inner_steps == 0:
            self.outer_step()

    @torch.no_grad()
    def outer_step(self) -> None:
        """Delta = theta - mean_i(theta_i) over one all-reduce; theta <- OuterNesterov(theta, Delta);
        every worker's parameters <- theta."""
        params = list(self.model.parameters())
        delta = flatten(self.outer) - flatten([p.detach() for p in params])
        start = self._timed_start()
        flat_average_([delta])
        self._timed_stop(start)
        for theta in self.outer:
            theta.grad = torch.empty_like(theta)
        unflatten_into(delta, [theta.grad for theta in self.outer])
        self.outer_optimizer.step()
        for p, theta in zip(params, self.outer):
            p.copy_(theta)

    def eval_model(self) -> nn.Module:
        evaluated = self.averaged_model()  # the workers' averaged buffers (a collective)
        with torch.no_grad():
            for p, theta in zip(evaluated.parameters(), self.outer):
                p.copy_(theta)
        return evaluated

    def state_dict(self) -> dict[str, object]:
        """theta and the outer optimizer's momentum (the inner optimizer is the runner's, saved by it)."""
        return {
            **super().state_dict(),
            "outer": [theta.detach().clone() for theta in self.outer],
            "outer_optimizer": copy.deepcopy(self.outer_optimizer.state_dict()),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            for theta, saved in zip(self.outer, state["outer"]):
                theta.copy_(saved)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
