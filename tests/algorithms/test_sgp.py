"""SGP's local step on the push-sum numerator, checked by hand and against a pure-Python push-sum.

Assran et al. 2019, Algorithm 1: the gradient is computed at the de-biased z = x / w and the step is
applied to the numerator, x <- x - lr grad F(z), not w times it. Without overlap and with P a power
of two w stays 1 and both readings agree; with ``overlap`` > 0 the weight varies, and only the
paper's rule moves the network average sum(x)/sum(w) by exactly the mean step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

import algorithms
from algorithms.sgp import SGP, numerator_step
from algorithms.topology import Topology
from tests.distributed import run_on

X0 = (1.0, 2.0, 3.0)
LR = 0.1
STEPS = 5


class Vector(nn.Module):
    """One parameter of 3 elements in float64 (so 1e-12 checks the rules, not the rounding).

    ``forward(a, b)`` is the loss (a w).sum() + (b w^2).sum() / 2, whose gradient is a + b w.
    """

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(X0, dtype=torch.float64))

    def forward(self, a: torch.Tensor, b: float = 0.0) -> torch.Tensor:
        return (a * self.w).sum() + 0.5 * b * (self.w * self.w).sum()


def _build(rank: int, world: int, overlap: int, num_peers: int, momentum: float = 0.0, segments: int = 1):
    model = Vector()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    topology = Topology(rank, nodes=world // 2, procs_per_node=2)
    algo = SGP(topology, num_peers=num_peers, overlap=overlap, segments=segments)
    algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=STEPS, epochs=1))
    return model, optimizer, algo


def _coefficients(rank: int, t: int) -> list[float]:
    """The linear loss's rank- and step-dependent constants a_i(t) = [i + 1, t + 1, i t]."""
    return [rank + 1.0, t + 1.0, float(rank * t)]


def test_numerator_step_adds_the_update_not_w_times_it():
    # x = w z = 0.5 x 2 = 1; the optimizer moves z from 2 to 1.5 (update -0.5): x becomes 1 - 0.5 = 0.5
    x = numerator_step(torch.tensor([2.0]), torch.tensor([1.5]), 0.5)
    assert torch.equal(x, torch.tensor([0.5]))
    assert torch.equal(numerator_step(torch.tensor([2.0]), torch.tensor([1.5]), 1.0), torch.tensor([1.5]))


# ---- 1. the network average moves by the mean step, with or without overlap ----------------------------


