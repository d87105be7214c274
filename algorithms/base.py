"""The interface of every algorithm, and the two ways one plugs into the runner.

An algorithm owns only the update: data, model, loss, evaluation and the clock belong to the runner.
The runner calls ``prepare(model, optimizer, plan)`` once, ``end_epoch(train_loss)`` once per
epoch for schedule logic, ``eval_model()`` for the model to evaluate, ``metrics()`` once per
evaluation for its own ``columns``, and ``state_dict()`` to checkpoint. Then either:

1. **Stepped** (subclass ``Algorithm``, implement ``step``): the runner runs each batch's forward
   and backward and calls ``step()``, which communicates and applies the optimizer::

       class MeanGradients(Algorithm):  # all-reduce SGD: average the gradients, then step
           def step(self) -> None:
               grads = [p.grad for p in self.model.parameters()]
               flat_average_(grads)
               self.optimizer.step()

2. **Owning the loop** (subclass ``LoopAlgorithm``, implement ``train_epoch``): the asynchronous
   family (a parameter server, Hogwild updaters) cannot be driven one synchronous step at a time,
   so it runs each epoch's batches itself; sharding, evaluation, metrics and the clock stay with the
   runner, at epoch boundaries::

       class Alone(LoopAlgorithm):  # each rank trains on its own; the average is evaluated
           def train_epoch(self, epoch: Epoch) -> tuple[float, int]:
               total, n = 0.0, 0
               for x, y in epoch.batches:
                   self.optimizer.zero_grad()
                   loss = epoch.task.loss(self.model(x.to(epoch.device)), y.to(epoch.device))
                   loss.backward()
                   self.optimizer.step()
                   total, n = total + loss.item(), n + 1
                   epoch.progress(1)
               return total, n

An algorithm is registered by one line in ``algorithms/__init__.py`` (or ``algorithms.register``);
its knobs are its constructor's keyword-only arguments.

Checkpoint contract (``benchmarks/checkpoint.py`` saves one shard per rank; ``run.py`` drives it):

- ``state_dict()`` returns a flat dict of what resuming this rank needs beyond the model and the
  optimizer (which the runner saves itself): counters, Python scalars, strings, tuples and tensors
  only (the shard is read with ``torch.load(weights_only=True)``), never a process group, thread,
  lock or work handle. Subclasses extend the base dict: ``{**super().state_dict(), "weight": w}``.
- It may be called after any ``step()`` (a stop signal arrives anywhere in an epoch), on every rank
  at the same step; communication still in flight must be waited for and its result stored, so the
  checkpoint is whole. It is called before ``close()`` at a stop, so background threads are running.
- ``load_state_dict(state)`` is called on every rank after ``prepare()`` and after the model and
  optimizer have been restored, with the dict that rank saved. It calls
  ``super().load_state_dict(state)``. A missing key is a ``KeyError`` (a silent reset would bias the
  result), unless a reset is harmless, which the method then says with a warning.
- ``LoopAlgorithm``s are checkpointed at epoch boundaries only, after ``train_epoch``.
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.distributed as dist
from torch import nn

from algorithms import accelerator
from algorithms.comm import broadcast_, flat_average_
from algorithms.topology import Topology


@dataclass(frozen=True)
class Plan:
    """What an algorithm may know of the training schedule (phases, switch points, averaging periods).

    Args:
        steps_per_epoch: optimizer steps per epoch on each worker.
        epochs: epochs of the run.
        milestones: epochs at which the learning rate decays (empty for smooth schedules).
        warmup_epochs: epochs of the task's linear lr warm-up (for algorithms with their own lr rule).
        seed: the run's seed, for an algorithm's own random choices (AD-PSGD's neighbours).
    """

    steps_per_epoch: int
    epochs: int
    milestones: tuple[int, ...] = ()
    warmup_epochs: float = 0
    seed: int = 0


class Task(Protocol):
    """What an algorithm may ask of the workload: the training loss of a batch."""

    def loss(self, output: Any, target: Any) -> torch.Tensor: ...


class StragglerDelay(Protocol):
    """The run's straggler model: sleeps before a batch as a slow worker would take longer."""

    def before_step(self, step: int) -> None: ...


@dataclass
class Epoch:
    """One epoch's work handed to an algorithm that owns its loop.

    Args:
        epoch: index of the epoch (0-based).
        batches: this rank's ``(x, y)`` batches for the epoch (already sharded by ``data_shard()``): a
            ``DataLoader`` in a run, whose dataset, sampler seed and batch size a parameter server
            reads to deal out its one stream.
        task: the workload (``task.loss(model(x), y)`` is the training loss).
        optimizer: the run's optimizer; its ``defaults`` hold lr, momentum and weight decay.
        lr_factor: multiplier of the peak lr at a global step (warm-up and schedule).
        step: steps per worker done before this epoch.
        stragglers: call ``stragglers.before_step(step)`` before each batch.
        device: where the model lives.
        progress: call ``progress(n)`` after ``n`` batches, for the progress bar.
    """

    epoch: int
    batches: Iterable[tuple[Any, Any]]
    task: Task
    optimizer: torch.optim.Optimizer
    lr_factor: Callable[[int], float]
    step: int
    stragglers: StragglerDelay
    device: torch.device
    progress: Callable[[int], object]


class Algorithm(abc.ABC):
    """A stepped algorithm: subclasses implement ``step`` and may override the other hooks.

    Args:
        topology: this rank's position; the constructor's keyword-only arguments are the knobs.
    """

    overlaps_comm: ClassVar[bool] = False  # communication hides inside backward and cannot be timed apart
    broadcast_start: ClassVar[bool] = True  # start from rank 0's parameters (False where the wrapper does it)
    owns_loop: ClassVar[bool] = False  # the runner calls ``train_epoch`` (``LoopAlgorithm``) instead of ``step``
    tracks_spread: ClassVar[bool] = False  # models differ between syncs; the runner logs ``model_spread()``
    sgd_only: ClassVar[bool] = False  # it applies its own SGD-momentum rule, not the run's optimizer
    # Where sibling classes share one constructor (the parameter-server family), the knobs this one
    # reads: the others are not offered for it (``algorithms.params``). None: every keyword argument.
    own_knobs: ClassVar[tuple[str, ...] | None] = None
    # Whether one update averages every worker's batch (``scale_lr``'s linear rule multiplies the lr by
    # the world size); False where each worker's gradient is an update of its own (a parameter server).
    averages_workers: ClassVar[bool] = True
    # What runs it under ``--set clock=simulated``: "virtual" (the runner's loop, this class's own code,
    # on the virtual cluster's ranks: benchmarks/virtual/), "arrivals" (the parameter server's
    # arrival-order model: benchmarks/simulator.py), or None (not yet simulated).
    simulator: ClassVar[str | None] = None
    # The straggler models (benchmarks/stragglers.py) its simulator can draw a batch's time from.
    simulated_stragglers: ClassVar[tuple[str, ...]] = ("none", "fixed", "slow", "gamma", "gamma_het")
    # How it communicates, for the validation's ratio errors by family: "all-reduce", "point-to-point"
    # (gossip and butterflies of sends), "periodic averaging", "hierarchical" (node-local, then
    # global), "parameter server" or "shared memory".
    family: ClassVar[str] = ""
    columns: ClassVar[tuple[str, ...]] = ()  # its own metrics.csv columns; ``metrics()`` gives their values
    # Its cells in the time model's calibration (``tools/calibrate.py``): "fit" where a choice of the
    # model was made seeing them (shown, not scored), "test" where none was (out of sample), None
    # where it is not calibrated. A model change chosen on a "test" algorithm makes it "fit".
    calibration: ClassVar[str | None] = None
    # Knobs under which it does its own work within a short run (2 epochs of the embedded task), as
    # the device check and the virtual cluster's tests run it (a default may wait thousands of steps).
    short_run_knobs: ClassVar[dict[str, object]] = {}

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.plan: Plan | None = None
        self.comm_s = 0.0  # seconds spent in blocking communication, reported as ``comm_s``
        self.clock = time.perf_counter  # what times it: the virtual cluster's ranks read their virtual clock
        self.step_count = 0
        self._eval_copy: nn.Module | None = None

    @classmethod
    def unavailable(cls, simulated: bool = False) -> str | None:
        """Why this algorithm cannot run here (a missing optional package), or ``None`` if it can;
        ``simulated``: on the virtual cluster (``--set clock=simulated``)."""
        return None

    @classmethod
    def check(cls, knobs: dict[str, object], hparams: dict[str, object]) -> str | None:
        """Why these knobs cannot run with the task's hyper-parameters (checked before any process
        starts, the message names the fix), or ``None``."""
        return None

    @classmethod
    def check_model(cls, knobs: dict[str, object], parameter_sizes: Callable[[], list[int]]) -> str | None:
        """Why these knobs cannot run with the task's model (checked before any process starts, the
        message names the fix), or ``None``; ``parameter_sizes()`` builds the model on the CPU and
        gives the sizes of its parameter tensors, so only an algorithm that asks pays for it."""
        return None

    @classmethod
    def worker_count(cls, world_size: int) -> int:
        """How many of ``world_size`` ranks compute gradients (``worker_ranks``)."""
        return world_size

    @classmethod
    def metric_columns(cls) -> list[str]:
        """The columns it adds to metrics.csv: its ``columns``, and ``spread`` where it tracks one."""
        return [*cls.columns, *(["spread"] if cls.tracks_spread else [])]

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        """Take ownership of the model and optimizer; return the module the loop calls forward on.

        Every rank starts from rank 0's parameters, so the seed alone decides the start.
        """
        if self.broadcast_start:
            with torch.no_grad():
                broadcast_(list(model.parameters()), src=0)
        self.model, self.optimizer, self.plan = model, optimizer, plan
        return model

    def data_shard(self) -> tuple[int, int]:
        """``(replicas, index)``: how the training set is split and which part this rank reads.

        Every rank is a data-parallel worker with a shard of its own by default; a parameter server
        deals one stream out to its workers, batch by batch, and takes ``(1, 0)``.
        """
        return self.topology.world_size, self.topology.rank

    def worker_ranks(self) -> range:
        """The ranks that compute gradients: every rank by default, all but a parameter server's
        master. Stragglers are drawn among them, the lr warm-up starts at 1 / their number, and
        throughput counts them."""
        return range(self.worker_count(self.topology.world_size))

    @abc.abstractmethod
    def step(self) -> None:
        """Communicate and update the parameters; called once after each ``loss.backward()``."""

    def end_epoch(self, train_loss: float) -> None:
        """Schedule logic at the end of an epoch; ``train_loss`` is the job-wide mean."""

    def eval_model(self) -> nn.Module:
        """The model whose validation metric is reported: by default the workers' average, batch-norm
        statistics included (``averaged_model``), so that every algorithm is scored on the same kind
        of model. Where the parameters are equal on every rank (DDP, all-reduce, Horovod, DASO after
        its epoch-end sync) only the statistics differ, each rank's running averages of its own shard.
        A collective: every rank calls it."""
        assert self.model is not None, "prepare() first"
        return self.averaged_model()

    def close(self) -> None:
        """Stop background work (communication threads); called once when training ends."""

    def averaged_model(self, group: torch.distributed.ProcessGroup | None = None) -> nn.Module:
        """A copy of the model holding the average of every worker's parameters and float buffers.

        For the algorithms whose workers hold different models between synchronisations (local SGD,
        gossip): the consensus model is what they would deliver, so it is what is evaluated. The
        copy is made once and refreshed at each call; the workers' own models are not touched.
        """
        if self._eval_copy is None:
            self._eval_copy = copy.deepcopy(self.model)
        source = [t for t in _state_tensors(self.model)]
        target = _state_tensors(self._eval_copy)
        with torch.no_grad():
            for t, src in zip(target, source):
                t.copy_(src)
            flat_average_(target, group)
        return self._eval_copy

    def model_spread(self) -> float:
        """RMS distance of the workers' parameters from their average (0 right after a global sync).

        How far the models of a decentralised or wait-avoiding method drift apart is its trace. A
        collective: every rank calls it at the same point (the runner does, after ``end_epoch``).
        """
        x = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).double()
        mean = x.clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        square = ((x - mean) ** 2).sum().reshape(1)
        dist.all_reduce(square)
        return (square.item() / (dist.get_world_size() * x.numel())) ** 0.5

    def metrics(self) -> dict[str, object]:
        """The values of ``columns`` at this evaluation (for example DASO's B and S); called once per
        evaluation, on every rank, so a window of statistics may restart here."""
        return {}

    def state_dict(self) -> dict[str, object]:
        """What resuming this rank needs: the step counter and the communication time so far."""
        return {"step_count": self.step_count, "comm_s": self.comm_s}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore ``state_dict()``'s output, after ``prepare()`` (see the module's checkpoint contract)."""
        self.step_count = int(state["step_count"])
        self.comm_s = float(state["comm_s"])

    def _timed_start(self) -> float:
        """Start a communication timer; on CUDA, first drain the stream so compute is not counted."""
        self._sync_device()
        return self.clock()

    def _timed_stop(self, start: float) -> None:
        self._sync_device()
        self.comm_s += self.clock() - start

    def _sync_device(self) -> None:
        """Wait for the model's GPU, if it is on one (not merely where CUDA exists: a CPU run on a GPU
        node must not open a CUDA context)."""
        device = next(self.model.parameters()).device if self.model is not None else None
        accelerator.synchronize(device)


class LoopAlgorithm(Algorithm):
    """An algorithm that runs each epoch's batches itself: subclasses implement ``train_epoch``.

    Checkpoints are taken at epoch boundaries only, after ``train_epoch``.
    """

    owns_loop: ClassVar[bool] = True

    def step(self) -> None:
        raise TypeError(f"{type(self).__name__} owns its loop: the runner calls train_epoch()")

    @abc.abstractmethod
    def train_epoch(self, epoch: Epoch) -> tuple[torch.Tensor | float, int]:
        """Run one epoch's batches; return ``(sum of batch losses, batches)``."""


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and floating-point buffers (batch-norm statistics; not integer counters)."""
    return [p.data for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]
