"""Checkpoints of a run, and the stop request that ends a run at a time limit.

A checkpoint lives in the run directory until the run completes (``<out>/checkpoint/``)::

    checkpoint/latest.json            the commit record, written last by rank 0 (atomic replace)
    checkpoint/epoch00012_batch0000034/rank00003.pt   one shard per rank: its whole state, a flat dict

Every rank writes its own shard rather than rank 0 gathering them: the decentralised algorithms
(D-PSGD, SGP, AD-PSGD, WAGMA, local SGD) hold a different model and momentum on every rank, and a
gather would put P models in rank 0's memory and on one link. Shards are written in parallel, each
through a temporary file and ``os.replace``; when every rank has reported success, rank 0 replaces
``latest.json`` to point at the new step and deletes the older ones. A crash at any moment therefore
leaves ``latest.json`` naming a checkpoint whose shards are all whole, and a half-written one is
never loaded. On a cluster the run directory must be on a file system every node sees (as it already
must for the results).

``StopRequest`` turns Slurm's time-limit warning (``sbatch --signal=USR1@...``) and ``scancel``'s
SIGTERM into a clean stop: the signal only sets a flag, and the ranks agree on it with non-blocking
MAX all-reduces read a few steps later, so all of them stop after the same step without a barrier
in every step.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import shutil
import signal
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when a shard's keys change meaning; an older checkpoint is then refused
DIRNAME = "checkpoint"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # scancel, and Slurm's --signal time-limit warning


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot resume this run; the message says why and what to do."""


def rng_state() -> dict[str, object]:
    """The generators a rank's training draws from: torch's CPU generator and, if present, CUDA's."""
    state: dict[str, object] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, object]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def latest(out: Path) -> dict[str, object] | None:
    """The commit record of the newest whole checkpoint in run directory ``out``, or ``None``."""
    path = Path(out) / DIRNAME / "latest.json"
    return json.loads(path.read_text()) if path.exists() else None


def save(
    out: Path,
    rank: int,
    world_size: int,
    shard: dict[str, object],
    record: dict[str, object],
    group: dist.ProcessGroup | None = None,
) -> None:
    """Write this rank's ``shard``; once every rank has, rank 0 commits ``record`` as the newest checkpoint.

    Collective: every rank of ``group`` calls it at the same position, ``record["epoch"]`` and
    ``record["batch"]`` (batches done in that epoch), which name the checkpoint; ``record["step"]`` is
    the optimizer steps done. ``record`` is what a reader needs without loading shards (position,
    clock); rank 0's copy is the one written.
    """
    root = Path(out) / DIRNAME
    name = f"epoch{int(record['epoch']):05d}_batch{int(record['batch']):07d}"
    ok = torch.ones(1)
    try:
        (root / name).mkdir(parents=True, exist_ok=True)
        _write_atomic(
            root / name / f"rank{rank:05d}.pt",
            {**shard, "format": FORMAT, "rank": rank, "world_size": world_size, "step": record["step"]},
        )
    except OSError:
        logger.exception("rank %d could not write its checkpoint shard", rank)
        ok.zero_()
    # Everyone learns whether every shard is on disk before anything points at them.
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if ok.item() < 1:
        raise CheckpointError(
            f"a rank could not write its shard of checkpoint {root / name}; see log.txt "
            "(disk full or quota?); the previous checkpoint is kept"
        )
    if rank == 0:
        tmp = root / f".latest.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({**record, "format": FORMAT, "world_size": world_size, "dir": name}, indent=2) + "\n")
        _fsync(tmp)
        os.replace(tmp, root / "latest.json")
        for old in root.iterdir():  # older checkpoints, and whatever a crash mid-save left
            if old.name not in (name, "latest.json"):
                if old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    old.unlink(missing_ok=True)
    dist.barrier(group=group)  # no rank runs ahead and saves again while rank 0 still cleans up


