"""Stochastic Gradient Push: push-sum gossip on a time-varying directed exponential graph."""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import nn

from algorithms import comm
from algorithms.base import Algorithm
from algorithms.comm import flatten, unflatten_into
from algorithms.topology import Topology, exponential_offsets, exponential_peers


def push_sum_share(x: torch.Tensor, w: float, num_peers: int) -> tuple[torch.Tensor, float]:
    """The part of (x, w) a worker keeps, equal to the part it sends to each of its k peers: 1/(k+1)."""
    return x / (num_peers + 1), w / (num_peers + 1)


def debias(x: torch.Tensor, w: float) -> torch.Tensor:
    """The de-biased model z = x / w that gradients are computed at and that converges to the mean."""
    return x / w


def push_sum_pair(x: torch.Tensor, w: float) -> torch.Tensor:
    """(x, w) as one vector, w last: one message instead of two. The weight is made on x's device and
    in its dtype, the model's: ``torch.cat`` takes tensors of one device only (CUDA's with NCCL)."""
    return torch.cat([x, x.new_tensor([w])])


def numerator_step(z_before: torch.Tensor, z_after: torch.Tensor, w: float) -> torch.Tensor:
    """The numerator after the local step: x = w z_before plus the optimizer's update z_after - z_before.

    SGP applies the update computed at z to the numerator (Algorithm 1: x <- x - lr grad F(z)), not
    w times it, so the de-biased network average sum(x)/sum(w) moves by the mean update however the
    weight is spread. Written as z_after + (w - 1) z_before, equal to w z_before + (z_after - z_before),
    so that with w = 1 (no overlap, P a power of two) the numerator is z_after to the last bit.
    """
    return z_after + (w - 1.0) * z_before


