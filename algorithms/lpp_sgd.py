"""LAP-SGD and LPP-SGD: Hogwild updaters inside each worker, non-blocking model averaging across them.

Paper: Chatterjee, Kungurtsev, Alistarh, "Scaling the Wild: Decentralizing Hogwild!-style
Shared-memory SGD", https://arxiv.org/abs/2203.06638, Algorithm 1 (Sec. 3). The
rank's main process is the averager a^q of Algorithm 1 (its main thread) and the feed of the U
updaters (a second thread); the update rules are in ``algorithms/hogwild.py``, the updaters in ``algorithms/updaters.py``.
Both classes own their loop (``owns_loop``): the runner hands them each epoch's batches of this
rank's shard and keeps data, evaluation, metrics and the clock.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from algorithms import accelerator, comm
from algorithms.base import Epoch, LoopAlgorithm, Plan
from algorithms.comm import flatten
from algorithms.hogwild import Schedule, apply_average_, averaging_period, contiguous_blocks, warmed_up_lr
from algorithms.topology import Topology
from algorithms.updaters import ThreadUpdaters, UpdaterPool, batch_tensors


class LAPSGD(LoopAlgorithm):
    """LAP-SGD: U lock-free updaters per worker, the worker's models averaged across workers meanwhile.

    Paper: Chatterjee, Kungurtsev, Alistarh, "Scaling the Wild: Decentralizing Hogwild!-style
    Shared-memory SGD", 2022, https://arxiv.org/abs/2203.06638 (Algorithm 1 with the full block).

    Why: one process rarely saturates a GPU at a generalising batch size. U updater processes share
    the worker's model (``model.share_memory()``) and update it Hogwild-style, each with its own
    Nesterov momentum, from batches of the worker's shard; the rank's main process meanwhile takes a
    snapshot of the model, all-reduce-averages it with the other workers and adds (average -
    snapshot) in place, without stopping the updaters. Before each decision the averagers all-reduce
    the MAX of their update counters and of minus their last-averaged counters, so every worker
    decides alike and the collectives cannot mismatch (as the code's ``average`` in
    ``train/LPPSGD.py``, github.com/bapi/LPP-SGD; Algorithm 1, line 10, decides locally). The
    averaging period K is 1 (back-to-back averaging) until ``switch_epoch``, then H = ``period``.
    Only parameters are averaged: batch-norm statistics stay each worker's own, and ``eval_model()``
    is the worker's own model, each rank scoring its slice of the validation set (the official
    code's test, ``test_epoch``; the paper does not say).
    The learning rate is the method's own, set before each update from the worker's update counter
    (Sec. 4; Table 13): a linear warm-up over the task's ``warmup_epochs`` (5 in the paper's recipes) from alpha_0 to alpha_w = alpha_0 x B_loc x
    Q / B_base, then cosine annealing. As everywhere in the suite, the task's ``lr`` is the run's
    warmed-up rate alpha_w (Table 13's alpha^w_DP, which equals alpha^w_LAP), and alpha_0 follows
    from the rule; the task's ``schedule`` and ``milestones`` do not apply. A second thread of the
    main process feeds the updaters the rank's batches, each after its straggler delay
    (``Epoch.stragglers``): a straggling rank's batches are delayed once each and in series, so an
    epoch of n delayed batches takes at least n delays whatever U, while the averager goes on
    (see ``_feed``).

    Args:
        updaters: U, updater processes per worker (default 4, the paper's usual value; the
            embedded suites use 2, as a CPU has few cores to share).
        period: H, updates of a worker between averages after the switch (default 16, CIFAR; the
            paper uses 8 for ImageNet).
        switch_epoch: epoch from which K = H (default -1: half the epochs, the paper's T/2).
        base_batch: B_base of the scaling rule (default 0: the task's standard per-worker batch,
            128 on CIFAR, 32 on ImageNet).
        poll_ms: pause of the averager between two polls that did not average (default 0, the
            official busy loop; a few ms free a CPU core for the updaters where cores are scarce).

    Example::

        algo = LAPSGD(topology, updaters=4, period=16)
        model = algo.prepare(model, optimizer, plan)  # starts the updaters
        for e in range(epochs):
            sampler.set_epoch(e)
            loss_sum, batches = algo.train_epoch(Epoch(epoch=e, batches=loader, ...))
            validate(algo.eval_model())
        algo.close()  # stops the updaters

    Warning:
        Every rank must see the same number of batches per epoch (the runner's sampler drops the
        remainder). The runner evaluates between epochs, so the updaters pause there, unlike the
        official code, which tests while they run.
    """

    sgd_only = True  # each updater runs its own Nesterov SGD (algorithms/hogwild.py)
    family = "shared memory"
    simulator = "virtual"  # its updaters as threads of the rank (updaters.ThreadUpdaters)
    calibration = "fit"  # tools/calibrate.py
    short_run_knobs = {"updaters": 2}  # the digits model has no 4 blocks
    columns: tuple[str, ...] = ("rounds", "K")
    overlaps_comm = True  # the averaging runs beside the updaters: no step waits for it
    boost = 1.0  # multiplier of the warmed-up lr (LPP-SGD: ``lr_boost``)

    def __init__(
        self,
        topology: Topology,
        *,
        updaters: int = 4,
        period: int = 16,
        switch_epoch: int = -1,
        base_batch: int = 0,
        poll_ms: float = 0.0,
    ) -> None:
        super().__init__(topology)
        for name, value, low in (
            ("updaters", updaters, 1),
            ("period", period, 1),
            ("switch_epoch", switch_epoch, -1),
            ("base_batch", base_batch, 0),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"Arg ``{name}`` must be an integer >= {low}, got {value!r}.")
        if poll_ms < 0:
            raise ValueError(f"Arg ``poll_ms`` must be >= 0, got {poll_ms}.")
        self.updaters, self.period, self.switch_epoch = updaters, period, switch_epoch
        self.base_batch, self.poll_s = base_batch, poll_ms / 1000.0
        self.pool: UpdaterPool | None = None
        self.schedule: Schedule | None = None
        self.last = 0  # this worker's counter at its last average (the official ``last_averaged_at``)
        self.rounds = 0
        self.period_now = 1
        self.stop_feed = comm.threads().Event()
        self.feed_error: BaseException | None = None

    def blocks(self, model: nn.Module) -> list[tuple[int, int]]:
        """Each updater's block for partial steps: LAP-SGD always takes the whole model."""
        return [(0, len(list(model.parameters())))] * self.updaters

    def partial_start(self, plan: Plan) -> int | None:
        """T_st in epochs, or ``None``: LAP-SGD never takes partial steps."""
        return None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        super().prepare(model, optimizer, plan)
        self.switch_at = plan.epochs // 2 if self.switch_epoch == -1 else self.switch_epoch
        seed = torch.initial_seed() * 100 + self.topology.rank
        if getattr(self.clock, "kind", "wall") == "simulated":  # the virtual cluster: its threads, its clock
            self.pool = ThreadUpdaters(model, self.updaters, self.blocks(model), optimizer.defaults, seed, self.clock)
        else:
            threads = max(1, torch.get_num_threads() // self.updaters)
            self.pool = UpdaterPool(model, self.updaters, self.blocks(model), optimizer.defaults, threads, seed)
        return model

    def train_epoch(self, epoch: Epoch) -> tuple[torch.Tensor | float, int]:
        pool, n = self.pool, len(epoch.batches)
        batches = iter(epoch.batches)
        if self.schedule is None:
            first = next(batches)
            self.schedule = self._schedule(first, epoch)
            pool.setup(first, epoch.task.loss, self.schedule, slots=3 * self.updaters)
            batches = itertools.chain([first], batches)
        start_loss, start_applied = pool.stats[:, 0].sum().item(), pool.applied()
        target, shown = pool.updates() + n, start_applied
        device = next(self.model.parameters()).device
        self.stop_feed.clear()
        feed = comm.threads().Thread(
            target=functools.partial(self._feed, batches, epoch.step, n, epoch.stragglers, device),
            name="lap-feed",
            daemon=True,
        )
        feed.start()
        try:
            while True:  # the averager's loop, beside the feed
                s = pool.updates()
                state = torch.tensor([s, -self.last], dtype=torch.float64, device=device)
                comm.all_reduce(state, op=dist.ReduceOp.MAX)  # the same decision on every worker
                s_max, last_min = state[0].item(), -state[1].item()
                if s_max >= target:
                    break
                epoch_now = s_max / self.plan.steps_per_epoch
                self.period_now = averaging_period(epoch_now, self.switch_at, self.period)
                if s_max - last_min >= self.period_now:
                    self.last = s
                    self._average()
                    pool.averaged(target)
                else:  # the next poll can decide otherwise once a counter reaches the threshold
                    pool.idle(min(last_min + self.period_now, target), self.poll_s)
                self._check_feed()
                pool.check()
                shown = self._progress(epoch, shown)
            feed.join()  # this worker is behind the fastest: its feed finishes its share without averaging
        finally:
            self.stop_feed.set()  # ends the feed after its batch in hand if the averager raised
        self._check_feed()
        pool.drain(start_applied + n)
        self._progress(epoch, shown)
        self.step_count = pool.updates()
        self.optimizer.param_groups[0]["lr"] = self.schedule.lr(self.step_count)  # the lr column
        return pool.stats[:, 0].sum().item() - start_loss, n

    def _feed(self, batches: Iterator, first_step: int, n: int, stragglers: object, device: torch.device) -> None:
        """Hand the updaters batch ``step`` only after its straggler delay (a thread of the main process).

        The feed is the updaters' only source of batches, and the rank's one ``Stragglers`` draws
        here once per batch, in step order (the draws of any algorithm's rank at the same steps): a
        straggling rank's batches are delayed once each and in series, its U updaters get at most
        one batch per delay, and its ``n`` batches take at least ``n`` delays, as on a synchronous
        rank. (A sleep in each updater overlapped U delays, from U copies of one generator.) The
        updaters still compute the batches already fed while a delay runs, as U processes on one GPU
        overlap, so a batch costs the rank about max(delay, its time per batch), where a
        synchronous rank pays their sum. The feed is a thread, not a step of the averager's loop,
        so that the averager goes on meanwhile: a slow device slows the rank's gradients, not its
        averaging, and a sleeping averager would also stall the other ranks' averagers, which meet
        it at every poll's all-reduce, and so their feeds. The feed draws the batches (a task's loader
        may run the model, as the RL task's rollouts do) and copies them to the model's device, so it
        makes the rank's device current first: the current device is per thread.
        """
        try:
            accelerator.set_device(device)
            for step, batch in zip(range(first_step, first_step + n), batches):
                if self.stop_feed.is_set():
                    return
                stragglers.before_step(step)
                self.pool.put(batch, step)
        except BaseException as error:  # noqa: BLE001 - handed to the averager, which raises it
            self.feed_error = error

    def _check_feed(self) -> None:
        if self.feed_error is not None:
            error, self.feed_error = self.feed_error, None
            raise RuntimeError("LAP-SGD's feed thread failed") from error

    def _schedule(self, batch: object, epoch: Epoch) -> Schedule:
        """The paper's learning-rate rule (Sec. 4; Table 13's caption) for this batch size and worker count.

        ``lr`` is, as for every algorithm of the suite, the warmed-up rate of the run (alpha_w at
        this batch and worker count); the warm-up starts from the alpha_0 the paper's rule implies.
        """
        lr, workers = self.optimizer.defaults["lr"], self.topology.world_size
        batch_size = batch_tensors(batch)[0].shape[0]
        base_batch = self.base_batch or epoch.task.hparams["batch_size"]
        start = lr / warmed_up_lr(1.0, batch_size, workers, base_batch)  # alpha_0 = alpha_w B_base / (B_loc Q)
        peak = warmed_up_lr(start, batch_size, workers, base_batch, self.boost)
        return Schedule(
            self.plan.steps_per_epoch,
            self.plan.epochs,
            start,
            peak,
            self.plan.warmup_epochs,
            self.partial_start(self.plan),
        )

    def _average(self) -> None:
        """Snapshot, all-reduce average, add (average - snapshot) in place (Algorithm 1, 13-16)."""
        live = [p.data for p in self.model.parameters()]
        snapshot = flatten(live)  # v^{q,j}: the updaters keep writing into ``live`` meanwhile
        start = self._timed_start()
        average = snapshot / self.topology.world_size  # divide first, as ``flat_average_``
        comm.all_reduce(average)
        self._timed_stop(start)
        apply_average_(live, snapshot, average)
        self.rounds += 1

    def _progress(self, epoch: Epoch, shown: int) -> int:
        now = self.pool.applied()
        if now > shown:
            epoch.progress(now - shown)
        return now

    def eval_model(self) -> nn.Module:
        """The worker's own model, not the average: the official code tests each worker's replica
        (``test_epoch``; the paper does not say), so this is the one exception to the suite's averaged
        evaluation."""
        return self.model

    def metrics(self) -> dict[str, float]:
        """Averaging rounds so far, and the period K in force."""
        return {"rounds": float(self.rounds), "K": float(self.period_now)}

    def close(self) -> None:
        self.stop_feed.set()
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def state_dict(self) -> dict[str, object]:
        """Counters, each updater's momentum buffers and flags, and the full/partial toggles.
        Taken between epochs, when the updaters are idle."""
        pool = self.pool
        return {
            **super().state_dict(),
            "updates": pool.updates(),
            "last": self.last,
            "rounds": self.rounds,
            "momentum": tuple(tuple(b.clone() for b in bufs) for bufs in pool.bufs),
            "started": pool.started.clone(),
            "toggles": pool.toggles.clone(),
            "stats": pool.stats.clone(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        pool = self.pool
        if len(state["momentum"]) != self.updaters:
            raise ValueError(
                f"the checkpoint holds {len(state['momentum'])} updaters' momentum, this run has "
                f"``updaters``={self.updaters}; resume with the same value"
            )
        pool.set_updates(int(state["updates"]))
        self.last, self.rounds = int(state["last"]), int(state["rounds"])
        with torch.no_grad():
            for bufs, saved in zip(pool.bufs, state["momentum"]):
                for b, s in zip(bufs, saved):
                    b.copy_(s)
            for name in ("started", "toggles", "stats"):
                getattr(pool, name).copy_(state[name])


class LPPSGD(LAPSGD):
    """LPP-SGD: LAP-SGD whose updaters alternate full steps with steps on their own block only.

    Paper: Chatterjee, Kungurtsev, Alistarh, "Scaling the Wild: Decentralizing Hogwild!-style
    Shared-memory SGD", 2022, https://arxiv.org/abs/2203.06638 (Algorithm 1, block selection rule).

    Why: a partial back-propagation stops at the earliest tensor of the block and skips the other
    weight gradients, so U concurrent updaters spend less compute per update than LAP-SGD's. The
    model's parameter tensors are split into U contiguous blocks of about equal parameter count
    (``hogwild.contiguous_blocks``, the official code's split); updater r owns block r. Until
    ``partial_start_epoch`` (T_st) every step is full; then each updater flips between a partial and
    a full step after each of its own updates (the code's per-updater toggle). A partial step
    updates, decays and applies momentum to its block's tensors only. The warmed-up lr is
    ``lr_boost`` times LAP-SGD's (Sec. 4, Hyperparameters: "up to 1.25x"; Table 13).

    Args:
        updaters, period, switch_epoch, base_batch, poll_ms: as LAP-SGD.
        partial_start_epoch: T_st in epochs (default -1: a tenth of the epochs, the paper's T/10:
            30 of 300, 20 of 200, 9 of 90).
        lr_boost: multiplier of LAP-SGD's warmed-up lr (default 1.25, Table 13).

    Example::

        algo = LPPSGD(topology, updaters=3)
        model = algo.prepare(model, optimizer, plan)
        loss_sum, batches = algo.train_epoch(Epoch(epoch=0, batches=loader, ...))
        algo.close()

    Warning:
        U must leave every block a tensor: a model whose one tensor holds more than 1/U of its
        parameters cannot have U blocks (the error names ``updaters``).
    """

    columns = (*LAPSGD.columns, "partial_share")

    def __init__(
        self,
        topology: Topology,
        *,
        updaters: int = 4,
        period: int = 16,
        switch_epoch: int = -1,
        base_batch: int = 0,
        poll_ms: float = 0.0,
        partial_start_epoch: int = -1,
        lr_boost: float = 1.25,
    ) -> None:
        super().__init__(
            topology,
            updaters=updaters,
            period=period,
            switch_epoch=switch_epoch,
            base_batch=base_batch,
            poll_ms=poll_ms,
        )
        if not isinstance(partial_start_epoch, int) or partial_start_epoch < -1:
            raise ValueError(
                f"Arg ``partial_start_epoch`` must be -1 (a tenth of the epochs) or >= 0, got {partial_start_epoch!r}."
            )
        if lr_boost <= 0:
            raise ValueError(f"Arg ``lr_boost`` must be positive, got {lr_boost}.")
        self.partial_start_epoch, self.boost = partial_start_epoch, lr_boost

    @classmethod
    def check_model(cls, knobs: dict[str, object], parameter_sizes: Callable[[], list[int]]) -> str | None:
        """U blocks of the task's model, or the reason there are none (before any process starts)."""
        try:
            contiguous_blocks(parameter_sizes(), knobs["updaters"])
        except ValueError as error:
            return f"--set updaters: {error}"
        return None

    def blocks(self, model: nn.Module) -> list[tuple[int, int]]:
        return contiguous_blocks([p.numel() for p in model.parameters()], self.updaters)

    def partial_start(self, plan: Plan) -> int | None:
        return plan.epochs // 10 if self.partial_start_epoch == -1 else self.partial_start_epoch

    def metrics(self) -> dict[str, float]:
        """As LAP-SGD, plus the share of partial updates so far."""
        stats = self.pool.stats.sum(0) if self.pool is not None else torch.zeros(3)
        return {**super().metrics(), "partial_share": (stats[2] / stats[1]).item() if stats[1] else 0.0}
