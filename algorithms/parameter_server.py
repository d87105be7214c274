"""Asynchronous SGD on a real parameter server: DANA-Zero/Slim/DC, ASGD, NAG-ASGD, Multi-ASGD, DC-ASGD.

Paper: Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed Asynchronous Environment"
(arXiv:1907.11612); spec ../shared/specs/dana.md, 8.4. Rank 0 is the master, ranks 1..N the
workers. A worker computes a gradient on the vector it was last sent, sends it and waits for the
reply (Alg. 1); the master takes messages from any worker in arrival order, applies the rule of
``algorithms/async_rules.py`` and replies to the sender only. Nobody waits for the slowest worker:
the price is staleness, which the master measures as the gap of every gradient.

Transport is ``torch.distributed`` point-to-point with an any-source receive, which gloo (and MPI)
support; NCCL has none, so on GPUs the messages go through gloo on host memory (the master's
update runs on the CPU; a GPU master would need a CUDA-aware MPI).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from algorithms import async_rules
from algorithms.base import Algorithm, Epoch, Plan
from algorithms.topology import Topology


def gradient_at(model: nn.Module, point: Tensor, task, x: Tensor, y: Tensor, weight_decay: float) -> tuple[Tensor, Tensor]:
    """The mini-batch gradient of ``task.loss`` at the flat vector ``point``, with L2 added (spec A-6).

    Returns ``(g, loss)``. The model's float buffers (batch-norm statistics) are updated by the forward
    pass, as at a worker (spec A-18).
    """
    params = list(model.parameters())
    with torch.no_grad():
        vector_to_parameters(point, params)
    for p in params:
        p.grad = None
    loss = task.loss(model(x), y)
    loss.backward()
    g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    if weight_decay:
        g.add_(point, alpha=weight_decay)
    return g, loss.detach()


class ParameterServer(Algorithm):
    """The parameter-server runner shared by the asynchronous family; subclasses fix ``RULE``.

    The master's rules are momentum SGD by construction (DANA's look-ahead is Nesterov's), so the
    family takes lr, momentum and weight decay from the run but no other optimizer (``sgd_only``).

    Args:
        nag_form: NAG-ASGD's master step, ``nesterov`` (default) or ``heavy_ball`` (Alg. 8 as printed).
        dc_lambda: lambda_0 of the delay compensation (2, as the paper).
        dc_mode: ``adaptive`` (DC-ASGD-a, default) or ``constant`` lambda.
        dc_decay: decay m of the gradients' mean square (0.95).
        dc_eps: epsilon inside the square root (1e-7).
        dc_anchor: DANA-DC's drift, ``lookahead`` (default), ``sent`` or ``master_at_send`` (spec A-8).

    Example::

        python -m benchmarks.run --algorithm dana_slim --task digits --nodes 1 --procs-per-node 4 \\
            --seed 0 --out results/runs/x     # 1 master + 3 workers

    The lr is the single-worker one (the paper does not scale it with N); the momentum and weight
    decay are the task's. The master evaluates its stored vector with the workers' mean batch-norm
    statistics.
    """

    RULE = "asgd"
    sgd_only = True
    owns_loop = True

    def __init__(self, topology: Topology, *, nag_form: str = "nesterov", dc_lambda: float = 2.0,
                 dc_mode: str = "adaptive", dc_decay: float = 0.95, dc_eps: float = 1e-7,
                 dc_anchor: str = "lookahead") -> None:
        super().__init__(topology)
        if topology.world_size < 2:
            raise ValueError("A parameter server needs at least 2 ranks (a master and a worker).")
        self.workers = topology.world_size - 1
        self.rule_knobs = {"nag_form": nag_form, "dc_anchor": dc_anchor,
                           "dc": {"lam0": dc_lambda, "mode": dc_mode, "decay": dc_decay, "eps": dc_eps}}
        self.master: async_rules.Master | None = None
        self.updates = 0  # master updates so far (the lr schedule's clock, spec A-12)
        self.gap_sum, self.lag_sum, self.count = 0.0, 0.0, 0

    @property
    def is_master(self) -> bool:
        return self.topology.rank == 0

    def data_shard(self) -> tuple[int, int]:
        return self.workers, max(0, self.topology.rank - 1)  # the master reads no batch

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        model = super().prepare(model, optimizer, plan)
        # Messages are flat CPU vectors with any-source receives: gloo's, also when the job runs on NCCL.
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        self.momentum = optimizer.defaults["momentum"]
        self.weight_decay = optimizer.defaults["weight_decay"]
        self.point = parameters_to_vector(model.parameters()).detach().cpu()  # a worker's current vector
        if self.is_master:
            self.master = async_rules.make_master(self.RULE, self.point, self.workers, self.momentum,
                                                  **self.rule_knobs)
            self.last_sent = self.point.repeat(self.workers, 1)  # what each worker computes on
            self.sent_at = [0] * self.workers
        elif self.RULE == "dana_slim":
            self.v = torch.zeros_like(self.point)
        return model

    def train_epoch(self, epoch: Epoch) -> tuple[Tensor | float, int]:
        if self.is_master:
            self._serve(epoch, self.workers * len(epoch.batches))
            return 0.0, 0
        return self._work(epoch)

    def _work(self, epoch: Epoch) -> tuple[Tensor, int]:
        loss_sum, batches = torch.zeros((), dtype=torch.float64), 0
        device = epoch.device
        message = torch.empty(self.point.numel() + 1)
        for x, y in epoch.batches:
            epoch.stragglers.before_step(epoch.step + batches)
            x, y = x.to(device), y.to(device)
            g, loss = gradient_at(self.model, self.point.to(device), epoch.task, x, y, self.weight_decay)
            g = g.cpu()
            payload = async_rules.slim_payload(self.v, g, self.momentum) if self.RULE == "dana_slim" else g
            message[:-1].copy_(payload)
            message[-1] = loss.item()
            start = self._timed_start()
            dist.send(message, dst=0, group=self.group)
            dist.recv(self.point, src=0, group=self.group)
            self._timed_stop(start)
            loss_sum += loss.item()
            batches += 1
            epoch.progress(1)
        return loss_sum, batches

    def _serve(self, epoch: Epoch, messages: int) -> None:
        """Serve ``messages`` gradients in arrival order, one reply each."""
        message = torch.empty(self.point.numel() + 1)
        lr0 = epoch.optimizer.defaults["lr"]
        for _ in range(messages):
            start = time.perf_counter()
            i = dist.recv(message, group=self.group) - 1  # any source: the first gradient to arrive is served first
            self.comm_s += time.perf_counter() - start
            g = message[:-1]
            self.gap_sum += async_rules.gap(self.master.params, self.last_sent[i])
            self.lag_sum += self.updates - self.sent_at[i]
            self.count += 1
            lr = lr0 * epoch.lr_factor(self.updates // self.workers)  # one worker step = N master updates
            reply = self.master.apply(i, g, lr)
            self.updates += 1
            self.last_sent[i].copy_(reply)
            self.sent_at[i] = self.updates
            dist.send(reply, dst=i + 1, group=self.group)
            if (self.updates % self.workers) == 0:
                epoch.progress(1)
        for group in epoch.optimizer.param_groups:
            group["lr"] = lr0 * epoch.lr_factor(self.updates // self.workers)
        self.master.end_epoch()

    def eval_model(self) -> nn.Module:
        """The master's stored vector (spec A-14) with the workers' mean batch-norm statistics."""
        vector = self.master.params.clone() if self.is_master else torch.empty_like(self.point)
        dist.broadcast(vector, src=0, group=self.group)
        with torch.no_grad():
            vector_to_parameters(vector.to(next(self.model.parameters()).device), self.model.parameters())
            for b in self.model.buffers():
                if b.is_floating_point():
                    if self.is_master:
                        b.zero_()
                    dist.all_reduce(b)
                    b.div_(self.workers)
        return self.model

    def metrics(self) -> dict[str, float]:
        """Mean gap and lag of the gradients served since the last evaluation (master only)."""
        row = {"gap": self.gap_sum / self.count if self.count else float("nan"),
               "lag": self.lag_sum / self.count if self.count else float("nan")}
        self.gap_sum, self.lag_sum, self.count = 0.0, 0.0, 0
        return row

    def state_dict(self) -> dict[str, object]:
        state = {**super().state_dict(), "updates": self.updates, "point": self.point}
        if self.master is not None:
            state.update(master=self.master.state_dict(), last_sent=self.last_sent, sent_at=list(self.sent_at))
        if self.RULE == "dana_slim" and not self.is_master:
            state["v"] = self.v
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.updates = int(state["updates"])
        self.point.copy_(state["point"])
        if self.master is not None:
            self.master.load_state_dict(state["master"])
            self.last_sent.copy_(state["last_sent"])
            self.sent_at = list(state["sent_at"])
        if "v" in state:
            self.v.copy_(state["v"])


class ASGD(ParameterServer):
    """ASGD: plain asynchronous SGD on a parameter server, no momentum (the gap analyses' reference)."""

    RULE = "asgd"


class NAGASGD(ParameterServer):
    """NAG-ASGD: asynchronous SGD with one Nesterov momentum at the master, shared by all workers."""

    RULE = "nag_asgd"


class MultiASGD(ParameterServer):
    """Multi-ASGD: asynchronous SGD with one heavy-ball momentum per worker at the master."""

    RULE = "multi_asgd"


class DCASGD(ParameterServer):
    """DC-ASGD: per-worker momentum on delay-compensated gradients (Zheng et al. 2017)."""

    RULE = "dc_asgd"


class DANAZero(ParameterServer):
    """DANA-Zero: per-worker momentum; workers compute on the master's estimated future position."""

    RULE = "dana_zero"


class DANASlim(ParameterServer):
    """DANA-Slim: DANA-Zero's look-ahead with the momentum kept on the workers (no master overhead)."""

    RULE = "dana_slim"


class DANADC(ParameterServer):
    """DANA-DC: DANA-Zero with delay-compensated gradients."""

    RULE = "dana_dc"