class SGP(Algorithm):
    """SGP: push-sum averaging with k rotating peers on a directed exponential graph, every step.

    Paper: Assran, Loizou, Ballas, Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
    ICML 2019, https://arxiv.org/abs/1811.10792.

    Each worker holds a push-sum numerator x and weight w; its model parameters hold the de-biased
    z = x / w, at which gradients are computed. The run's (momentum) optimizer steps z, and its update
    z_after - z_before is added to the numerator, x <- x + (z_after - z_before), as in the paper's
    Algorithm 1 (x <- x - lr grad F(z)) and the reference ``GossipDataParallel``, which turns the
    parameters back into numerators after the backward pass and before ``optimizer.step()``. Weight
    decay is thus taken at z here (the reference's is at x = w z). After the step the worker keeps
    1/(k+1) of (x, w) and pushes 1/(k+1) to each of its k out-peers, which rotate through the
    offsets 2^r every step; the sum of w over workers stays P and the de-biased average sum(x)/sum(w)
    is the true average. With ``overlap`` = tau > 0 the messages are sent without blocking and
    consumed tau steps later (overlap SGP); all messages in flight are consumed at each epoch end.
    The evaluated model is sum(x)/sum(w) over all workers.

    Args:
        num_peers: k, out-peers per step (default 1, SGP's default; WAGMA used 2 on ResNet-50 and 4
            on RL).
        overlap: tau, steps between sending a message and consuming it (default 0: blocking).
        segments: with ``overlap`` 0, the message goes in this many consecutive rounds, each waited
            for before the next (default 1), as the WAGMA paper's SGP sent ResNet-50's 161 tensors
            (``comm.exchange``): the same values, another timing.

    Example::

        algo = SGP(topology, num_peers=1)
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

    def __init__(self, topology: Topology, *, num_peers: int = 1, overlap: int = 0, segments: int = 1) -> None:
        super().__init__(topology)
        if not isinstance(segments, int) or segments < 1:
            raise ValueError(f"Arg ``segments`` must be a positive integer, got {segments}.")
        if segments > 1 and overlap > 0:
            raise ValueError("Arg ``segments`` above 1 needs ``overlap`` 0: overlapped messages are not waited for.")
        self.segments = segments
        if not isinstance(num_peers, int) or num_peers < 1:
            raise ValueError(f"Arg ``num_peers`` must be a positive integer, got {num_peers}.")
        if not isinstance(overlap, int) or overlap < 0:
            raise ValueError(f"Arg ``overlap`` must be a non-negative integer, got {overlap}.")
        distinct = len(exponential_offsets(topology.world_size))
        if topology.world_size > 1 and num_peers > distinct:
            raise ValueError(
                f"Arg ``num_peers`` must be at most {distinct} for {topology.world_size} workers "
                f"(the distinct offsets 1, 2, 4, ...), got {num_peers}."
            )
        self.num_peers = num_peers
        self.overlap = overlap
        self.weight = 1.0  # push-sum weight w
        self.in_flight: deque[tuple[int, list, list[torch.Tensor]]] = deque()

    def step(self) -> None:
        params = [p.data for p in self.model.parameters()]
        if self.topology.world_size == 1:
            self.optimizer.step()
        else:
            z_before = flatten(params)  # a copy: the optimizer steps the parameters in place
            self.optimizer.step()
            x = numerator_step(z_before, flatten(params), self.weight)
            start = self._timed_start()
            self._gossip(x, params)
            self._timed_stop(start)
        self.step_count += 1

    def _gossip(self, x: torch.Tensor, params: list[torch.Tensor]) -> None:
        kept, kept_w = push_sum_share(x, self.weight, self.num_peers)
        message = push_sum_pair(kept, kept_w)
        out_peers, in_peers = exponential_peers(
            self.topology.rank, self.topology.world_size, self.step_count, self.num_peers
        )
        buffers = [torch.empty_like(message) for _ in in_peers]
        if self.segments > 1:  # blocking, in rounds
            comm.exchange(message, out_peers, dict(zip(in_peers, buffers)), self.segments)
            self._set(message + torch.stack(buffers).sum(0), params)
            return
        ops = [dist.P2POp(dist.isend, message, j) for j in out_peers]
        ops += [dist.P2POp(dist.irecv, buf, j) for j, buf in zip(in_peers, buffers)]
        self.in_flight.append((self.step_count, comm.batch_isend_irecv(ops), buffers))
        state = message.clone()
        while self.in_flight and self.in_flight[0][0] <= self.step_count - self.overlap:
            state += self._consume()
        self._set(state, params)

    def _consume(self) -> torch.Tensor:
        """Wait for the oldest messages in flight and return their sum (numerator and weight)."""
        _, works, buffers = self.in_flight.popleft()
        for work in works:
            work.wait()
        return torch.stack(buffers).sum(0)

    def _set(self, state: torch.Tensor, params: list[torch.Tensor]) -> None:
        self.weight = state[-1].item()
        unflatten_into(debias(state[:-1], self.weight), params)

    def end_epoch(self, train_loss: float) -> None:
        if not self.in_flight:
            return
        params = [p.data for p in self.model.parameters()]
        state = push_sum_pair(flatten(params) * self.weight, self.weight)
        while self.in_flight:
            state += self._consume()
        self._set(state, params)

    def eval_model(self) -> nn.Module:
        """The network average sum_i x_i / sum_i w_i (messages in flight are not counted)."""
        model = self.averaged_model()  # buffers (batch-norm statistics) averaged as for the others
        params = [p.data for p in self.model.parameters()]
        total = push_sum_pair(flatten(params) * self.weight, self.weight)
        dist.all_reduce(total)
        with torch.no_grad():
            unflatten_into(debias(total[:-1], total[-1].item()), [p.data for p in model.parameters()])
        return model

    columns = ("ps_weight",)  # the push-sum weight w

    def metrics(self) -> dict[str, float]:
        return {"ps_weight": self.weight}

    def state_dict(self) -> dict[str, object]:
        """The push-sum weight w (the model holds z = x / w) and, with ``overlap``, the messages in
        flight: waited for here and stored as received, to be consumed at the same step as without
        the checkpoint."""
        in_flight = []
        for sent_at, works, buffers in self.in_flight:
            for work in works:
                work.wait()
            in_flight.append((sent_at, buffers))
        self.in_flight = deque((sent_at, [], buffers) for sent_at, buffers in in_flight)
        return {**super().state_dict(), "weight": self.weight, "in_flight": in_flight}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore w and the messages in flight, onto the parameters' device and dtype: a checkpoint is
        read onto the CPU, and the messages are added to the model's numerator on its device."""
        super().load_state_dict(state)
        self.weight = float(state["weight"])
        like = next(self.model.parameters())
        self.in_flight = deque(
            (int(sent_at), [], [b.to(like.device, like.dtype) for b in buffers])
            for sent_at, buffers in state["in_flight"]
        )
