"""How a LAP/LPP-SGD worker's U updaters run: as processes over a model in shared memory
(``UpdaterPool``), or as threads of their rank on the virtual cluster (``ThreadUpdaters``). Both run
the same ``hogwild.Updater`` steps with the same per-updater state (``updater_state``: momenta, their
started flags, the full/partial toggle, the stats row); what differs is how a batch reaches an
updater and how its update is counted and timed.

Each worker (rank) holds one model in shared memory. ``UpdaterPool`` starts U updater processes that
train it lock-free, each with its own momentum buffers, from the batches the rank's main process
(its feed thread, beside the averager, ``algorithms/lpp_sgd.py``) copies into a ring of shared slots
on the model's device, each after the batch's straggler delay. The updaters touch neither
``torch.distributed`` nor the stragglers.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable

import torch
import torch.multiprocessing as mp
from torch import nn

from algorithms import accelerator, comm
from algorithms.hogwild import Schedule, Updater


def updater_state(
    params: list[torch.Tensor], updaters: int, share: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[list[list[torch.Tensor]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each updater's momentum buffers, their started flags, its full/partial toggle and its stats row
    (loss sum, updates, partial updates): what a checkpoint saves of the updaters. ``share`` makes a
    tensor visible to the updaters (shared memory for processes; nothing for threads)."""
    bufs = [[share(torch.zeros_like(p)) for p in params] for _ in range(updaters)]
    started = share(torch.zeros(updaters, len(params), dtype=torch.bool))
    toggles = share(torch.zeros(updaters, 1, dtype=torch.int64))
    stats = share(torch.zeros(updaters, 3, dtype=torch.float64))
    return bufs, started, toggles, stats


def batch_tensors(batch: object) -> list[torch.Tensor]:
    """The tensors of a batch that may nest tuples and lists, in order."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    return [t for b in batch for t in batch_tensors(b)]


def fill_batch(template: object, leaves: list[torch.Tensor]) -> object:
    """The batch of ``template``'s nesting with ``leaves`` in place of its tensors (consumes the list):
    the inverse of ``batch_tensors``, by which an updater rebuilds the runner's batch from its slots."""
    if isinstance(template, torch.Tensor):
        return leaves.pop(0)
    return type(template)(fill_batch(t, leaves) for t in template)


