"""The update rules of asynchronous SGD with momentum on a parameter server: DANA and its baselines.

Paper: Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed Asynchronous Environment"
(arXiv:1907.11612), Algs. 1-10. The master serves gradients in arrival order
(FIFO, App. A.1): worker i computes a gradient on the vector it was last sent, the master updates its own
parameters with it and replies with the vector worker i computes its next gradient on.

Every rule works on flat fp32 vectors (one per parameter set; per-worker state is an ``[N, k]``
tensor), so the real parameter server (``algorithms/parameter_server.py``) and the simulator
(``benchmarks/simulator.py``) call the very same code. A ``Master`` is:

- ``sent(i)``: what worker i computes its gradient on at the start (theta_0 for all);
- ``apply(i, payload, lr)``: one FIFO update with worker i's payload; returns what i is sent back;
- ``params``: the master's stored vector, the one evaluated (theta^0; Theta for DANA-Slim; our reading,
  the paper does not say which vector it evaluates);
- ``lookahead()``: the point the master's next gradient "should" be computed on (for the gap).

Only DANA-Slim has worker state: its momentum lives on the worker (``slim_payload``).
Weight decay is added at the worker, on the vector the gradient was computed on (our reading;
App. A.5 gives the decay, not where it is added).
"""

from __future__ import annotations

import torch
from torch import Tensor

RULES = ("asgd", "nag_asgd", "multi_asgd", "dc_asgd", "dana_zero", "dana_slim", "dana_dc")


def slim_payload(v: Tensor, g: Tensor, momentum: float) -> Tensor:
    """DANA-Slim's worker (Alg. 6): ``v <- m v + g`` in place; send ``m v + g`` (PyTorch's Nesterov step)."""
    v.mul_(momentum).add_(g)
    return g.add(v, alpha=momentum)


def delay_compensated(g: Tensor, drift: Tensor, lam: Tensor | float) -> Tensor:
    """DC-ASGD's first-order correction (Eq. 17): ``g + lam * g * g * drift``, element-wise.

    ``drift`` is how far the master moved since the gradient's point; the diagonal of the outer
    product ``g g^T`` stands in for the Hessian (Zheng et al. 2017).
    """
    return g + lam * g * g * drift


def gap(master: Tensor, sent: Tensor) -> float:
    """The gap (Sec. 3): RMS distance between the master's vector and the one a gradient was computed on."""
    return (master - sent).norm().item() / master.numel() ** 0.5


class Master:
    """Plain ASGD (Algs. 1-2): ``theta <- theta - lr * g``; reply with ``theta``.

    Args:
        theta: the initial flat parameter vector (copied).
        workers: number of workers N.
        momentum: the momentum coefficient gamma (the task's, 0.9 in the paper).
    """

    def __init__(self, theta: Tensor, workers: int, momentum: float) -> None:
        self.params = theta.detach().clone()
        self.workers, self.momentum = workers, momentum

    def sent(self, i: int) -> Tensor:
        return self.params.clone()

    def lookahead(self) -> Tensor:
        return self.params

    def apply(self, i: int, payload: Tensor, lr: float) -> Tensor:
        self.params.sub_(payload, alpha=lr)
        return self.params.clone()

    def end_epoch(self) -> None:
        """Once per epoch: repair accumulated floating-point drift of running sums."""

    def state_dict(self) -> dict[str, Tensor]:
        """Every tensor of the rule (parameters, momenta, shadows, mean squares) and the last lr."""
        state = {k: v for k, v in vars(self).items() if isinstance(v, Tensor)}
        if isinstance(getattr(self, "dc", None), DelayCompensation):
            state["mean_square"] = self.dc.mean_square
        if hasattr(self, "lr"):
            state["lr"] = torch.tensor(self.lr, dtype=torch.float64)
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for k, v in state.items():
            if k == "lr":
                self.lr = float(v)
            elif k == "mean_square":
                self.dc.mean_square.copy_(v)
            else:
                getattr(self, k).copy_(v)


