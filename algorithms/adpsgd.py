"""AD-PSGD: asynchronous decentralised SGD, pairwise model averaging in a communication thread."""

from __future__ import annotations

import random

import torch
import torch.distributed as dist
from torch import nn

from algorithms import accelerator, comm
from algorithms.base import Algorithm, Plan
from algorithms.comm import flatten, unflatten_into
from algorithms.topology import Topology, bipartite_neighbours

_EXCHANGE, _DONE = 1.0, 0.0  # first element of every message


def pairwise_delta(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """What a worker adds to its model so that it becomes the pair's average: (theirs - mine) / 2.

    Both partners add their own delta, computed from the same two snapshots, so the sum of the two
    models is unchanged by the exchange.
    """
    return (theirs - mine) / 2


class ADPSGD(Algorithm):
    """AD-PSGD: each step computes locally while a thread averages the model with a random neighbour.

    Paper: Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient
    Descent", ICML 2018, https://arxiv.org/abs/1710.06952.

    Why: no worker ever waits for the slowest one; a straggler only slows its own exchanges. The
    workers form a bipartite graph (``algorithms.topology.bipartite_neighbours``): even ranks are
    active and start every exchange with a random odd neighbour, odd ranks are passive and serve
    whoever comes first (``recv`` from any source), so two workers never wait on each other.

    Mechanics, as the reference code: after each local step the main thread publishes a snapshot of
    its model and adds to it the averaging deltas the thread has collected meanwhile (the thread
    never writes the parameters, which autograd may be using); the thread exchanges the published
    model plus the deltas not yet applied (so two exchanges between steps do not count the same
    difference twice) and collects ``(theirs - mine) / 2``. Active workers start one exchange per
    local step, in the background of the next one, over a process group of their own. That group is
    gloo's, whose point-to-point takes CPU tensors only: the thread sends and receives host copies and
    computes on the model's device (it sets that device: the current device is per thread). Momentum
    stays local; the evaluated model is the average of all workers. If the thread fails, the next
    ``step()`` (or ``close()``) raises its error. Each rank draws its neighbours from a stream of its
    own, seeded by the run's seed (``plan.seed``).

    Example::

        algo = ADPSGD(topology)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
        algo.close()  # stops the communication thread
    """

    overlaps_comm = True  # the exchanges run in the thread, beside the computation
    columns = ("exchanges",)
    tracks_spread = True  # the replicas drift apart between exchanges, as for the other gossip methods
    family = "point-to-point"
    simulator = "virtual"
    calibration = "fit"  # tools/calibrate.py

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)
        self.neighbours = bipartite_neighbours(topology.rank, topology.world_size)
        self.active = topology.rank % 2 == 0
        # A passive worker serves until every active neighbour has said it is done.
        self.expected_done = sum(
            topology.rank in bipartite_neighbours(r, topology.world_size) for r in range(0, topology.world_size, 2)
        )
        self.lock = comm.threads().Lock()
        self.wake = comm.threads().Event()
        self.stopping = False
        self.exchanges = 0
        self.error: BaseException | None = None  # the thread's failure, raised by the main thread

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        super().prepare(model, optimizer, plan)
        self.rng = random.Random(plan.seed * 100_003 + self.topology.rank)
        self.params = [p.data for p in model.parameters()]
        self.published = flatten(self.params)
        self.pending = torch.zeros_like(self.published)
        self.group = dist.new_group(backend=comm.side_backend())  # the thread's own channel, beside the main one
        self.thread = None  # a comm.threads().Thread, started at the first step, after any resume
        return model

    def _start(self) -> None:
        """Start the gossip thread. Not in ``prepare()``: a resumed rank's thread would serve exchanges
        with the model and deltas of before ``load_state_dict``, which then overwrote what they added."""
        self.thread = comm.threads().Thread(target=self._gossip, name="adpsgd-gossip", daemon=True)
        self.thread.start()

    def step(self) -> None:
        self._check_thread()
        with self.lock:
            flat = flatten(self.params) + self.pending
            self.pending.zero_()
            unflatten_into(flat, self.params)
            # Published at once: until the optimizer's step is published below, an exchange must see
            # the deltas just applied, or the partners would average against a stale model.
            self.published = flat
        if self.thread is None:  # after the publish: its first exchange must see this model, not prepare()'s
            self._start()
        self.optimizer.step()
        with self.lock:
            self.published = flatten(self.params)
        self.step_count += 1
        self.wake.set()

    def _current(self) -> torch.Tensor:
        """This worker's model as of now: the last published one plus the deltas not yet applied."""
        with self.lock:
            return self.published + self.pending

    def _collect(self, snapshot: torch.Tensor, theirs: torch.Tensor) -> None:
        with self.lock:
            self.pending += pairwise_delta(snapshot, theirs)
            self.exchanges += 1

    def _check_thread(self) -> None:
        if self.error is not None:
            raise RuntimeError("AD-PSGD's gossip thread failed") from self.error

    def _gossip(self) -> None:
        """The thread: serve or start exchanges; a failure is kept for the main thread to raise."""
        try:
            accelerator.set_device(self.published.device)
            (self._active if self.active else self._passive)()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = error

    def _message(self, snapshot: torch.Tensor) -> torch.Tensor:
        """An exchange's message for gloo: the flag, then the model, on the host in the model's dtype."""
        return torch.cat([snapshot.new_tensor([_EXCHANGE]), snapshot]).cpu()

    def _active(self) -> None:
        buffer = torch.empty(self.published.numel() + 1, dtype=self.published.dtype)  # host, for gloo
        exchanged_after = 0  # the step count at the last exchange: one exchange per new step at most
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.step_count > exchanged_after:
                exchanged_after = self.step_count
                partner = self.rng.choice(self.neighbours)
                snapshot = self._current()
                comm.send(self._message(snapshot), dst=partner, group=self.group)
                dist.recv(buffer, src=partner, group=self.group)
                self._collect(snapshot, buffer[1:].to(snapshot.device))
            if self.stopping:
                break
        done = torch.zeros(self.published.numel() + 1, dtype=self.published.dtype)  # first element _DONE
        for partner in self.neighbours:
            comm.send(done, dst=partner, group=self.group)

    def _passive(self) -> None:
        buffer = torch.empty(self.published.numel() + 1, dtype=self.published.dtype)  # host, for gloo
        done = 0
        while done < self.expected_done:
            source = dist.recv(buffer, group=self.group)  # whichever active neighbour comes first
            if buffer[0].item() == _DONE:
                done += 1
                continue
            snapshot = self._current()
            comm.send(self._message(snapshot), dst=source, group=self.group)
            self._collect(snapshot, buffer[1:].to(snapshot.device))

    def close(self) -> None:
        """Let the active threads finish their exchange and tell their neighbours; wait for all."""
        self.stopping = True
        if self.thread is None:  # no step was run here: the thread still says DONE to its neighbours
            self._start()
        self.wake.set()
        self.thread.join()
        self._check_thread()
        with self.lock:
            unflatten_into(flatten(self.params) + self.pending, self.params)
            self.pending.zero_()

    def eval_model(self) -> nn.Module:
        return self.averaged_model()

    def metrics(self) -> dict[str, float]:
        return {"exchanges": float(self.exchanges)}

    def state_dict(self) -> dict[str, object]:
        """The averaging deltas collected but not yet applied, the neighbour draw and the exchange count.

        Taken while the thread runs: an exchange that completes after this snapshot counts on this
        worker only if the run is not resumed from here, so a resumed AD-PSGD run is a valid run but,
        being asynchronous, not the same one.
        """
        with self.lock:
            return {
                **super().state_dict(),
                "pending": self.pending.clone(),
                "rng": self.rng.getstate(),
                "exchanges": self.exchanges,
            }

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        with self.lock:
            self.pending.copy_(state["pending"])
            self.rng.setstate(state["rng"])
            self.exchanges = int(state["exchanges"])
            self.published = flatten(self.params)  # the restored model, for exchanges before the next step