class Updaters:
    """What the two ways of running the updaters share (processes, ``UpdaterPool``; threads on the
    virtual cluster, ``ThreadUpdaters``): U updaters over one model, each with its contiguous block,
    its momentum buffers, its full/partial toggle and its stats row, and the optimizer's momentum,
    Nesterov and weight-decay settings (``Updater``'s keyword arguments). ``share`` makes each state
    tensor visible to the updaters (``_share_`` for processes; as it is for threads)."""

    def __init__(
        self,
        model: nn.Module,
        updaters: int,
        blocks: list[tuple[int, int]],
        optimizer_defaults: dict,
        seed: int,
        share: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.model, self.updaters, self.blocks, self.seed = model, updaters, blocks, seed
        self.settings = {k: optimizer_defaults[k] for k in ("momentum", "nesterov", "weight_decay")}
        self.bufs, self.started, self.toggles, self.stats = updater_state(list(model.parameters()), updaters, share)

    def applied(self) -> int:
        """Updates applied so far, all updaters together."""
        return int(self.stats[:, 1].sum())


class UpdaterPool(Updaters):
    """U updater processes training one shared model, fed through a ring of shared batch slots.

    The processes start at once (before the run's clock) and wait for ``setup``, which the first
    epoch sends with the slots shaped like its first batch. ``put`` copies a batch into a free slot
    (the rank's feed thread calls it, after the batch's straggler delay); the updaters count every
    update in ``counter`` (read&inc, after the gradient) and add their loss and update counts to
    ``stats`` (one row each: loss sum, updates applied, partial updates).

    The slots live on the model's device, whatever device the runner's batches come from: ``put``
    is where a batch moves to the GPU, once, in the rank's main process. That process allocates the
    slots and so owns their memory, which it keeps until ``close`` has joined the updaters (CUDA IPC
    needs the producer to outlive its consumers); each updater maps them once, at ``setup``, and
    reads its batch in place. A slot changes hands only after a stream synchronisation of the
    rank's device on each side: the copy is done when an updater gets the slot, and the updater's
    backward has read the batch when it frees it.
    """

    def __init__(
        self,
        model: nn.Module,
        updaters: int,
        blocks: list[tuple[int, int]],
        optimizer_defaults: dict,
        threads: int,
        seed: int,
    ) -> None:
        # Fork where the model is on the CPU: the updaters start in milliseconds instead of importing
        # torch again (seconds each), and they never touch the parent's process group. CUDA cannot
        # be forked: spawn there, as the official code.
        self.device = next(model.parameters()).device
        cuda = self.device.type == "cuda"
        ctx = mp.get_context("spawn" if accelerator.is_accelerator(self.device) else "fork")
        # Shared as ``_share_`` shares: CPU tensors in POSIX shared memory, CUDA ones through CUDA IPC.
        shared = model.share_memory() if self.device.type == "cpu" else model
        super().__init__(shared, updaters, blocks, optimizer_defaults, seed, _share_)
        self.counter = ctx.Value("q", 0)
        self.ready, self.free, started = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self.setups = [ctx.Queue() for _ in range(updaters)]
        self.slots: list[torch.Tensor] | None = None
        self.template: object = None
        # The feed's copies get a stream of their own: the rank's default stream also queues the
        # averager's work, which waits there for each all-reduce, and a copy must not wait for one.
        self.copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self.procs = [
            ctx.Process(
                target=_run,
                daemon=True,
                name=f"updater-{u}",
                args=(
                    u,
                    self.model,
                    blocks[u],
                    self.bufs[u],
                    self.started[u],
                    self.toggles[u],
                    self.settings,
                    self.counter,
                    self.stats[u],
                    self.ready,
                    self.free,
                    self.setups[u],
                    started,
                    threads,
                    seed * 1000 + u,
                    os.getpid(),
                ),
            )
            for u in range(updaters)
        ]
        for proc in self.procs:
            proc.start()
        for _ in self.procs:  # wait until each has imported torch: set-up time, not training time
            _get(started, os.getpid(), alive=self.check)

    def setup(self, batch: object, loss_fn: Callable, schedule: Schedule, slots: int) -> None:
        """Allocate ``slots`` shared slots shaped like ``batch``, on the model's device (the runner's
        batches are on the CPU), and send each updater what it needs."""
        self.template = batch
        self.slots = [
            _share_(torch.empty((slots, *t.shape), dtype=t.dtype, device=self.device)) for t in batch_tensors(batch)
        ]
        for s in range(slots):
            self.free.put(s)
        for q in self.setups:
            q.put((self.slots, batch, loss_fn, schedule))

    def put(self, batch: object, step: int) -> None:
        """Copy ``batch`` into a slot, on the model's device, once one is free (raise if an updater died).

        Called from the rank's feed thread, not from the thread that made the pool.
        """
        while True:
            try:
                slot = self.free.get(timeout=1.0)
                break
            except queue.Empty:
                self.check()
        if self.copy_stream is None:
            for shared, t in zip(self.slots, batch_tensors(batch)):
                shared[slot].copy_(t)
        else:
            with torch.cuda.stream(self.copy_stream):
                for shared, t in zip(self.slots, batch_tensors(batch)):
                    shared[slot].copy_(t, non_blocking=True)  # asynchronous from the loader's pinned memory
            self.copy_stream.synchronize()  # the updater's stream must find the copy done
        self.ready.put((slot, step))

    def updates(self) -> int:
        return int(self.counter.value)

    def set_updates(self, value: int) -> None:
        self.counter.value = value

    def idle(self, threshold: int, poll_s: float) -> None:
        """Between two polls of the averager that did not average: pause ``poll_s`` (0: the official
        busy loop). ``threshold`` is for ``ThreadUpdaters``, which skips the polls that cannot decide."""
        if poll_s:
            time.sleep(poll_s)

    def averaged(self, target: int) -> None:
        """After an averaging round: the real averager polls again at once (``ThreadUpdaters`` waits
        for news; ``target`` is for it)."""

    def drain(self, applied: int) -> None:
        """Wait until the updaters have applied ``applied`` updates in all (the epoch's batches)."""
        while self.applied() < applied:
            self.check()
            time.sleep(0.001)

    def check(self) -> None:
        """Raise if an updater died (its traceback went to stderr)."""
        for u, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                raise RuntimeError(
                    f"Hogwild updater {u} exited with code {proc.exitcode}; see its traceback above in the log"
                )

    def close(self) -> None:
        for _ in self.procs:
            self.ready.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.exitcode is None:
                proc.kill()
                proc.join()


def _share_(t: torch.Tensor) -> torch.Tensor:
    """``t``, made visible to the updater processes: a CPU tensor moves to POSIX shared memory; a
    CUDA tensor stays where it is (``share_memory_`` is a no-op there: it travels through CUDA IPC),
    and so does a ``meta`` one (it has no memory to share)."""
    return t.share_memory_() if t.device.type == "cpu" else t


def _run(
    u, model, block, bufs, started, toggle, settings, counter, stats, ready, free, setup, up, threads, seed, parent
) -> None:
    """An updater process: wait for the setup, then take batches until told to stop (``None``)."""
    try:
        device = next(model.parameters()).device
        accelerator.set_device(device)  # a spawned process starts on GPU 0, whatever its rank's GPU
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):  # a forked child has the runner's handlers
            signal.signal(sig, signal.SIG_DFL)
        torch.set_num_threads(threads)
        torch.manual_seed(seed % 2**63)  # dropout differs between updaters
        updater = Updater(model, block, bufs, started, toggle, **settings)
        up.put(u)
        slots, template, loss_fn, schedule = _get(setup, parent)
        while (item := _get(ready, parent)) is not None:  # a straggler's batch comes after its delay
            slot, step = item
            batch = fill_batch(template, [t[slot] for t in slots])

            def computed(span: tuple[int, int], slot: int = slot) -> None:
                accelerator.synchronize(device)  # the slot's batch has been read once backward's kernels have run
                free.put(slot)

            def read_and_increment() -> int:
                with counter.get_lock():
                    s = counter.value
                    counter.value += 1
                return s

            updater.step(batch, loss_fn, schedule, computed, read_and_increment, stats)
    except Exception:  # noqa: BLE001 - report, then exit non-zero: the averager checks the exit code
        traceback.print_exc()
        raise SystemExit(1) from None


