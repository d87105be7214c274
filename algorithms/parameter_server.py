"""Asynchronous SGD on a real parameter server: DANA-Zero/Slim/DC, ASGD, NAG-ASGD, Multi-ASGD, DC-ASGD.

Paper: Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed Asynchronous Environment"
(arXiv:1907.11612), Algs. 1-2, Sec. 5.5. Rank 0 is the master, ranks 1..N the workers. A worker
computes a gradient on the vector it was last sent, sends it and waits for the reply (Alg. 1); the
master takes messages from any worker in arrival order, applies the rule of
``algorithms/async_rules.py`` and replies to the sender only. Nobody waits for the slowest worker:
the price is staleness, which the master measures as the gap of every gradient.

Data and epochs, our reading (Sec. 5, App. A.5 leave both open): one shuffled stream feeds the workers in the
order they ask. The master deals out its positions with its replies (the next batch of the stream
goes to whichever worker the master answers next), and an epoch is M/B master updates from whichever
workers deliver them: a worker twice as fast contributes twice as many. Nobody waits at an epoch
boundary either: each worker runs its loop in a thread of its own from the first epoch to the last,
while its main thread joins the runner's epoch-end work (the job-wide loss, its slice of the
evaluation, the stop agreement, checkpoints). While the master evaluates, a worker's gradient waits
for its reply, for no longer than the evaluation takes.

Transport is ``torch.distributed`` point-to-point with an any-source receive on a gloo group of its
own (gloo and MPI have any-source receives; NCCL has none), so on GPUs the messages go through host
memory and the master's update runs on the CPU; a GPU master would need a CUDA-aware MPI.
"""

from __future__ import annotations

import copy
import threading
import time

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from algorithms import accelerator, async_rules, comm
from algorithms.base import Epoch, LoopAlgorithm, Plan
from algorithms.topology import Topology

STOP = -1.0  # in a reply's position slots: the run is over
_HALF = float(1 << 20)  # a stream position travels as two float32 numbers, each exact below 2^24


