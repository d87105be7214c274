"""One run: ``python -m benchmarks.run --algorithm A --task T --nodes N --procs-per-node G --seed S --out DIR``.

The suite's only training loop. Started plainly it checks the configuration, then starts the N×G
ranks of a virtual cluster itself; under srun, torchrun or mpirun it joins that job. Rank 0 writes
the run directory (see results/README.md). The clock follows MLPerf: it starts just before the first
training batch is read and includes evaluation; each reading is the slowest rank's.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset

import algorithms
from algorithms.topology import Topology
from benchmarks import config as config_mod
from benchmarks import dist as bootstrap
from benchmarks import rundir, tasks
from benchmarks.config import ConfigError, RunConfig
from benchmarks.stragglers import Stragglers

logger = logging.getLogger("benchmarks.run")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", help="registered algorithm name (see --list)")
    p.add_argument("--task", help="registered task name (see --list)")
    p.add_argument("--nodes", type=int, default=1, help="nodes N (virtual on one machine)")
    p.add_argument("--procs-per-node", type=int, default=1, help="processes (GPUs) per node G")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run directory to write")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a task hyper-parameter, algorithm knob or run setting (repeatable)")
    p.add_argument("--list", action="store_true", help="list algorithms and tasks with their parameters")
    return p.parse_args(argv)


def print_list() -> None:
    print("Algorithms (knobs: --set name=value):")
    for name in algorithms.names():
        knobs = ", ".join(f"{k}={d!r}" for k, (_, d) in algorithms.params(name).items()) or "-"
        print(f"  {name:<18} {algorithms.describe(name)}\n  {'':<18} knobs: {knobs}")
    print("\nTasks (hyper-parameters: --set name=value):")
    for name in tasks.names():
        t = tasks.get(name)
        data = f"reads --set data_root=DIR holding {t.data_hint}" if t.data_hint else "embedded, no download"
        print(f"  {name:<18} {t.description}\n  {'':<18} target {t.metric} {t.target}; {data}")
        print(f"  {'':<18} " + ", ".join(f"{k}={v!r}" for k, v in t.hparams.items()))
    print("\nRun settings:")
    print("  " + ", ".join(f"{k}={d!r}" for k, (_, d) in config_mod.SETTINGS.items()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.list:
        print_list()
        return 0
    try:
        missing = [f"--{k.replace('_', '-')}" for k in ("algorithm", "task", "out") if getattr(args, k) is None]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)}; see --list for the names")
        cfg = config_mod.resolve(args.algorithm, args.task, args.nodes, args.procs_per_node, args.seed,
                                 args.out, args.overrides)
        _check_out(cfg.out)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    launch = bootstrap.detect()
    if launch is None:  # started plainly: be the launcher of a virtual cluster
        cfg.out.mkdir(parents=True, exist_ok=True)
        code, reason = bootstrap.spawn_local(argv, cfg.nodes, cfg.procs_per_node, cfg.settings["threads"])
        if reason and rundir.read_summary(cfg.out) is None:
            rundir.write_json_atomic(cfg.out / "summary.json", _summary(cfg, "failed", error=reason))
        if reason:
            print(f"error: run failed: {reason}", file=sys.stderr)
        return code
    if launch.world_size != cfg.world_size:
        print(f"error: the launcher started {launch.world_size} ranks, but --nodes {cfg.nodes} x "
              f"--procs-per-node {cfg.procs_per_node} = {cfg.world_size}", file=sys.stderr)
        return 2
    return train(cfg, launch)


def _check_out(out: Path) -> None:
    summary = rundir.read_summary(out)
    if summary is not None:
        raise ConfigError(f"{out} already holds a finished run (status {summary.get('status')}); "
                          "pass another --out or delete that folder")


def _summary(cfg: RunConfig, status: str, error: str | None = None, **fields: object) -> dict[str, object]:
    task = tasks.get(cfg.task)
    identity = {k: v for k, v in cfg.to_json().items() if k not in ("hparams", "algorithm_params", "settings")}
    base = dict(time_to_target_s=None, epochs_to_target=None, final_metric=None, best_metric=None,
                final_train_loss=None, epochs=0, steps=0, samples=0, wall_s=None, throughput=None,
                comm_share=None)
    return {"status": status, **identity, **base, **fields, "metric": task.metric, "target": task.target,
            "clock": "wall", "error": error}


def lr_lambda(h: dict[str, object], steps_per_epoch: int, world_size: int):
    """Multiplier of the peak lr at each optimizer step: linear warm-up, then the schedule."""
    total = h["epochs"] * steps_per_epoch
    warmup = h["warmup_epochs"] * steps_per_epoch
    start = 1.0 / world_size  # warm-up from the single-worker lr (Goyal et al. 2017)

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        if h["schedule"] == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
        if h["schedule"] == "step":
            return h["gamma"] ** sum(step >= m * steps_per_epoch for m in h["milestones"])
        return 1.0

    return factor


def train(cfg: RunConfig, launch: bootstrap.Launch) -> int:
    s = cfg.settings
    topo = Topology(launch.rank, cfg.nodes, cfg.procs_per_node)
    master = topo.rank == 0
    out = cfg.out
    if master:
        out.mkdir(parents=True, exist_ok=True)
        _setup_logging(out / "log.txt")
    threads = s["threads"] or max(1, (os.cpu_count() or 1) // cfg.procs_per_node)
    torch.set_num_threads(threads)
    device = bootstrap.pick_device(s["device"], topo.local_rank)
    backend = bootstrap.init_process_group(launch, s["collective_timeout_s"], device.type)
    state = {"epoch": 0, "step": 0, "batches": 0, "samples": 0}
    try:
        status, fields = _train(cfg, launch, topo, device, backend, threads, state)
    except Exception as error:  # noqa: BLE001 - any failure ends the run as failed, with the reason
        logger.error("rank %d failed: %s", topo.rank, traceback.format_exc())
        if master:
            rundir.write_json_atomic(out / "summary.json", _summary(
                cfg, "failed", error=f"{type(error).__name__}: {error}", epochs=state["epoch"], steps=state["step"]))
        return 1
    if master:
        rundir.write_json_atomic(out / "summary.json", _summary(cfg, status, **fields))
        logger.info("%s: %s", status, {k: fields[k] for k in ("time_to_target_s", "best_metric", "wall_s")})
    dist.destroy_process_group()
    return 0


def _setup_logging(path: Path) -> None:
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    for handler in (logging.FileHandler(path), logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _train(cfg, launch, topo, device, backend, threads, state) -> tuple[str, dict[str, object]]:
    s, h = cfg.settings, cfg.hparams
    master, world = topo.rank == 0, topo.world_size
    task = tasks.get(cfg.task)
    root = Path(s["data_root"]) if s["data_root"] else None
    train_set, val_set = task.make_datasets(root)
    torch.manual_seed(cfg.seed)  # same initial model on every rank
    model = task.make_model().to(device)
    algo = algorithms.build(cfg.algorithm, topo, **cfg.algorithm_params)
    replicas, shard = algo.data_shard()
    sampler = DistributedSampler(train_set, num_replicas=replicas, rank=shard, shuffle=True,
                                 seed=cfg.seed, drop_last=True)
    loader = task.train_loader(train_set, sampler, h["batch_size"], model, device)
    # Each rank scores a disjoint slice of the validation set; the task reduces across the job.
    val_loader = DataLoader(Subset(val_set, range(topo.rank, len(val_set), world)), batch_size=256)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size {h['batch_size']} x {replicas} workers exceeds the training set")

    optimizer = torch.optim.SGD(model.parameters(), lr=h["lr"], momentum=h["momentum"],
                                nesterov=h["nesterov"], weight_decay=h["weight_decay"])
    lr_factor = lr_lambda(h, steps_per_epoch, replicas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    plan = algorithms.Plan(steps_per_epoch, h["epochs"], tuple(h["milestones"]) if h["schedule"] == "step" else ())
    train_model = algo.prepare(model, optimizer, plan)
    torch.manual_seed(cfg.seed * 1000 + topo.rank)  # per-rank randomness (dropout, augmentation)

    stragglers = Stragglers(s["straggler"], topo.rank, world, s["straggler_ranks"], s["straggler_delay_ms"], cfg.seed)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    run = _Recorder(cfg, algo) if master else None
    if master:
        rundir.write_json_atomic(cfg.out / "config.json", cfg.to_json())
        rundir.write_json_atomic(cfg.out / "env.json", rundir.environment(
            backend, launch.launcher, hosts, device, launch.slurm_job_id, threads))
        logger.info("%s on %s: %d nodes x %d procs (%s, %s), %d steps/epoch", cfg.algorithm, cfg.task,
                    cfg.nodes, cfg.procs_per_node, backend, launch.launcher, steps_per_epoch)

    from tqdm import tqdm

    bar = tqdm(total=h["epochs"] * steps_per_epoch, disable=not master or None, unit="step",
               desc=f"{cfg.algorithm}/{cfg.task}", mininterval=1.0, leave=False)
    dist.barrier()
    t0 = time.perf_counter()  # the clock starts before the first batch is read
    status, best, tta, epochs_to_target, row = "completed", -math.inf, None, None, {}
    for epoch in range(h["epochs"]):
        sampler.set_epoch(epoch)
        train_model.train()
        if algo.owns_loop:  # asynchronous family: the algorithm runs the epoch's batches itself
            loss_sum, batches = algo.train_epoch(algorithms.Epoch(
                epoch=epoch, batches=loader, task=task, optimizer=optimizer, lr_factor=lr_factor,
                step=state["step"], stragglers=stragglers, device=device, progress=bar.update))
        else:
            loss_sum, batches = torch.zeros((), dtype=torch.float64, device=device), 0
            for x, y in loader:
                x, y = tasks.to_device(x, device), tasks.to_device(y, device)
                stragglers.before_step(state["step"] + batches)
                optimizer.zero_grad(set_to_none=True)
                loss = task.loss(train_model(x), y)
                loss.backward()
                algo.step()
                scheduler.step()
                loss_sum += loss.detach()
                batches += 1
                bar.update()
        state["step"] += steps_per_epoch
        state["batches"] += batches
        sums = torch.tensor([float(loss_sum), float(batches)], dtype=torch.float64)
        dist.all_reduce(sums)  # job-wide mean loss, and every rank's batches (workers only, for a server)
        train_loss = sums[0].item() / max(sums[1].item(), 1.0)
        samples_done = state["samples"] = state["samples"] + int(sums[1].item()) * h["batch_size"]
        state["epoch"] = epoch + 1
        algo.end_epoch(train_loss)
        if (epoch + 1) % h["eval_every"] and epoch + 1 != h["epochs"]:
            continue
        val_loss, val_metric = task.validate(algo.eval_model(), val_loader, device)
        wall = _global_max(time.perf_counter() - t0)
        comm = _global_mean(algo.comm_s)
        row = {"epoch": epoch + 1, "step": state["step"], "samples": samples_done,
               "wall_s": wall, "train_loss": train_loss, "val_loss": val_loss, "val_metric": val_metric,
               "lr": optimizer.param_groups[0]["lr"], "comm_s": None if algo.overlaps_comm else comm,
               **algo.metrics()}
        best = max(best, val_metric)
        if tta is None and val_metric >= task.target:
            tta, epochs_to_target = wall, epoch + 1
        if master:
            run.log(row)
            bar.write(f"epoch {epoch + 1:>3}/{h['epochs']}  train_loss {train_loss:.4f}  "
                      f"val_{task.metric} {val_metric:.4f}  wall {wall:.1f}s", file=sys.stderr)
        if not math.isfinite(train_loss):
            status = "diverged"
            break
        if tta is not None and s["stop_at_target"]:
            break
    bar.close()
    algo.close()
    if master:
        run.close()
    wall = row.get("wall_s", _global_max(time.perf_counter() - t0))
    samples = state["samples"]
    return status, {
        "time_to_target_s": tta, "epochs_to_target": epochs_to_target,
        "final_metric": row.get("val_metric"), "best_metric": best if math.isfinite(best) else None,
        "final_train_loss": row.get("train_loss"), "epochs": state["epoch"], "steps": state["step"],
        "samples": samples, "wall_s": wall, "throughput": samples / wall if wall else None,
        "comm_share": (row["comm_s"] / wall) if row.get("comm_s") is not None and wall else None,
    }


def _global_mean(value: torch.Tensor | float) -> float:
    t = torch.as_tensor(value, dtype=torch.float64).reshape(1).cpu()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _global_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


class _Recorder:
    """Rank 0's sinks for metrics: metrics.csv always, wandb unless ``--set wandb=false``."""

    def __init__(self, cfg: RunConfig, algo: algorithms.Algorithm) -> None:
        self.csv = rundir.MetricsWriter(cfg.out / "metrics.csv", list(algo.metrics()))
        self.wandb = _init_wandb(cfg) if cfg.settings["wandb"] else None

    def log(self, row: dict[str, object]) -> None:
        self.csv.write(row)
        if self.wandb is not None:
            numeric = {_wandb_key(k): v for k, v in row.items() if isinstance(v, (int, float))}
            self.wandb.log(numeric, step=row["step"])

    def close(self) -> None:
        self.csv.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_key(column: str) -> str:
    keys = {"train_loss": "train/loss", "val_loss": "val/loss", "val_metric": "val/metric", "lr": "train/lr",
            "wall_s": "time/wall_s", "comm_s": "time/comm_s", "samples": "train/samples", "epoch": "epoch"}
    return keys.get(column, f"algo/{column}")


def _init_wandb(cfg: RunConfig):
    """An offline wandb run inside the run directory, grouped by suite, typed by algorithm."""
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb

        return wandb.init(
            project=cfg.settings["wandb_project"], group=cfg.settings["suite"], job_type=cfg.algorithm,
            name=cfg.run_id, tags=[cfg.task, f"nodes={cfg.nodes}", f"procs_per_node={cfg.procs_per_node}"],
            config=cfg.to_json(), dir=str(cfg.out), mode=os.environ.get("WANDB_MODE", cfg.settings["wandb_mode"]),
        )
    except Exception as error:  # noqa: BLE001 - wandb trouble must not cost the run
        logger.warning("wandb disabled for this run: %s", error)
        return None


if __name__ == "__main__":
    sys.exit(main())
