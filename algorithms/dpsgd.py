"""D-PSGD: synchronous decentralised SGD, each worker averaging with its graph neighbours every step."""

from __future__ import annotations

import torch
from torch import nn

from algorithms import comm
from algorithms.base import Algorithm
from algorithms.comm import flatten, unflatten_into
from algorithms.topology import Topology, mixing_matrix


def mix(
    own: torch.Tensor, neighbours: dict[int, torch.Tensor], weights: dict[int, float], self_weight: float
) -> torch.Tensor:
    """One gossip round: ``self_weight * own + sum_j weights[j] * neighbours[j]`` (a row of W times X)."""
    out = own * self_weight
    for j, x in neighbours.items():
        out.add_(x, alpha=weights[j])
    return out


class DPSGD(Algorithm):
    """D-PSGD: every step, average the model with the neighbours' (weights of W), then step locally.

    Paper: Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
    Centralized Algorithms?", NeurIPS 2017, https://arxiv.org/abs/1705.09056.

    The update is x_i <- sum_j W_ij x_j - lr * g_i, with the gradient g_i computed at the
    pre-mixing x_i and applied by the local (momentum) optimizer after the mixing, as WAGMA-SGD's
    D-PSGD baseline does (the authors' code, github.com/Shigangli/WAGMA-SGD,
    ``official/utils/optimizer_dpsgd_imagenet.py``; the paper's Sec. 2.2 gives only the ring). Each
    worker exchanges its whole model with its
    neighbours only, so the traffic per worker does not grow with the number of workers; the price
    is consensus that spreads only one hop per step. Because W is doubly stochastic, the mixing
    keeps the mean of the models. Momentum buffers stay local. The evaluated model is the average.

    Args:
        mixing: the mixing matrix W from ``algorithms.topology.mixing_matrix``: ``ring`` (default,
            neighbours i-1 and i+1, weight 1/3 each) or ``complete`` (plain average).
        segments: the model is exchanged in this many consecutive rounds, each waited for before
            the next (default 1: one message). The WAGMA paper's D-PSGD exchanged ResNet-50's 161
            tensors one by one (``comm.exchange``): the same values, but a delay spreads along the
            ring within a step instead of one hop per step.

    Example::

        algo = DPSGD(topology, mixing="ring")
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    family = "point-to-point"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py

    tracks_spread = True

    def __init__(self, topology: Topology, *, mixing: str = "ring", segments: int = 1) -> None:
        super().__init__(topology)
        if not isinstance(segments, int) or segments < 1:
            raise ValueError(f"Arg ``segments`` must be a positive integer, got {segments}.")
        self.segments = segments
        row = mixing_matrix(mixing, topology.world_size)[topology.rank]
        self.mixing = mixing
        self.self_weight = row[topology.rank]
        self.weights = {j: w for j, w in enumerate(row) if w > 0 and j != topology.rank}

    def step(self) -> None:
        params = [p.data for p in self.model.parameters()]
        start = self._timed_start()
        mixed = mix(*self.exchange(params), self.weights, self.self_weight)
        self._timed_stop(start)
        unflatten_into(mixed, params)
        self.optimizer.step()
        self.step_count += 1

    def exchange(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Send the flat model to every neighbour and receive theirs (W is symmetric)."""
        own = flatten(tensors)
        received = {j: torch.empty_like(own) for j in self.weights}
        comm.exchange(own, list(self.weights), received, self.segments)
        return own, received

    def eval_model(self) -> nn.Module:
        return self.averaged_model()