def gradient_at(
    model: nn.Module, point: Tensor, task, x: Tensor, y: Tensor, weight_decay: float
) -> tuple[Tensor, Tensor]:
    """The mini-batch gradient of ``task.loss`` at the flat vector ``point``, with L2 added (our reading:
    App. A.5 does not say where weight decay is added).

    Returns ``(g, loss)``. The model's float buffers (batch-norm statistics) are updated by the forward
    pass, as at a worker (our reading; the paper is silent on batch norm).
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


def stream_indices(samples: int, batch_size: int, seed: int, position: int) -> Tensor:
    """The sample indices of batch ``position`` of the one data stream (our reading; Sec. 5 leaves
    sampling open).

    The stream is one shuffled pass over the ``samples`` training samples after another, cut into
    ``samples // batch_size`` batches (the remainder dropped); pass ``e`` is shuffled by a generator
    seeded with ``seed + e``, as ``DistributedSampler`` does, so every rank knows every batch.
    """
    per_pass = samples // batch_size
    e, b = divmod(position, per_pass)
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + e))
    return order[b * batch_size : (b + 1) * batch_size]


def collate(dataset, indices: Tensor) -> tuple[object, object]:
    """The batch of ``dataset`` at ``indices`` (tensor datasets are indexed directly)."""
    if isinstance(dataset, torch.utils.data.TensorDataset):
        return tuple(t[indices] for t in dataset.tensors)
    items = [dataset[int(j)] for j in indices]
    return tuple(torch.utils.data.default_collate(list(col)) for col in zip(*items))


def _float_buffers(model: nn.Module) -> list[Tensor]:
    return [b for b in model.buffers() if b.is_floating_point()]


class ParameterServer(LoopAlgorithm):
    """The parameter-server runner shared by the asynchronous family; subclasses fix ``RULE``.

    The master's rules are momentum SGD by construction (DANA's look-ahead is Nesterov's), so the
    family takes lr, momentum and weight decay from the run but no other optimizer (``sgd_only``).

    Args:
        nag_form: NAG-ASGD's master step, ``nesterov`` (default) or ``heavy_ball`` (Alg. 8 as printed).
        dc_lambda: lambda_0 of the delay compensation (2, as the paper).
        dc_mode: ``adaptive`` (DC-ASGD-a, default) or ``constant`` lambda.
        dc_decay: decay m of the gradients' mean square (0.95).
        dc_eps: epsilon inside the square root (1e-7).
        dc_anchor: DANA-DC's drift, ``sent`` (default: Alg. 7 as printed, theta^0 minus the look-ahead
            sent), ``lookahead`` or ``master_at_send`` (Sec. 4.3: "the previously sent parameters").

    Example::

        python -m benchmarks.run --algorithm dana_slim --task digits --nodes 1 --procs-per-node 4 \\
            --seed 0 --out results/runs/x     # 1 master + 3 workers

    The lr is the single-worker one, applied to every master update (the paper does not scale it
    with N; ``scale_lr`` leaves it alone); its schedule runs on the master's update count, with the
    warm-up from lr / N. The momentum and weight decay are the task's. The master evaluates its
    stored vector (our reading; the paper does not say which) with the mean of the workers' latest
    batch-norm statistics, which travel with their gradients.

    ``metrics.csv`` columns: ``gap`` and ``lag`` (mean over the epoch's gradients), ``idle_s`` (the
    longest time one worker spent waiting for replies during the epoch, evaluation included) and
    ``max_share`` (the largest share of the epoch's updates delivered by one worker). Under the
    simulator, ``gap``, ``lag`` and ``sim_compute_s`` (the workers' simulated compute seconds so far):
    it models no worker's wait for replies, and its shares follow from the seed's schedule alone.
    """

    RULE = "asgd"
    worker_momentum = False  # the workers keep a momentum and send ``m v + g`` (``async_rules.slim_payload``)
    sgd_only = True
    averages_workers = False  # each worker's gradient is one update: the lr stays the single worker's
    family = "parameter server"
    simulator = "arrivals"  # the asynchronous workers' arrival order (benchmarks/simulator.py)
    simulated_stragglers = ("none", "gamma", "gamma_het")  # DANA's execution-time models: one time a batch
    columns = ("gap", "lag", "idle_s", "max_share")
    simulated_columns = ("gap", "lag", "sim_compute_s")  # its metrics.csv columns under the simulator
    # A worker's batch and its gradient: the simulator's logical workers compute theirs with the same.
    batch_at = staticmethod(collate)
    gradient_at = staticmethod(gradient_at)

    def __init__(
        self,
        topology: Topology,
        *,
        nag_form: str = "nesterov",
        dc_lambda: float = 2.0,
        dc_mode: str = "adaptive",
        dc_decay: float = 0.95,
        dc_eps: float = 1e-7,
        dc_anchor: str = "sent",
    ) -> None:
        super().__init__(topology)
        if topology.world_size < 2:
            raise ValueError("A parameter server needs at least 2 ranks (a master and a worker).")
        self.workers = topology.world_size - 1
        self.rule_knobs = {
            "nag_form": nag_form,
            "dc_anchor": dc_anchor,
            "dc": {"lam0": dc_lambda, "mode": dc_mode, "decay": dc_decay, "eps": dc_eps},
        }
        self.master: async_rules.Master | None = None
        self.updates = 0  # master updates so far (the lr schedule's clock; our reading, App. A.5)
        self.handed = 0  # positions of the data stream dealt out so far
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def is_master(self) -> bool:
        return self.topology.rank == 0

    @classmethod
    def worker_count(cls, world_size: int) -> int:
        return world_size - 1  # rank 0 is the master

    def worker_ranks(self) -> range:
        return range(1, self.topology.world_size)

    def data_shard(self) -> tuple[int, int]:
        return 1, 0  # one stream for the whole job; the master deals its batches out

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        model = super().prepare(model, optimizer, plan)
        # Two gloo groups of its own: the workers' threads' messages (any-source receives, CPU
        # vectors, also on NCCL jobs), and the main threads' collectives (evaluation, checkpoints).
        self.group, self.main_group = (
            dist.new_group(backend=comm.side_backend()),
            dist.new_group(backend=comm.side_backend()),
        )
        self.momentum = optimizer.defaults["momentum"]
        self.weight_decay = optimizer.defaults["weight_decay"]
        self.point = parameters_to_vector(model.parameters()).detach().cpu()  # a worker's current vector
        self.buffers = torch.cat(
            [b.detach().reshape(-1).float().cpu() for b in _float_buffers(model)] or [torch.zeros(0)]
        )
        self._eval_copy = copy.deepcopy(model)  # evaluated while the worker's thread trains ``model``
        k, n = self.point.numel(), self.workers
        self.message_size = k + 2 + self.buffers.numel()  # payload | loss, seconds waited | buffers
        if self.is_master:
            self.master = async_rules.make_master(self.RULE, self.point, n, self.momentum, **self.rule_knobs)
            self.last_sent = self.point.repeat(n, 1)  # what each worker computes on
            self.sent_at = [0] * n
            self.worker_buffers = self.buffers.repeat(n, 1)
            self.pending: list[tuple[int, Tensor]] = []  # received, not yet applied (held over a checkpoint)
            self.replies = [0] * n  # replies sent to each worker since this process started
            self.waited = [0.0] * n  # each worker's seconds waiting for replies, as reported with its gradients
            self._reset_epoch_stats()
        else:
            self.v = torch.zeros_like(self.point) if self.worker_momentum else None
            self.sent = 0  # messages this worker's thread has sent since this process started
            self.batches_done = 0  # this worker's batches so far (the straggler schedule's step)
        return model

    # --- the master -------------------------------------------------------------------------
    def train_epoch(self, epoch: Epoch) -> tuple[Tensor | float, int]:
        if not self.is_master:
            if self.thread is None:  # the worker's loop runs on, across epoch boundaries
                self.thread = threading.Thread(target=self._work, args=(epoch,), name="ps-worker", daemon=True)
                self.thread.start()
            self._check()
            return 0.0, 0
        return self._serve(epoch)

    def _serve(self, epoch: Epoch) -> tuple[float, int]:
        """Apply gradients in arrival order until this epoch's M/B updates are done."""
        lr0, per_epoch = epoch.optimizer.defaults["lr"], len(epoch.batches)
        first = self.updates  # an epoch starts where the last one ended, on a resume too
        end = first + per_epoch
        if self.handed == 0:  # the start: deal every worker its first batch, at theta_0
            for i in range(self.workers):
                self._reply(i, self.master.sent(i))
        message = torch.empty(self.message_size)
        loss_sum = 0.0
        while self.updates < end:
            if self.pending:  # gradients that arrived before a checkpoint come first, in their order
                i, message = self.pending.pop(0)
            else:
                start = time.perf_counter()
                i = dist.recv(message, group=self.group) - 1  # any source: the first to arrive is served first
                self.comm_s += time.perf_counter() - start
            loss_sum += self._apply(i, message, lr0 * epoch.lr_factor(self.updates))
            epoch.progress(1)
        for group in epoch.optimizer.param_groups:
            group["lr"] = lr0 * epoch.lr_factor(self.updates)
        self.master.end_epoch()
        return loss_sum, self.updates - first

    def _apply(self, i: int, message: Tensor, lr: float) -> float:
        k = self.point.numel()
        self.gap_sum += async_rules.gap(self.master.params, self.last_sent[i])
        self.lag_sum += self.updates - self.sent_at[i]
        self.count += 1
        self.delivered[i] += 1
        self.waited[i] += message[k + 1].item()
        self.worker_buffers[i].copy_(message[k + 2 :])
        reply = self.master.apply(i, message[:k], lr)
        self.updates += 1
        self.last_sent[i].copy_(reply)
        self.sent_at[i] = self.updates
        self._reply(i, reply)
        return message[k].item()

    def _reply(self, i: int, vector: Tensor, stop: bool = False) -> None:
        """Send worker ``i`` its next vector and the stream position of its next batch."""
        position = [STOP, STOP] if stop else divmod(float(self.handed), _HALF)
        comm.send(torch.cat([vector, torch.tensor(position)]), dst=i + 1, group=self.group)
        self.replies[i] += 1
        self.handed += not stop

    def _drain(self) -> None:
        """Receive the one gradient every worker still has on its way, and hold it unapplied."""
        if self.handed == 0:
            return
        held = {i for i, _ in self.pending}
        for _ in range(self.workers - len(held)):
            message = torch.empty(self.message_size)
            i = dist.recv(message, group=self.group) - 1
            self.pending.append((i, message))

    # --- a worker ---------------------------------------------------------------------------
    def _work(self, epoch: Epoch) -> None:
        """A worker's loop (Alg. 1): wait for a vector and a batch, compute the gradient there, send it."""
        try:
            accelerator.set_device(epoch.device)  # the current device is per thread: this one's is the rank's
            loader, k = epoch.batches, self.point.numel()
            seed = getattr(loader.sampler, "seed", 0)
            reply, message = torch.empty(k + 2), torch.empty(self.message_size)
            start = time.perf_counter()
            while True:
                dist.recv(reply, src=0, group=self.group)
                waited = time.perf_counter() - start  # since the gradient was done: sent, then answered
                self.comm_s += waited
                if reply[k].item() == STOP:
                    return
                self.point.copy_(reply[:k])
                position = int(reply[k].item() * _HALF + reply[k + 1].item())
                indices = stream_indices(len(loader.dataset), loader.batch_size, seed, position)
                x, y = collate(loader.dataset, indices)
                epoch.stragglers.before_step(self.batches_done)
                g, loss = gradient_at(
                    self.model,
                    self.point.to(epoch.device),
                    epoch.task,
                    x.to(epoch.device),
                    y.to(epoch.device),
                    self.weight_decay,
                )
                g = g.cpu()
                message[:k].copy_(async_rules.slim_payload(self.v, g, self.momentum) if self.v is not None else g)
                message[k] = loss.item()
                message[k + 1] = waited  # the master adds it up per worker
                if self.buffers.numel():
                    message[k + 2 :].copy_(
                        torch.cat([b.detach().reshape(-1).float().cpu() for b in _float_buffers(self.model)])
                    )
                start = time.perf_counter()
                comm.send(message, dst=0, group=self.group)  # gloo returns once the master takes it
                with self.cond:
                    self.batches_done += 1
                    self.sent += 1
                    self.cond.notify_all()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            with self.cond:
                self.error = error
                self.cond.notify_all()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError("the parameter-server worker's thread failed") from self.error

    def _quiet(self, replies: int) -> None:
        """Wait until this worker's thread has answered its ``replies`` replies: it then waits for the
        next one, which the master sends only after the checkpoint, so its state stands still."""
        with self.cond:
            while self.sent < replies and self.error is None:
                self.cond.wait(timeout=1.0)
        self._check()

    # --- both -------------------------------------------------------------------------------
    def eval_model(self) -> nn.Module:
        """The master's stored vector (our reading: the paper does not say which) with the mean of the
        workers' latest batch-norm statistics, in a copy of the model (a worker's thread is training
        the model itself)."""
        k = self.point.numel()
        state = torch.empty(k + self.buffers.numel())
        if self.is_master:
            state[:k].copy_(self.master.params)
            state[k:].copy_(self.worker_buffers.mean(0))
        dist.broadcast(state, src=0, group=self.main_group)
        model = self._eval_copy
        device = next(model.parameters()).device
        with torch.no_grad():
            vector_to_parameters(state[:k].to(device), model.parameters())
            offset = k
            for b in _float_buffers(model):
                b.copy_(state[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
        return model

    def _reset_epoch_stats(self) -> None:
        self.gap_sum, self.lag_sum, self.count = 0.0, 0.0, 0
        self.delivered = [0] * self.workers
        self.waited_before = list(getattr(self, "waited", [0.0] * self.workers))

    def metrics(self) -> dict[str, float]:
        """The master's numbers since the last evaluation (a worker returns NaN for each)."""
        if not self.is_master:
            return dict.fromkeys(("gap", "lag", "idle_s", "max_share"), float("nan"))
        row = {
            "gap": self.gap_sum / self.count if self.count else float("nan"),
            "lag": self.lag_sum / self.count if self.count else float("nan"),
            "idle_s": max(w - b for w, b in zip(self.waited, self.waited_before)),
            "max_share": max(self.delivered) / self.count if self.count else float("nan"),
        }
        self._reset_epoch_stats()
        return row

    def close(self) -> None:
        """The master takes the gradient each worker still has on its way and answers STOP."""
        if self.is_master:
            self._drain()
            for i in range(self.workers):
                self._reply(i, self.master.params, stop=True)
            self.pending.clear()
        elif self.thread is not None:
            self.thread.join()
            self._check()
        else:  # never started: take the master's STOP all the same
            dist.recv(torch.empty(self.point.numel() + 2), src=0, group=self.group)

    def state_dict(self) -> dict[str, object]:
        """At an epoch boundary, on every rank: the master takes the gradient every worker still has
        on its way and keeps it, unapplied, in its checkpoint; each worker waits until its thread has
        sent it, and saves the vector that gradient was computed on (and DANA-Slim's momentum)."""
        replies = torch.zeros(self.workers, dtype=torch.int64)
        if self.is_master:
            self._drain()
            replies += torch.tensor(self.replies)
        dist.broadcast(replies, src=0, group=self.main_group)
        state = {**super().state_dict(), "updates": self.updates, "handed": self.handed}
        if self.is_master:
            state.update(
                master=self.master.state_dict(),
                last_sent=self.last_sent.clone(),
                sent_at=list(self.sent_at),
                worker_buffers=self.worker_buffers.clone(),
                waited=list(self.waited),
                pending_from=[i for i, _ in self.pending],
                pending=torch.stack([m for _, m in self.pending]) if self.pending else torch.zeros(0),
            )
        else:
            self._quiet(int(replies[self.topology.rank - 1]))
            state.update(point=self.point.clone(), batches_done=self.batches_done)
            if self.v is not None:
                state["v"] = self.v.clone()
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        """A resumed worker's thread starts by waiting for the reply to the gradient the master holds."""
        super().load_state_dict(state)
        self.updates, self.handed = int(state["updates"]), int(state["handed"])
        if self.is_master:
            self.master.load_state_dict(state["master"])
            self.last_sent.copy_(state["last_sent"])
            self.sent_at = list(state["sent_at"])
            self.worker_buffers.copy_(state["worker_buffers"])
            self.waited = list(state["waited"])
            self.pending = [(int(i), m.clone()) for i, m in zip(state["pending_from"], state["pending"])]
            self._reset_epoch_stats()
        else:
            self.point.copy_(state["point"])
            self.batches_done = int(state["batches_done"])
            if self.v is not None:
                self.v.copy_(state["v"])


class ASGD(ParameterServer):
    """ASGD: plain asynchronous SGD on a parameter server, no momentum (the gap analyses' reference)."""

    RULE = "asgd"
    own_knobs = ()


class NAGASGD(ParameterServer):
    """NAG-ASGD: asynchronous SGD with one Nesterov momentum at the master, shared by all workers."""

    RULE = "nag_asgd"
    own_knobs = ("nag_form",)


class MultiASGD(ParameterServer):
    """Multi-ASGD: asynchronous SGD with one heavy-ball momentum per worker at the master."""

    RULE = "multi_asgd"
    own_knobs = ()


class DCASGD(ParameterServer):
    """DC-ASGD: per-worker momentum on delay-compensated gradients (Zheng et al. 2017)."""

    RULE = "dc_asgd"
    own_knobs = ("dc_lambda", "dc_mode", "dc_decay", "dc_eps")


class DANAZero(ParameterServer):
    """DANA-Zero: per-worker momentum; workers compute on the master's estimated future position."""

    RULE = "dana_zero"
    own_knobs = ()


class DANASlim(ParameterServer):
    """DANA-Slim: DANA-Zero's look-ahead with the momentum kept on the workers (no master overhead)."""

    RULE = "dana_slim"
    own_knobs = ()
    worker_momentum = True


class DANADC(ParameterServer):
    """DANA-DC: DANA-Zero with delay-compensated gradients."""

    RULE = "dana_dc"
    own_knobs = ("dc_lambda", "dc_mode", "dc_decay", "dc_eps", "dc_anchor")
