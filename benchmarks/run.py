"""One run: ``python -m benchmarks.run --algorithm A --task T --nodes N --procs-per-node G --seed S --out DIR``.

The suite's training loop. Started plainly it checks the configuration, then starts the N×G ranks
of a virtual cluster itself; under srun, torchrun or mpirun it joins that job; with
``--set clock=simulated`` it hands the run to the simulator. ``train`` reads top to bottom: the
rank's objects built (``benchmarks/training.py``), the step loop (``run_part``), ``evaluate``,
``save``, ``finish``. Rank 0 writes the run directory (results/README.md) through the recorder. The run evaluates at each epoch's
end, or ``evals_per_epoch`` times in it (``benchmarks/parts.py``). The clock follows MLPerf: it starts
just before the first batch is read and includes evaluation; each reading is the slowest rank's.

Checkpoint and resume (``benchmarks/checkpoint.py``): every ``checkpoint_every`` epochs, and when
SIGTERM or SIGUSR1 (Slurm's time-limit warning, ``scancel``) arrives, at a step all ranks agree on,
each rank saves its model, optimizer, lr schedule, algorithm state, RNG and data position; the run
then ends as ``timeout`` with exit code 75. The same command run again resumes there: the data order
skips the batches done, the clock goes on from the seconds already spent (saving is not counted),
metrics.csv is appended to. Exit codes: 0 completed or diverged, 1 failed, 2 bad input, 75 timeout.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

import algorithms
from algorithms import comm
from benchmarks import EXIT_TIMEOUT, checkpoint, launcher, listing, parts, rundir, simulator, tasks, wandb_records
from benchmarks import config as config_mod
from benchmarks.clock import WallClock, all_reduce_numbers, global_max, global_mean, loss_accumulator, slowest
from benchmarks.config import ConfigError, RunConfig
from benchmarks.devices import pick_device
from benchmarks.naming import CONFIG, SUMMARY
from benchmarks.recorder import Recorder, evaluation_due, setup_logging
from benchmarks.spawn import run_locally
from benchmarks.training import Clock, Training, set_up
from benchmarks.virtual import job

logger = logging.getLogger("benchmarks.run")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", help="registered algorithm name (see --list)")
    p.add_argument("--task", help="registered task name (see --list)")
    p.add_argument("--nodes", type=int, default=1, help="nodes N (virtual on one machine)")
    p.add_argument("--procs-per-node", type=int, default=1, help="processes (GPUs) per node G")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run directory to write")
    knob = "override a task hyper-parameter, algorithm knob or run setting (repeatable)"
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=knob)
    deferred = "leave the run's wandb record to `python -m benchmarks.wandb_records` (the workflow's, for all runs)"
    p.add_argument("--defer-wandb", action="store_true", help=deferred)
    p.add_argument("--keep-finished", action="store_true", help="exit 0 on a finished run's folder (the workflow's)")
    p.add_argument("--list", action="store_true", help="list algorithms and tasks with their parameters")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.list:
        print(listing.listing())
        return 0
    try:
        missing = [f"--{k.replace('_', '-')}" for k in ("algorithm", "task", "out") if getattr(args, k) is None]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)}; see --list for the names")
        cfg = config_mod.resolve(
            args.algorithm, args.task, args.nodes, args.procs_per_node, args.seed, args.out, args.overrides
        )
        started = launcher.detect()  # once: under mpirun and horovodrun it meets the other ranks
        config_mod.check_launch(cfg, started)
        if rundir.take(
            cfg.out, started is None or (started.launcher != "local" and started.rank == 0), args.keep_finished
        ):
            return 0
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if cfg.settings.simulated:  # one process: the algorithm's own simulator (SIMULATORS)
        code = SIMULATORS[algorithms.get(cfg.algorithm).simulator](cfg)
    elif (launch := started) is None:  # started plainly: be the launcher of a virtual cluster
        code = run_locally(main, argv, cfg)
    elif launch.world_size != cfg.world_size:
        sizes = f"--nodes {cfg.nodes} x --procs-per-node {cfg.procs_per_node} = {cfg.world_size}"
        print(f"error: the launcher started {launch.world_size} ranks, but {sizes}", file=sys.stderr)
        return 2
    else:
        code = train(cfg, launch)
        # Only now, with train's frame gone: DDP's reducer holds the group, and the last reference to a
        # gloo group dropped while the GIL is held joins its worker thread, which may wait for the GIL
        # to free a finished work's tensors: a deadlock, were it dropped inside train.
        if code != 1:
            launcher.end_rank(launch.rank)
        if launch.rank != 0 or launch.launcher == "local":  # the local launcher writes the record
            return code
    # The run has ended (or stopped at a time limit, when nothing is written): its wandb record, made
    # from its files by the one process that outlives its ranks, off the clock.
    if not args.defer_wandb:
        wandb_records.write_safely(cfg.out)
    return code


def train(cfg: RunConfig, launch: launcher.Launch, clock: Clock | None = None) -> int:
    """Train on this rank; 0 when the run completed or diverged, 1 when it failed, ``EXIT_TIMEOUT`` (75)
    when SIGTERM or SIGUSR1 stopped it at a checkpoint (resumed by running the same command again).
    ``clock`` is the wall clock, or a rank's clock on the virtual cluster (``launch.launcher`` virtual).

    It reads top to bottom: set-up (``set_up``, then resume), the epochs, each in parts of steps
    (``run_part``) that end at an evaluation (``evaluate``), a checkpoint (``save``) at a stop or every
    ``checkpoint_every`` epochs, and the end: the summary, or a failure's.
    """
    in_virtual = launch.launcher == "virtual"
    stop = checkpoint.StopRequest(signals=not in_virtual)  # first: a time-limit signal from now on stops cleanly
    h, rank, master = cfg.hparams, launch.rank, launch.rank == 0
    if master:
        cfg.out.mkdir(parents=True, exist_ok=True)
        setup_logging(cfg.out / "log.txt")
    device = pick_device(cfg.settings.device, launch.local_rank)
    # The ranks on this machine share its CPUs (all of them under the local launcher, whatever its virtual
    # nodes); the virtual cluster runs one rank at a time: each gets the machine.
    ranks_here = 1 if in_virtual else launch.local_size
    task = tasks.get(cfg.task)
    threads = cfg.settings.threads or tasks.default_threads(ranks_here, device, task)
    torch.set_num_threads(threads)
    now = clock or WallClock(device)
    backend = launcher.init_process_group(launch, cfg.settings.collective_timeout_s, device)
    loop, record = checkpoint.Loop(), None
    try:
        run = set_up(cfg, launch, task, device, now, threads, stop)
        algo, steps_per_epoch = run.algo, len(run.loader)
        resume = run.saver.restore()
        columns = [*algo.metric_columns(), *now.columns]
        record = Recorder(cfg, task, columns, writes=master, clock=now.kind, resume=resume and resume.record)
        if resume is not None:
            loop = resume.loop
            record.load_state_dict(resume.recorder)
        if master:  # a timeout's summary (a finished run's was refused): the run goes on
            (cfg.out / SUMMARY).unlink(missing_ok=True)
        hosts = launcher.host_names()
        if master:
            rundir.write_json_atomic(cfg.out / CONFIG, cfg.to_json())
            env = rundir.environment(backend, launch.launcher, hosts, device, launch.slurm_job_id, threads)
            env.update(now.describe())  # the virtual cluster's time model
            rundir.write_json_atomic(cfg.out / "env.json", env)
            resumed = f", resumed at epoch {loop.epoch} batch {resume.batch}" if resume else ""
            logger.info(
                f"{cfg.algorithm} on {cfg.task}: {cfg.nodes} nodes x {cfg.procs_per_node} procs "
                f"({'the virtual cluster' if in_virtual else f'{backend}, {launch.launcher}'}), {steps_per_epoch} steps/epoch{resumed}"
            )
        skip = resume.batch if resume else 0  # batches of the first epoch done before the checkpoint
        shown = dict(unit="step", desc=f"{cfg.algorithm}/{cfg.task}", mininterval=1.0, leave=False)
        bar = tqdm(total=h["epochs"] * steps_per_epoch, initial=loop.step + skip, disable=not master or None, **shown)
        if resume is not None:
            checkpoint.set_rng_state(resume.rng_epoch)
        dist.barrier()
        # The clock starts before the first batch is read; a resumed run's clock goes on where it stopped.
        t0 = now() - (resume.record["wall_s"] if resume else 0.0)

        status, steps, reason = "completed", None, None
        ends = parts.part_ends(steps_per_epoch, h["evals_per_epoch"])  # where the evaluations of an epoch fall
        for epoch in range(loop.epoch, h["epochs"]):
            run.sampler.set_epoch(epoch)
            rng_epoch = checkpoint.rng_state()  # iter(loader) draws from it; a mid-epoch resume replays the draw
            run.train_model.train()
            loss_sum = loss_accumulator(resume.loss_sum if skip else None, device)
            batches, run.sampler.skip = skip, skip * h["batch_size"]
            data = parts.EpochBatches(run.loader)
            if skip:
                data.start()  # drawn now, as the checkpointed epoch drew it
                checkpoint.set_rng_state(resume.rng)
            done, skip, stopping = skip, 0, False
            for end in [e for e in ends if e >= done]:  # a part, then its evaluation (first, if resumed at its end)
                part, first, done = data.part(end - done), done, end
                loss_sum, batches, stopping = run_part(run, part, epoch, loop.step, first, loss_sum, batches, bar)
                if stopping:
                    break
                # the job-wide mean loss of the epoch so far, and every rank's batches
                sums = all_reduce_numbers([float(loss_sum), float(batches)])
                train_loss = sums[0].item() / max(sums[1].item(), 1.0)
                samples = loop.samples + int(sums[1].item()) * h["batch_size"]
                if end == steps_per_epoch:  # the epoch's end
                    loop = checkpoint.Loop(epoch + 1, loop.step + steps_per_epoch, loop.batches + batches, samples)
                    algo.end_epoch(train_loss)
                    if run.schedule.end_epoch(epoch, train_loss):  # the lr dropped: the next step already uses it
                        for group, base in zip(run.optimizer.param_groups, run.scheduler.base_lrs):
                            group["lr"] = base * run.schedule(loop.step)
                    if not evaluation_due(epoch, h, train_loss):
                        continue
                row = {
                    "epoch": epoch + 1 if end == steps_per_epoch else round(epoch + end / steps_per_epoch, 4),
                    "step": loop.step if end == steps_per_epoch else loop.step + end,
                    "samples": samples,
                    "train_loss": train_loss,
                    **evaluate(run, record, t0),
                }
                if (reason := record.record(row)) is not None:  # the target, or diverged: where the run ends
                    status = "diverged" if reason == "diverged" else status
                    loop.epoch, loop.step, loop.samples = row["epoch"], row["step"], samples
                    break
            if stopping:  # a time limit mid-epoch: checkpoint here, end as timeout
                logger.info("rank %d: %s at epoch %d batch %d; checkpointing", rank, stop.name, epoch, batches)
                t0 += save(run, record, loop, t0, batch=batches, loss_sum=loss_sum, rng_epoch=rng_epoch)
                status, steps = "timeout", loop.step + batches
            if stopping or reason is not None or epoch + 1 == h["epochs"]:
                break
            stopping = stop.agreed(drain=True)  # every flag so far: owns_loop algorithms stop here
            every = cfg.settings.checkpoint_every
            if stopping or (every and (epoch + 1) % every == 0):  # at the epoch's end: no batch of the next yet
                zero = torch.zeros((), dtype=torch.float64)
                t0 += save(run, record, loop, t0, batch=0, loss_sum=zero, rng_epoch=checkpoint.rng_state())
            if stopping:
                logger.info("rank %d: %s at the end of epoch %d; checkpointed", rank, stop.name, epoch + 1)
                status, steps = "timeout", loop.step
                break
        bar.close()
        algo.close()
        # A timeout's clock is the time so far; the others end at their last evaluation.
        end = global_max(now() - t0)
        wall = end if status == "timeout" else record.row.get("wall_s", end)
        fields = record.fields(loop.epoch, loop.step if steps is None else steps, loop.samples, wall)
        stop.close()
    except Exception as error:  # noqa: BLE001 - any failure ends the run as failed, with the reason
        logger.error("rank %d failed: %s", rank, traceback.format_exc())
        if master:
            reason = f"{type(error).__name__}: {error}"
            rundir.write_summary(cfg, "failed", error=reason, epochs=loop.epoch, steps=loop.step)
        try:  # after the summary, which says what failed
            if record is not None:
                record.close()
        except Exception:  # noqa: BLE001
            logger.warning("rank %d: closing metrics.csv failed too: %s", rank, traceback.format_exc())
        return 1
    return finish(cfg, run, record, status, fields)


def run_part(
    run: Training,
    part: parts.Part,
    epoch: int,
    step: int,
    first: int,
    loss_sum: torch.Tensor,
    batches: int,
    bar: tqdm,
) -> tuple[torch.Tensor, int, bool]:
    """Train on one part of an epoch (``first`` batches into it, epoch ``epoch`` starting at step
    ``step``); return the epoch's loss sum and this rank's batches so far, and whether the ranks agreed
    to stop (a time limit) after a batch."""
    algo, device = run.algo, run.device
    if algo.owns_loop:  # asynchronous family: the algorithm runs the part's batches itself
        work = (epoch, part, run.task, run.optimizer, run.schedule, step + first, run.stragglers, device, bar.update)
        part_loss, ran = algo.train_epoch(algorithms.Epoch(*work))
        return loss_sum + part_loss, batches + ran, False
    for x, y in part:
        x, y = tasks.to_device(x, device), tasks.to_device(y, device)
        run.stragglers.before_step(step + batches)
        run.optimizer.zero_grad(set_to_none=True)
        loss = run.task.loss(run.train_model(x), y)
        loss.backward()
        run.now.compute()  # on the virtual clock: the batch's compute time, from the time model
        algo.step()
        run.scheduler.step()
        loss_sum += loss.detach()
        batches += 1
        bar.update()
        if run.stop.agreed():
            return loss_sum, batches, True
    return loss_sum, batches, False


def evaluate(run: Training, record: Recorder, t0: float) -> dict[str, object]:
    """Evaluate the algorithm's model; return metrics.csv's measured fields (clock ``t0``), each time
    the slowest rank's and each counter the job's mean."""
    now, algo = run.now, run.algo
    evaluated = now()
    with comm.uncounted():  # evaluating is not the algorithm's traffic
        spread = algo.model_spread() if algo.tracks_spread else None  # before any averaging
        now.evaluate(len(run.val_part) / record.cfg.hparams["batch_size"])  # the virtual clock's forward passes
        val_loss, val_metric = run.task.validate(algo.eval_model(), run.val_loader, run.device)
    record.eval_s, elapsed = record.eval_s + now() - evaluated, now() - t0
    clock_s, train_s = slowest(elapsed, elapsed - record.eval_s)  # the run's clock and training
    return {
        "wall_s": clock_s,
        "eval_s": clock_s - train_s,
        "val_loss": val_loss,
        "val_metric": val_metric,
        "lr": run.optimizer.param_groups[0]["lr"],
        "comm_s": None if algo.overlaps_comm else global_mean(algo.comm_s),
        "sent_mb": global_mean(comm.sent_bytes()) / 1e6,
        **algo.metrics(),
        **now.breakdown(),
        **({"spread": spread} if algo.tracks_spread else {}),
    }


def save(
    run: Training,
    record: Recorder,
    loop: checkpoint.Loop,
    t0: float,
    *,
    batch: int,
    loss_sum: torch.Tensor,
    rng_epoch: dict[str, object],
) -> float:
    """Checkpoint ``batch`` batches into epoch ``loop.epoch``; return the seconds it took (saving is
    not training: the run's clock pauses for them)."""
    now = run.now
    with comm.uncounted():  # on the clock: it may wait for communication in flight
        algorithm_state = run.algo.state_dict()
    start = now()
    runner = {**dataclasses.asdict(loop), **record.state_dict()}
    extra = dict(algorithm=algorithm_state, runner=runner, batch=batch, loss_sum=loss_sum, rng_epoch=rng_epoch)
    wall, written = global_max(start - t0), record.metrics_bytes()
    position = dict(step=loop.step + batch, epoch=loop.epoch, batch=batch, wall_s=wall, metrics_bytes=written)
    run.saver.save(extra, position)
    pause = now() - start
    if run.topo.rank == 0:
        logger.info("checkpoint at epoch %d batch %d saved in %.3f s", loop.epoch, batch, pause)
    return pause


def finish(cfg: RunConfig, run: Training, record: Recorder, status: str, fields: dict[str, object]) -> int:
    """Write the summary (it marks the run done), drop a finished run's checkpoint, and wait for every
    rank, so that no crash in a rank's teardown can race the run's final files; return the exit code."""
    record.finish(status, fields)
    if run.topo.rank == 0 and status != "timeout":  # the summary marks the run done: its checkpoint has served
        checkpoint.remove(cfg.out)
    code = EXIT_TIMEOUT if status == "timeout" else 0
    try:
        dist.barrier(group=run.control)
    except Exception:  # noqa: BLE001 - a rank gone after its summary: the run stands
        logger.warning("rank %d: a rank left before the run's end: %s", run.topo.rank, traceback.format_exc())
    return code


# By the class's ``simulator``: this runner's ranks as threads on the virtual cluster, or a PS's arrival order.
SIMULATORS = {"virtual": lambda cfg: job.run_job(cfg, train, launcher.virtual), "arrivals": simulator.simulate}


if __name__ == "__main__":
    launcher.exit_process(main())