def load(out: Path, rank: int, world_size: int) -> dict[str, object] | None:
    """This rank's shard of the newest whole checkpoint, with the commit record as ``"record"``."""
    record = latest(out)
    if record is None:
        return None
    if record.get("format") != FORMAT:
        raise CheckpointError(
            f"{out}/{DIRNAME} was written by checkpoint format {record.get('format')}, this "
            f"code reads format {FORMAT}; delete {out}/{DIRNAME} to start the run afresh"
        )
    if record["world_size"] != world_size:
        raise CheckpointError(
            f"{out}/{DIRNAME} holds {record['world_size']} ranks' states, this run has "
            f"{world_size}; resume with the same --nodes and --procs-per-node, or pass another --out"
        )
    path = Path(out) / DIRNAME / str(record["dir"]) / f"rank{rank:05d}.pt"
    shard = torch.load(path, map_location="cpu", weights_only=True)
    if shard["step"] != record["step"] or shard["rank"] != rank:
        raise CheckpointError(f"{path} is not step {record['step']} of rank {rank}; delete {out}/{DIRNAME}")
    return {**shard, "record": record}


class Saver:
    """One rank's checkpoints of a run: what ``restore`` loads and ``save`` writes.

    Args:
        out: the run directory. rank, world_size: this rank's place. group: the (gloo) group the
            ranks agree over.
        stateful: the objects whose state dicts make the checkpoint (model, optimizer, lr scheduler,
            schedule, algorithm: the run's order, in which they are restored).
    """

    def __init__(
        self, out: Path, rank: int, world_size: int, stateful: dict[str, object], group: dist.ProcessGroup | None = None
    ) -> None:
        self.out, self.rank, self.world_size, self.stateful, self.group = out, rank, world_size, stateful, group

    def restore(self) -> Resumed | None:
        """Load the newest whole checkpoint into the objects and return what the loop takes back
        from it (``Resumed``); ``None`` if there is none."""
        shard = load(self.out, self.rank, self.world_size)
        if shard is None:
            return None
        for key, obj in self.stateful.items():
            if key not in shard:
                raise CheckpointError(
                    f"{self.out}/{DIRNAME} has no {key!r} state (written by an older version); "
                    f"delete {self.out}/{DIRNAME} to start the run afresh"
                )
            obj.load_state_dict(shard[key])
        runner = shard["runner"]
        return Resumed(
            Loop(**{f.name: runner[f.name] for f in dataclasses.fields(Loop)}),
            shard["batch"],
            shard["loss_sum"],
            shard["rng_epoch"],
            shard["rng"],
            shard["record"],
            runner,
        )

    def save(self, extra: dict[str, object], record: dict[str, object]) -> None:
        """Save the objects' state dicts, ``extra`` (the loop's position and state; an entry there
        replaces an object's own, as the algorithm's, taken earlier on the clock) and the RNG."""
        shard = {k: v.state_dict() for k, v in self.stateful.items() if k not in extra}
        save(self.out, self.rank, self.world_size, {**shard, **extra, "rng": rng_state()}, record, self.group)


def remove(out: Path) -> None:
    """Delete the checkpoint once the run has its summary (called by rank 0)."""
    shutil.rmtree(Path(out) / DIRNAME, ignore_errors=True)