class NagAsgd(Master):
    """NAG-ASGD (Alg. 8): one momentum vector shared by all workers.

    ``form="nesterov"`` (default) is PyTorch's Nesterov step, matching the paper's name ("a single NAG
    optimizer", Sec. 5) and footnote 1 (Sec. 3); ``form="heavy_ball"`` is Alg. 8 (App. A.1) as printed.
    """

    def __init__(self, theta: Tensor, workers: int, momentum: float, form: str = "nesterov") -> None:
        super().__init__(theta, workers, momentum)
        if form not in ("nesterov", "heavy_ball"):
            raise ValueError(f"Arg ``nag_form`` must be nesterov or heavy_ball, got {form!r}.")
        self.form = form
        self.v = torch.zeros_like(self.params)

    def apply(self, i: int, payload: Tensor, lr: float) -> Tensor:
        self.v.mul_(self.momentum).add_(payload)
        step = payload.add(self.v, alpha=self.momentum) if self.form == "nesterov" else self.v
        self.params.sub_(step, alpha=lr)
        return self.params.clone()


class MultiAsgd(Master):
    """Multi-ASGD (Alg. 9): one heavy-ball momentum per worker, no look-ahead.

    It must stay heavy-ball: a per-worker Nesterov step (Sec. 5's "separate NAG optimizer for each
    worker") would be DANA-Slim (Alg. 6) exactly.
    """

    def __init__(self, theta: Tensor, workers: int, momentum: float) -> None:
        super().__init__(theta, workers, momentum)
        self.v = torch.zeros(workers, theta.numel(), dtype=theta.dtype, device=theta.device)

    def apply(self, i: int, payload: Tensor, lr: float) -> Tensor:
        self.v[i].mul_(self.momentum).add_(payload)
        self.params.sub_(self.v[i], alpha=lr)
        return self.params.clone()


class DelayCompensation:
    """The DC term's lambda: DC-ASGD-a's adaptive ``lam0 / sqrt(MeanSquare + eps)`` with a per-worker
    mean square of the gradients (default; our reading of Sec. 5's "gamma = 0.95" and "lambda = 2" as
    DC-ASGD-a's decay and lam0), or the constant ``lam0`` (Algs. 7 and 10 as printed).
    """

    def __init__(self, like: Tensor, workers: int, lam0: float, mode: str, decay: float, eps: float) -> None:
        if mode not in ("adaptive", "constant"):
            raise ValueError(f"Arg ``dc_mode`` must be adaptive or constant, got {mode!r}.")
        self.lam0, self.mode, self.decay, self.eps = lam0, mode, decay, eps
        self.mean_square = torch.zeros(workers, like.numel(), dtype=like.dtype, device=like.device)

    def __call__(self, i: int, g: Tensor, drift: Tensor) -> Tensor:
        if self.mode == "constant":
            return delay_compensated(g, drift, self.lam0)
        ms = self.mean_square[i].mul_(self.decay).addcmul_(g, g, value=1 - self.decay)
        return delay_compensated(g, drift, self.lam0 / (ms + self.eps).sqrt())


class DcAsgd(MultiAsgd):
    """DC-ASGD (Alg. 10): per-worker momentum on delay-compensated gradients.

    The correction's anchor is theta^0 as last sent to worker i (the point its gradient was computed on).
    """

    def __init__(self, theta: Tensor, workers: int, momentum: float, dc: dict[str, object]) -> None:
        super().__init__(theta, workers, momentum)
        self.dc = DelayCompensation(theta, workers, **dc)
        self.shadow = self.params.repeat(workers, 1)

    def apply(self, i: int, payload: Tensor, lr: float) -> Tensor:
        g = self.dc(i, payload, self.params - self.shadow[i])
        self.v[i].mul_(self.momentum).add_(g)
        self.params.sub_(self.v[i], alpha=lr)
        self.shadow[i].copy_(self.params)
        return self.params.clone()