def _get(q, parent: int, alive: Callable[[], None] | None = None):
    """``q.get()``, but exit if the rank's main process died (its queues would never close), or,
    in the main process, raise through ``alive`` if an updater died."""
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if alive is not None:
                alive()
            elif os.getppid() != parent:
                raise SystemExit(0) from None


class ThreadUpdaters(Updaters):
    """The U updaters as threads of their rank on the virtual cluster (``--set clock=simulated``),
    with ``UpdaterPool``'s interface: the same ``Updater`` steps, the same counter, momenta and toggles.

    Why threads: the virtual cluster runs every rank's threads one at a time on its clock
    (``benchmarks/virtual/``); processes would run on the machine's. An updater computes its
    gradient from the model as it is when it takes the batch (Algorithm 1's snapshot, line 3), is
    charged the update's compute on its own clock (``VirtualClock.update``: U updaters sharing the
    rank's GPU), then counts (read&inc) and applies the update at the end of that time, while the
    other updaters and the averager go on. The feed's ring of ``slots`` still bounds how far it runs
    ahead. The averager's busy loop is not run turn by turn: after a poll that did not average, ``idle``
    waits until some worker's counter reaches the value at which the decision could change; after a
    round, ``averaged`` waits until some worker has updated since (a round with none averages equal
    models again). Both skip only what would change nothing but time, which a busy loop on a fast
    network spends in thousands of virtual all-reduces per update; what they move is when the next
    poll or round starts, by less than one poll or round (``poll_ms`` has no meaning here).
    """

    def __init__(
        self,
        model: nn.Module,
        updaters: int,
        blocks: list[tuple[int, int]],
        optimizer_defaults: dict,
        seed: int,
        clock,
    ) -> None:
        super().__init__(model, updaters, blocks, optimizer_defaults, seed, lambda t: t)
        self.clock, self.sizes = clock, [p.numel() for p in model.parameters()]
        self.counter = 0
        self.seen = 0  # the job's updates when the averager last looked (``averaged``)
        self.cond = comm.threads().Condition()
        self.ready: deque = deque()  # (batch, step), or None: stop
        self.free = 0
        self.threads: list = []

    def setup(self, batch: object, loss_fn: Callable, schedule: Schedule, slots: int) -> None:
        self.loss_fn, self.schedule, self.free = loss_fn, schedule, slots
        for u in range(self.updaters):
            thread = comm.threads().Thread(target=functools.partial(self._run, u), name=f"updater-{u}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def put(self, batch: object, step: int) -> None:
        device = next(self.model.parameters()).device
        batch = fill_batch(batch, [t.to(device) for t in batch_tensors(batch)])
        with self.cond:
            self.cond.wait_for(lambda: self.free > 0)
            self.free -= 1
            self.ready.append((batch, step))
            self.cond.notify_all()

    def updates(self) -> int:
        return self.counter

    def set_updates(self, value: int) -> None:
        self.counter = value
        self.clock.count_updates(value, update=False)

    def idle(self, threshold: int, poll_s: float) -> None:  # noqa: ARG002 - see the class
        self.clock.wait_updates(threshold)
        self.seen = self.clock.job_updates()

    def averaged(self, target: int) -> None:
        """Before the next poll, wait until some worker has updated since the last round ended (or a
        counter has reached the epoch's ``target``): a round with no update since the one before
        averages equal models again, a no-op to rounding, of which K = 1's back-to-back averaging
        would run thousands per update on a fast network."""
        self.clock.wait_updates(target, after=self.seen)
        self.seen = self.clock.job_updates()

    def drain(self, applied: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.applied() >= applied)

    def check(self) -> None:
        """Nothing to do: an updater that raises stops the whole virtual cluster with its error."""

    def close(self) -> None:
        with self.cond:
            self.ready.extend([None] * len(self.threads))
            self.cond.notify_all()
        for thread in self.threads:
            thread.join()
        self.threads = []

    def _run(self, u: int) -> None:
        torch.manual_seed(self.seed * 1000 + u)  # dropout differs between updaters, as in the processes
        updater = Updater(self.model, self.blocks[u], self.bufs[u], self.started[u], self.toggles[u], **self.settings)
        while True:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.ready))
                item = self.ready.popleft()
            if item is None:
                return
            batch, _ = item
            # One thread runs at a time and nothing after the compute's charge waits: the step needs no lock.
            updater.step(batch, self.loss_fn, self.schedule, self._computed, self._read_and_increment, self.stats[u])
            with self.cond:
                self.cond.notify_all()  # a slot is free, the counter and ``applied`` have moved
            self.clock.count_updates(self.counter)

    def _computed(self, span: tuple[int, int]) -> None:
        self.clock.update(self.updaters, self.sizes, span)  # its compute, on this thread's clock
        self.free += 1

    def _read_and_increment(self) -> int:
        s, self.counter = self.counter, self.counter + 1
        return s