def _write_atomic(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    _fsync(tmp)  # the bytes are on disk before the name is: a crash cannot leave a torn shard
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` whose next epoch can start part-way: the first ``skip`` indices are dropped.

    The order is a function of the seed and the epoch, so skipping the samples of the batches done
    before a checkpoint puts the data order exactly where it was, without loading those samples.
    A task's ``make_loader`` must therefore draw each batch's ``batch_size`` samples from the sampler
    in order (as ``DataLoader`` does).
    """

    skip = 0

    def __iter__(self):
        skip, self.skip = self.skip, 0
        return itertools.islice(super().__iter__(), skip, None)


class StopRequest:
    """SIGTERM or SIGUSR1 asks every rank to stop after the step that all of them agree on.

    The handler only sets a flag (Python runs it between bytecodes of the main thread, so it never
    interrupts a collective). Every rank calls ``agreed()`` once per step and ``agreed(drain=True)``
    at each epoch end, in the same order. Every ``every``-th step it starts a non-blocking MAX
    all-reduce of this rank's flag and reads the one started ``every`` steps before; at an epoch
    end it reads them all. So every rank gets the same answer at the same call and stops after the
    same step, within ``2 * every`` steps of the signal, or at the epoch end.

    Why not a blocking check each step: that would put a barrier into every step, and the
    wait-avoiding algorithms (WAGMA, AD-PSGD, DASO, local SGD) would then wait for their stragglers
    after all; here a rank may run ``every`` steps ahead of the slowest before it waits for a flag,
    and the epoch end, where the runner synchronises anyway, costs nothing more. Starting a gloo
    all-reduce costs the main thread a thread wake-up (0.4-0.5 ms measured on the busy 2-core test
    machine, against 2 ms for a blocking one), hence one every few steps. Slurm's ``--signal``
    warning must leave ``2 * every`` steps and one checkpoint save to spare.

    Create it first thing (the handlers are installed at once, so a signal during start-up is not
    lost), then ``connect(group)`` once the process group exists.

    Args:
        every: steps between two flag all-reduces (default 8).
        signals: whether to install the handlers (only a process's main thread can; the virtual
            cluster's ranks are threads, and a signal stops the simulation as a whole). Without
            them no rank can be asked to stop, so ``agreed`` says no without asking the others: its
            flag all-reduce would make a wait-avoiding rank wait for the slowest every ``every``
            steps, a wait that only the harness would have put there.
    """

    def __init__(self, every: int = 8, signals: bool = True) -> None:
        if every < 1:
            raise ValueError(f"Arg ``every`` must be a positive integer, got {every}.")
        self.every, self.calls = every, 0
        self.group: dist.ProcessGroup | None = None
        self.signal: int | None = None
        self.in_flight: deque[tuple[dist.Work, torch.Tensor]] = deque()
        self.listens = signals
        self.previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS} if signals else {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum

    def connect(self, group: dist.ProcessGroup | None) -> None:
        """The group the ranks agree over: a gloo one (CPU tensors; on NCCL jobs the default is CUDA's)."""
        self.group = group

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else "a stop request from another rank"

    def agreed(self, drain: bool = False) -> bool:
        """Whether the ranks agree to stop now (the same answer on every rank at the same call)."""
        if not self.listens:
            return False
        self.calls += 1
        if not drain and self.calls % self.every:
            return False
        stop = False
        while self.in_flight:  # the one started ``every`` steps ago (all of them, at an epoch end)
            work, flag = self.in_flight.popleft()
            work.wait()
            stop = stop or bool(flag.item())
        if drain:  # this rank's flag now, read by all at once: the epoch end waits for everyone anyway
            flag = torch.tensor([int(self.signal is not None)], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            return stop or bool(flag.item())
        if not stop:
            flag = torch.tensor([int(self.signal is not None)], dtype=torch.int32)
            self.in_flight.append((dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag))
        return stop

    def close(self) -> None:
        """Finish the all-reduces in flight and restore the previous signal handlers."""
        while self.in_flight:
            self.in_flight.popleft()[0].wait()
        for s, handler in self.previous.items():
            signal.signal(s, handler)


@dataclasses.dataclass
class Loop:
    """Where the loop stands; a checkpoint saves it whole (with the recorder's state)."""

    epoch: float = 0  # epochs done (a fraction where the run ended at an evaluation inside one)
    step: int = 0  # steps per worker done before epoch ``epoch``
    batches: int = 0  # batches this rank ran
    samples: int = 0  # samples the job trained on


@dataclasses.dataclass
class Resumed:
    """What the loop takes back from a checkpoint, beyond the objects' states that ``Saver.restore``
    has loaded: where it stood, and what it needs to go on inside the checkpointed epoch."""

    loop: Loop
    batch: int  # batches of epoch ``loop.epoch`` done before the checkpoint
    loss_sum: torch.Tensor  # that epoch's training loss so far
    rng_epoch: dict[str, object]  # the RNG at the epoch's start: iter(loader) draws the same order again
    rng: dict[str, object]  # the RNG at the checkpoint
    record: dict[str, object]  # the commit record (position, the clock's ``wall_s``, ``metrics_bytes``)
    recorder: dict[str, object]  # the recorder's state (``Recorder.load_state_dict``)
