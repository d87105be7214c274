"""The objects one rank trains with, built in the order a run needs them (``set_up``).

The training loop (``benchmarks/run.py``) calls ``set_up`` once per rank, after the process group
is up: the CPU side channel, the data, the model (the same on every rank: the run's seed), the
algorithm and the model it trains, the loaders, the optimizer and its lr schedule, the stragglers
and the checkpoint saver. Every collective of the default group comes after every rank has its data
and model; the per-rank randomness (dropout, augmentation) is seeded last.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

import algorithms
from algorithms import comm
from algorithms.topology import Topology
from benchmarks import checkpoint, launcher, tasks
from benchmarks.clock import WallClock
from benchmarks.config import ConfigError, RunConfig
from benchmarks.schedule import LRSchedule, make_optimizer
from benchmarks.stragglers import MACHINE_CV, Stragglers
from benchmarks.virtual import job

Clock = WallClock | job.VirtualClock  # a real job's, or a rank's on the virtual cluster


@dataclasses.dataclass
class Training:
    """What ``set_up`` builds on this rank for the loop: its place, the task, the clock, the algorithm
    and the model it trains, the optimizer and lr schedule, the data, the stragglers, the saver."""

    topo: Topology
    task: tasks.Task
    device: torch.device
    now: Clock
    control: dist.ProcessGroup  # the CPU side channel (also on NCCL jobs): start-up, stop flag, checkpoints
    algo: algorithms.Algorithm
    train_model: torch.nn.Module  # what the algorithm's ``prepare`` returned: the model the loop runs
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: checkpoint.ResumableSampler
    loader: DataLoader
    val_part: Subset  # this rank's slice of the validation set
    val_loader: DataLoader
    stragglers: Stragglers
    stop: checkpoint.StopRequest  # a time-limit signal, agreed over ``control``
    saver: checkpoint.Saver


def set_up(
    cfg: RunConfig,
    launch: launcher.Launch,
    task: tasks.Task,
    device: torch.device,
    now: Clock,
    threads: int,
    stop: checkpoint.StopRequest,
) -> Training:
    """Build the run on this rank: data, model, algorithm, loaders, optimizer, stragglers and saver;
    every rank starts from the same model (the seed), then draws its own randomness."""
    in_virtual, s, h = launch.launcher == "virtual", cfg.settings, cfg.hparams
    topo = Topology(launch.rank, cfg.nodes, cfg.procs_per_node)
    timeout = datetime.timedelta(seconds=s.collective_timeout_s)
    control = dist.new_group(backend=comm.side_backend(), timeout=timeout)
    comm.set_sent_bytes(0.0)  # the algorithm's bytes from here on; a resume restores its count
    root = Path(s.data_root) if s.data_root else None
    train_set, val_set = now.shared(("datasets", cfg.task, root), lambda: task.make_datasets(root))
    torch.manual_seed(cfg.seed)  # same initial model on every rank
    model = task.make_model().to(device)
    now.size_messages(model)  # the virtual cluster may charge a paper's model size on the wire
    # Every rank has its data and model before the first collective of the default group (the
    # algorithm's groups, the initial broadcast): NCCL's would time out on the slowest lister.
    patience = datetime.timedelta(seconds=max(launcher.STARTUP_TIMEOUT_S, s.collective_timeout_s))
    if in_virtual:  # no rank can be late to start on the virtual cluster
        dist.barrier(group=control)
    else:
        dist.monitored_barrier(group=control, timeout=patience, wait_all_ranks=True)
    algo = algorithms.build(cfg.algorithm, topo, **cfg.algorithm_params)
    if in_virtual:  # its communication timers read the virtual clock
        algo.clock = now
    replicas, shard = algo.data_shard()
    sampler = checkpoint.ResumableSampler(
        train_set, num_replicas=replicas, rank=shard, shuffle=True, seed=cfg.seed, drop_last=True
    )
    # DataLoader worker processes; none for the virtual cluster's threads
    decoders = 0 if in_virtual else tasks.loader_workers(task, threads, launch.local_size)
    loader = task.train_loader(train_set, sampler, h["batch_size"], model, device, decoders)
    # Each rank scores a disjoint slice of the validation set; the task reduces across the job.
    val_part = Subset(val_set, range(topo.rank, len(val_set), topo.world_size))
    val_loader = DataLoader(val_part, batch_size=256, **tasks.loader_options(decoders, device))
    if len(loader) == 0:
        raise ConfigError(f"batch_size {h['batch_size']} x {replicas} workers exceeds the training set")
    optimizer = make_optimizer(model.parameters(), h)
    workers = algo.worker_ranks()
    schedule = LRSchedule(h, len(loader), len(workers))
    # A plain function, which LambdaLR leaves out of its state: the checkpoint saves the schedule itself.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule(step))
    milestones = tuple(h["milestones"]) if h["schedule"] == "step" else ()
    plan = algorithms.Plan(len(loader), h["epochs"], milestones, h["warmup_epochs"], cfg.seed)
    train_model = algo.prepare(model, optimizer, plan)
    if in_virtual:  # DDP's all-reduce overlaps backward on the virtual clock as on a GPU
        now.overlap_backward(train_model)
    torch.manual_seed(cfg.seed * 1000 + topo.rank)  # per-rank randomness (dropout, augmentation)
    stop.connect(control)
    # On the virtual clock a gamma straggler model draws the batch times themselves (VirtualClock).
    kind = "none" if in_virtual and s.straggler in MACHINE_CV else s.straggler
    stragglers = Stragglers(
        kind, topo.rank, workers, s.straggler_ranks, s.straggler_delay_ms, cfg.seed, device, now.sleep
    )
    # The saver restores after prepare(), so that each rank gets back its own model, not rank 0's broadcast.
    stateful = dict(model=model, optimizer=optimizer, scheduler=scheduler, schedule=schedule, algorithm=algo)
    saver = checkpoint.Saver(cfg.out, topo.rank, topo.world_size, stateful, control)
    return Training(
        topo, task, device, now, control, algo, train_model, optimizer, schedule, scheduler, sampler, loader,
        val_part, val_loader, stragglers, stop, saver,
    )  # fmt: skip