def _network_average(rank: int, world: int) -> None:
    for overlap, num_peers, segments in [(0, 1, 1), (1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (0, 2, 2)]:
        model, optimizer, algo = _build(rank, world, overlap, num_peers, segments=segments)
        for t in range(STEPS):
            optimizer.zero_grad()
            model(torch.tensor(_coefficients(rank, t), dtype=torch.float64)).backward()
            algo.step()
        algo.end_epoch(0.0)  # consumes every message in flight
        total = torch.cat([model.w.detach() * algo.weight, torch.tensor([algo.weight], dtype=torch.float64)])
        dist.all_reduce(total)
        # mean_i a_i(t) over 4 ranks = [2.5, t + 1, 1.5 t]; summed over t < 5: [12.5, 15, 15];
        # times lr 0.1: [1.25, 1.5, 1.5]; from X0 = [1, 2, 3]:
        expected = torch.tensor([-0.25, 0.5, 1.5], dtype=torch.float64)
        average = total[:-1] / total[-1]
        label = f"overlap={overlap} num_peers={num_peers} segments={segments}"
        assert abs(total[-1].item() - world) < 1e-12, (label, total[-1].item())
        assert torch.allclose(average, expected, rtol=0, atol=1e-6), (label, average.tolist())
        assert torch.allclose(algo.eval_model().w.data, expected, rtol=0, atol=1e-6), label


def test_overlap_sgp_network_average_moves_by_the_mean_step():
    run_on(4, _network_average)


# ---- 2. every rank's (x, w) after every step equals a pure-Python push-sum --------------------------------


def push_sum_reference(
    world: int, steps: int, overlap: int, num_peers: int, momentum: float, grad
) -> tuple[list, tuple]:
    """Algorithm 1 of the paper (overlap SGP: a message sent at step t is added at step t + overlap).

    Per step, on each worker i: g = grad(i, t, z) at z = x / w; the SGD-momentum step on the
    numerator, m <- momentum m + g (m = g at the first step, as torch's SGD), x <- x - lr m; keep
    1/(k+1) of (x, w) and send 1/(k+1) to each of i + 2^((t + j) mod R), j < k, R = ceil(log2 P);
    add every message sent at step <= t - overlap. Returns each step's ([x_i], [w_i]) and the state
    once every message has been added (the epoch's end).
    """
    offsets = [2**r for r in range(world) if 2**r < world]
    x = [list(X0) for _ in range(world)]
    w = [1.0] * world
    m: list[list[float] | None] = [None] * world
    mail: list[tuple[int, int, list[float], float]] = []  # (sent at, to, numerator, weight)

    def deliver(due) -> None:
        for message in [msg for msg in mail if due(msg[0])]:
            _, to, mx, mw = message
            x[to] = [a + b for a, b in zip(x[to], mx)]
            w[to] += mw
            mail.remove(message)

    history = []
    for t in range(steps):
        for i in range(world):
            g = grad(i, t, [a / w[i] for a in x[i]])
            m[i] = g if m[i] is None else [momentum * mi + gi for mi, gi in zip(m[i], g)]
            x[i] = [a - LR * mi for a, mi in zip(x[i], m[i])]
        for i in range(world):
            x[i] = [a / (num_peers + 1) for a in x[i]]
            w[i] /= num_peers + 1
            for j in range(num_peers):
                mail.append((t, (i + offsets[(t + j) % len(offsets)]) % world, list(x[i]), w[i]))
        deliver(lambda sent_at, t=t: sent_at <= t - overlap)
        history.append(([list(a) for a in x], list(w)))
    deliver(lambda sent_at: True)
    return history, ([list(a) for a in x], list(w))


def _close(a: list[float], b: list[float]) -> bool:
    return max(abs(u - v) for u, v in zip(a, b)) < 1e-12


def _curvature(rank: int) -> float:
    return 0.5 * (rank + 1)


def _against_reference(rank: int, world: int) -> None:
    def grad(i: int, t: int, z: list[float]) -> list[float]:
        return [a + _curvature(i) * zk for a, zk in zip(_coefficients(i, t), z)]

    for overlap, num_peers, momentum in [(1, 1, 0.0), (1, 2, 0.9), (2, 1, 0.9)]:
        steps = 6
        history, flushed = push_sum_reference(world, steps, overlap, num_peers, momentum, grad)
        model, optimizer, algo = _build(rank, world, overlap, num_peers, momentum)
        label = f"overlap={overlap} num_peers={num_peers} momentum={momentum}"
        for t in range(steps):
            optimizer.zero_grad()
            model(torch.tensor(_coefficients(rank, t), dtype=torch.float64), _curvature(rank)).backward()
            algo.step()
            xs, ws = history[t]
            numerator = (model.w.detach() * algo.weight).tolist()
            assert abs(algo.weight - ws[rank]) < 1e-12, (label, t, algo.weight, ws[rank])
            assert _close(numerator, xs[rank]), (label, t, numerator, xs[rank])
        algo.end_epoch(0.0)
        xs, ws = flushed
        assert abs(algo.weight - ws[rank]) < 1e-12, (label, "end", algo.weight, ws[rank])
        assert _close([z * algo.weight for z in model.w.tolist()], xs[rank]), (label, "end")


def test_overlap_sgp_matches_a_pure_python_push_sum_step_by_step():
    run_on(4, _against_reference)