class DanaZero(MultiAsgd):
    """DANA-Zero (Alg. 4): per-worker momentum; reply with the look-ahead ``theta - lr m sum_j v_j``.

    The look-ahead estimates where the master will be after the next N updates, one per worker, so
    a gradient is computed about where it will be applied. ``v_sum`` is kept in O(k) per update
    (App. A.2) and recomputed exactly once per epoch.
    """

    def __init__(self, theta: Tensor, workers: int, momentum: float) -> None:
        super().__init__(theta, workers, momentum)
        self.v_sum = torch.zeros_like(self.params)
        self.lr = 0.0  # the lr of the last update: the look-ahead's horizon

    def lookahead(self) -> Tensor:
        return self.params - self.lr * self.momentum * self.v_sum

    def _momentum_step(self, i: int, g: Tensor, lr: float) -> Tensor:
        self.v_sum.sub_(self.v[i])
        self.v[i].mul_(self.momentum).add_(g)
        self.v_sum.add_(self.v[i])
        self.params.sub_(self.v[i], alpha=lr)
        self.lr = lr
        return self.lookahead()

    def apply(self, i: int, payload: Tensor, lr: float) -> Tensor:
        return self._momentum_step(i, payload, lr)

    def end_epoch(self) -> None:
        self.v_sum.copy_(self.v.sum(0))


class DanaDc(DanaZero):
    """DANA-DC (Alg. 7): DANA-Zero on delay-compensated gradients.

    ``anchor`` says which drift the DC term ``g + lam g*g*(theta^0 - theta^i)`` corrects (Sec. 4.3 says
    only "the previously sent parameters"):

    - ``sent`` (default): Alg. 7 as printed, theta^i the parameters previously sent to worker i, i.e.
      the look-ahead it computed its gradient on, against the master's current theta^0. The drift
      then also holds the look-ahead offset ``lr m sum_j v_j`` itself, so even one undelayed worker is
      corrected and DANA-DC with N = 1 is not exactly NAG.
    - ``lookahead``: the current look-ahead minus the look-ahead worker i computed on, i.e. only the
      movement caused by other workers' updates. With one worker this is zero, so DANA-DC is NAG like
      every DANA variant. Not the paper's formula.
    - ``master_at_send``: theta^0 minus theta^0 at the time of sending (DC-ASGD's anchor). Not the
      paper's formula either.
    """

    ANCHORS = ("sent", "lookahead", "master_at_send")

    def __init__(
        self, theta: Tensor, workers: int, momentum: float, dc: dict[str, object], anchor: str = "sent"
    ) -> None:
        super().__init__(theta, workers, momentum)
        if anchor not in self.ANCHORS:
            raise ValueError(f"Arg ``dc_anchor`` must be one of {self.ANCHORS}, got {anchor!r}.")
        self.dc, self.anchor = DelayCompensation(theta, workers, **dc), anchor
        self.shadow = self.params.repeat(workers, 1)

    def apply(self, i: int, payload: Tensor, lr: float) -> Tensor:
        now = self.lookahead() if self.anchor == "lookahead" else self.params
        g = self.dc(i, payload, now - self.shadow[i])
        sent = self._momentum_step(i, g, lr)
        self.shadow[i].copy_(self.params if self.anchor == "master_at_send" else sent)
        return sent


def make_master(
    rule: str,
    theta: Tensor,
    workers: int,
    momentum: float,
    *,
    nag_form: str = "nesterov",
    dc: dict[str, object] | None = None,
    dc_anchor: str = "sent",
) -> Master:
    """The master of ``rule`` (one of ``RULES``); DANA-Slim's master is plain ASGD's (Sec. 4.2)."""
    dc = dc or {"lam0": 2.0, "mode": "adaptive", "decay": 0.95, "eps": 1e-7}
    if rule in ("asgd", "dana_slim"):
        return Master(theta, workers, momentum)
    if rule == "nag_asgd":
        return NagAsgd(theta, workers, momentum, nag_form)
    if rule == "multi_asgd":
        return MultiAsgd(theta, workers, momentum)
    if rule == "dc_asgd":
        return DcAsgd(theta, workers, momentum, dc)
    if rule == "dana_zero":
        return DanaZero(theta, workers, momentum)
    if rule == "dana_dc":
        return DanaDc(theta, workers, momentum, dc, dc_anchor)
    raise ValueError(f"unknown rule {rule!r}; valid: {', '.join(RULES)}")
