"""WAGMA-SGD: wait-avoiding group model averaging, with a global average every tau iterations.

Wait-avoidance needs a collective that the first process to arrive can start for everyone. NCCL and
gloo collectives cannot be triggered that way, so each rank runs a progress thread that owns a gloo
process group of its own. A rank that reaches group iteration t before the round has started there
becomes an activator: it sends an activation message (the version t) to every other rank and asks
its own thread to run the round. A thread runs every version it has been activated for, in order,
as the butterfly group all-reduce of the paper (recursive doubling over the step's masks),
contributing whatever its send buffer holds at that moment: the latest locally updated model W'_s
(after the local step, before averaging), stale (s < t) if its main thread has not reached t yet. The
main thread refreshes the send buffer after every local step (Sec. 4, Fig. 3 text), global
iterations too (our reading), so a rank late just after a global average contributes its W' of that
iteration, not a model from before it. How close to the paper: the schedule, the group sums, the
stale rule and the version check are the paper's; the activation is a flat broadcast from the
activator (the paper forwards along a binomial tree), and progress is made by a thread polling gloo
rather than by fflib's offloaded schedules: one thread receives activations, one runs the rounds.
Gloo's point-to-point takes CPU tensors only, so with the model on a GPU the send buffer is a host
copy, made by the main thread after each local step, and the main thread copies a round's sum back to
the device: the threads never touch CUDA.
``mode="sync"`` runs the same group all-reduce from the main thread with fresh models only (the
paper's beta switch), for comparison.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import nn

from algorithms import comm
from algorithms.base import Algorithm, Plan
from algorithms.comm import flat_average_, flatten, unflatten_into
from algorithms.topology import Topology, wagma_phase_masks

_ACT, _DATA = 1, 2  # gloo tags: activations (any source) and butterfly data (point to point)
_STOP = -1.0


def group_average(group_sum: torch.Tensor, own: torch.Tensor, size: int, fresh: bool) -> torch.Tensor:
    """Algorithm 2, lines 10-13: W_sum / S if this rank's contribution was its current model, else
    (W_sum + W') / (S + 1), counting its own fresh model beside the stale one already in the sum."""
    return group_sum / size if fresh else (group_sum + own) / (size + 1)


def default_group_size(world_size: int) -> int:
    """S = sqrt(P), rounded down to a power of two where sqrt(P) is not one (our reading; Sec. 3.2
    assumes powers of two, Sec. 5.2 sets S = sqrt(P))."""
    return 1 << ((world_size.bit_length() - 1) // 2)


class WAGMA(Algorithm):
    """WAGMA-SGD: after each local step, average the model within a rotating group of S workers.

    Paper: Li, Ben-Nun, Nadiradze, Di Girolamo, Dryden, Alistarh, Hoefler, "Breaking (Global)
    Barriers in Parallel Stochastic Optimization With Wait-Avoiding Group Averaging", IEEE TPDS 32(7),
    2021, https://arxiv.org/abs/2005.00124.

    Why: a global all-reduce every step waits for the slowest worker. WAGMA averages within groups
    of S (default sqrt(P)) that change every iteration following a butterfly schedule, so a
    worker's update reaches all P workers within log_S(P) iterations, and the first worker to arrive
    starts the group round: late workers contribute their send buffer instead of being waited for,
    which holds their latest locally updated model (refreshed after every local step, global ones too).
    Every ``global_period`` (tau) iterations a blocking global average bounds the staleness. The local step
    comes first, then the averaging (Algorithm 2); momentum stays local; batch-norm buffers are not
    averaged; the evaluated model is the average of all workers.

    Args:
        group_size: S, a power of two dividing P (default 0: sqrt(P), rounded down to a power of two).
        global_period: tau, iterations between global averages; iterations t with (t + 1) mod tau = 0
            are global (default 10, the paper's ResNet-50 value; 8 for its Transformer and RL tasks).
        mode: ``wait_avoiding`` (default: the first to arrive triggers the round) or ``sync``
            (blocking group all-reduce with fresh models, the paper's beta = true).
        grouping: ``corrected`` (default: the reading that reproduces the paper's example) or
            ``printed`` (Algorithm 1 as printed, Sec. 3.2).

    Example::

        algo = WAGMA(topology, global_period=10)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
        algo.close()  # stops the progress thread

    Warning:
        P and S must be powers of two (the butterfly schedule). Every rank must run the same number
        of steps.
    """

    tracks_spread = True
    family = "point-to-point"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py

    def __init__(
        self,
        topology: Topology,
        *,
        group_size: int = 0,
        global_period: int = 10,
        mode: str = "wait_avoiding",
        grouping: str = "corrected",
    ) -> None:
        super().__init__(topology)
        p = topology.world_size
        if p & (p - 1):
            raise ValueError(f"WAGMA needs a power-of-two number of workers, got {p}.")
        s = group_size or default_group_size(p)
        if s & (s - 1) or not 1 <= s <= p:
            raise ValueError(f"Arg ``group_size`` must be a power of two in 1..{p}, got {group_size}.")
        if not isinstance(global_period, int) or global_period < 1:
            raise ValueError(f"Arg ``global_period`` must be a positive integer, got {global_period}.")
        if mode not in ("wait_avoiding", "sync"):
            raise ValueError(f"Arg ``mode`` must be 'wait_avoiding' or 'sync', got {mode!r}.")
        if grouping not in ("corrected", "printed"):
            raise ValueError(f"Arg ``grouping`` must be 'corrected' or 'printed', got {grouping!r}.")
        self.group_size, self.period, self.mode, self.printed = s, global_period, mode, grouping == "printed"
        self.cond = comm.threads().Condition()
        self.results: dict[int, tuple[torch.Tensor, int]] = {}
        self.requests: deque[int | None] = deque()
        self.next_version, self.started_version = 0, -1
        self.stale_rounds = self.rounds = 0
        self.error: BaseException | None = None
        self.sends: list = []

    def is_global(self, t: int) -> bool:
        return (t + 1) % self.period == 0

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        super().prepare(model, optimizer, plan)
        self.params = [p.data for p in model.parameters()]
        self.threaded = self.mode == "wait_avoiding" and self.topology.world_size > 1
        self.send_buf, self.send_iter = self._for_send(flatten(self.params)), -1
        if self.threaded:
            # Two channels of their own: activations (any source) and the rounds' data.
            self.act_group, self.group = (
                dist.new_group(backend=comm.side_backend()),
                dist.new_group(backend=comm.side_backend()),
            )
            self.threads = [
                comm.threads().Thread(target=target, name=f"wagma-{target.__name__}", daemon=True)
                for target in (self._listen, self._progress)
            ]
            for thread in self.threads:
                thread.start()
        return model

    def step(self) -> None:
        self.optimizer.step()  # W'_t = W_t + dW_t, then average (Algorithm 2's order)
        t, own = self.step_count, flatten(self.params)
        start = self._timed_start()  # the host copy of the send buffer is communication
        send_buf = self._for_send(own)
        with self.cond:
            # "The send buffer is updated by W'_t" at every iteration, global ones included
            # (Sec. 4, Fig. 3 text; the global iterations are our reading).
            # Before the global all-reduce: a peer leaving it first may start round t + 1 at once,
            # and this rank's thread must then contribute W'_t, not a model from before the sync.
            self.send_buf, self.send_iter = send_buf, t
        if self.is_global(t):
            flat_average_(self.params)
        elif self.topology.world_size > 1:
            group_sum, contributed = self._group_round(t, own)
            fresh = contributed == t
            self.rounds += 1
            self.stale_rounds += not fresh
            unflatten_into(group_average(group_sum, own, self._size(t), fresh), self.params)
        self._timed_stop(start)
        self.step_count += 1

    def _for_send(self, own: torch.Tensor) -> torch.Tensor:
        """The send buffer: for the progress thread's gloo groups a host copy (a new tensor each step,
        never written in place, as a round may be reading the previous one); ``own`` itself on the
        CPU, and in sync mode, where the main thread's group all-reduce takes the model's device."""
        return own.cpu() if self.threaded else own

    def _size(self, t: int) -> int:
        return 1 << len(wagma_phase_masks(self.topology.world_size, self.group_size, t, self.printed))

    def _group_round(self, t: int, own: torch.Tensor) -> tuple[torch.Tensor, int]:
        if self.mode == "sync":
            return self._butterfly(t, own), t
        with self.cond:  # step() has already published W'_t as the send buffer
            activate = self.started_version < t  # version check: nobody has started round t here yet
            if activate:
                self.requests.append(t)
                self.cond.notify_all()
        if activate:
            message = torch.tensor([float(t)], dtype=torch.float64)
            self.sends = [w for w in self.sends if not w.is_completed()]
            self.sends += [
                comm.isend(message, dst=j, group=self.act_group, tag=_ACT)
                for j in range(self.topology.world_size)
                if j != self.topology.rank
            ]
        with self.cond:
            while t not in self.results:
                if self.error is not None:
                    raise RuntimeError("WAGMA's progress thread failed") from self.error
                self.cond.wait(timeout=1.0)
            group_sum, contributed = self.results.pop(t)
        return group_sum.to(own.device), contributed  # the thread's sum is on the host

    def _butterfly(self, version: int, buffer: torch.Tensor) -> torch.Tensor:
        """Recursive doubling inside the version's groups: after log2(S) phases, the group's sum.

        ``buffer`` is only read (a send buffer is never written in place), so the first phase sends
        it as it is, and each phase adds into the tensor it has just received: no copy of the model
        beyond the messages themselves. With no phase (S = 1) the sum is ``buffer`` itself."""
        acc = buffer
        group = self.group if self.mode == "wait_avoiding" else None
        for mask in wagma_phase_masks(self.topology.world_size, self.group_size, version, self.printed):
            peer, incoming = self.topology.rank ^ mask, torch.empty_like(acc)
            # Both peers send and receive, posted as one group (ncclGroupStart/End under NCCL): NCCL's send
            # of a large message waits for the peer's receive, so two sends posted alone deadlock.
            works = comm.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, acc, peer, group, tag=_DATA),
                    dist.P2POp(dist.irecv, incoming, peer, group, tag=_DATA),
                ]
            )
            for work in works:
                work.wait()
            acc = incoming.add_(acc)
        return acc

    def _next_group_iteration(self, t: int) -> int:
        if self.period == 1:  # every iteration is global: no group rounds at all
            return 1 << 62
        while self.is_global(t):
            t += 1
        return t

    def _run_through(self, version: int) -> None:
        """Run every round up to ``version`` not yet run here, in order (the paper's version check)."""
        self.next_version = self._next_group_iteration(self.next_version)
        while self.next_version <= version:
            v = self.next_version
            with self.cond:
                self.started_version = v
                snapshot, contributed = self.send_buf, self.send_iter
            total = self._butterfly(v, snapshot)
            with self.cond:
                self.results[v] = (total, contributed)
                self.cond.notify_all()
            self.next_version = self._next_group_iteration(v + 1)

    def _listen(self) -> None:
        """Receive activations from any rank (blocking) and queue them, until the stop (``close``)."""
        try:
            while True:
                message = torch.zeros(1, dtype=torch.float64)
                dist.recv(message, group=self.act_group, tag=_ACT)  # from whichever rank comes first
                version = message.item()
                if version == _STOP:
                    break
                with self.cond:
                    self.requests.append(int(version))
                    self.cond.notify_all()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self._fail(error)
        with self.cond:
            self.requests.append(None)  # the executor's sentinel: nothing more can arrive
            self.cond.notify_all()

    def _progress(self) -> None:
        """Run the rounds asked for, by this rank's main thread or by other ranks' activations."""
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.requests)
                    version = self.requests.popleft()
                if version is None:
                    return
                self._run_through(version)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the listeners once no activation can come. Each rank waits for its own activations
        to be delivered, all meet at a barrier, then each stops the next rank's listener: one stop a
        rank. (A stop from every rank to every other is P^2 messages: a million at 1,024 ranks.)

        A delivered activation is already in its listener's hands: gloo sends nothing before the
        peer's receive is posted, and a listener posts one receive at a time; the virtual cluster's
        receive takes messages in the order they arrived. So the stop, sent after the barrier, is
        the last message each listener receives."""
        if not self.threaded:
            return
        for work in self.sends:
            work.wait()
        dist.barrier()
        rank, size = self.topology.rank, self.topology.world_size
        stop = comm.isend(
            torch.tensor([_STOP], dtype=torch.float64), dst=(rank + 1) % size, group=self.act_group, tag=_ACT
        )
        for thread in self.threads:
            thread.join()
        stop.wait()
        self.sends.clear()

    def eval_model(self) -> nn.Module:
        return self.averaged_model()

    columns = ("stale_share",)  # rounds in which this rank sent a stale buffer

    def metrics(self) -> dict[str, float]:
        """Share of this rank's group rounds in which it contributed a stale model."""
        return {"stale_share": self.stale_rounds / self.rounds if self.rounds else 0.0}

    def state_dict(self) -> dict[str, object]:
        """The round counters, the version check's state and the send buffer (W'_t of the last step,
        the model a late rank contributes next). Called when every rank has finished the same step,
        so no round is running."""
        with self.cond:
            return {
                **super().state_dict(),
                "rounds": self.rounds,
                "stale_rounds": self.stale_rounds,
                "next_version": self.next_version,
                "started_version": self.started_version,
                "send_buf": self.send_buf.clone(),
                "send_iter": self.send_iter,
            }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the counters and the send buffer, onto the live buffer's device (a checkpoint is read
        onto the CPU): the host for the progress thread, the model's device in sync mode."""
        super().load_state_dict(state)
        with self.cond:
            self.rounds, self.stale_rounds = int(state["rounds"]), int(state["stale_rounds"])
            self.next_version, self.started_version = int(state["next_version"]), int(state["started_version"])
            send_buf = state["send_buf"].to(self.send_buf.device, self.send_buf.dtype)
            self.send_buf, self.send_iter = send_buf, int(state["send_iter"])
