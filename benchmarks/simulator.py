"""The simulator: P asynchronous workers in one process on a virtual clock (``--set clock=simulated``).

This is how the DANA paper produced most of its results (arXiv:1907.11612, Sec. 5): one machine studies
the convergence of 4-64 workers. Worker i computes a gradient on the vector it was last sent; its
batch takes a time drawn from the straggler model (``straggler=gamma`` homogeneous, ``gamma_het``
heterogeneous, ``none`` all equal, mean ``sim_step_ms``), plus one message each way over the
inter-node link of the network ``sim_network`` (``benchmarks/virtual/network.py``; JUWELS Booster's
InfiniBand by default). The master serves gradients in arrival order with the same rules as the real parameter
server (``algorithms/async_rules.py``). The schedule depends on the seed alone, so every algorithm
run with one seed sees the same arrivals and the same lags, as in the paper.

Only the arrival order and times are simulated: every gradient is really computed, on the stale
vector, in the order the master would apply it (one gradient per master update, so a simulation
costs about what one worker's training costs, whatever P). The master's own service time is not
modelled. The synchronous reference (``allreduce``, ``ddp``) runs on the virtual cluster
(``benchmarks/virtual/``) with the same batch-time model.

The lr follows the rule of real runs (``benchmarks/config.py:lr_scale``): the parameter-server rules
apply each worker's batch as its own update at the single-worker lr, warmed up from lr / P.

The run directory is the usual one; times are simulated seconds and ``summary.json`` says
``clock: simulated``. One data stream (a shuffle per epoch) feeds the workers in dispatch order and an
epoch is M/B master updates (our readings; the paper's Sec. 5 and App. A.5 leave both open). Batch-norm
statistics are one shared set, updated by every worker's forward pass (our reading; the paper is silent).
"""

from __future__ import annotations

import heapq
import logging
import math
import platform
import sys
from pathlib import Path

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader

import algorithms
from algorithms import async_rules
from algorithms.topology import Topology
from benchmarks import devices, naming, parts, rundir, tasks
from benchmarks.config import RunConfig
from benchmarks.recorder import Recorder, evaluation_due, setup_logging
from benchmarks.schedule import LRSchedule
from benchmarks.settings import Settings
from benchmarks.stragglers import MACHINE_CV, GammaTimes
from benchmarks.virtual import network

logger = logging.getLogger("benchmarks.run")


class Clock:
    """Per-batch compute times and message times of the simulated workers, in seconds."""

    def __init__(self, s: Settings, workers: int, params: int, seed: int) -> None:
        self.mean = s.sim_step_ms / 1000.0
        self.times = GammaTimes(s.straggler, workers, self.mean, seed) if s.straggler in MACHINE_CV else None
        self.link = network.load(s.sim_network, s.sim_inter_speed).inter  # a worker and the master: two nodes
        self.bytes = 4 * params  # fp32 vectors

    def compute(self, worker: int) -> float:
        return self.times.draw(worker) if self.times is not None else self.mean

    def message(self) -> float:
        return self.link.time(self.bytes)


def simulate(cfg: RunConfig) -> int:
    """Run ``cfg`` on the virtual clock and write its run directory; returns the exit code."""
    s, h = cfg.settings, cfg.hparams
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    setup_logging(out / "log.txt")
    torch.set_num_threads(s.threads or 1)
    task = tasks.get(cfg.task)
    root = Path(s.data_root) if s.data_root else None
    train_set, val_set = task.make_datasets(root)
    device = devices.pick_device(s.device, 0)  # the logical workers' gradients on the GPU where present
    torch.manual_seed(cfg.seed)
    model = task.make_model().to(device)
    theta = parameters_to_vector(model.parameters()).detach().clone()
    workers, batch = cfg.world_size, h["batch_size"]
    updates_per_epoch = len(train_set) // batch
    if updates_per_epoch == 0:
        print(f"error: batch_size {batch} exceeds the training set", file=sys.stderr)
        return 2
    lr_factor = LRSchedule(h, updates_per_epoch, workers)  # warm-up from 1/P of the (resolved) peak
    # the algorithm as the runner builds it: its rule, its knobs as the rule takes them, its columns
    server = algorithms.build(cfg.algorithm, Topology(0, 1, workers + 1), **cfg.algorithm_params)
    master = async_rules.make_master(server.RULE, theta, workers, h["momentum"], **server.rule_knobs)
    clock = Clock(s, workers, theta.numel(), cfg.seed)
    sent = theta.repeat(workers, 1)  # what each worker computes its next gradient on
    sent_at = [0] * workers
    worker_v = torch.zeros_like(sent) if server.worker_momentum else None  # each worker's momentum
    arrivals = [(clock.compute(i) + clock.message(), i) for i in range(workers)]
    heapq.heapify(arrivals)
    val_loader = DataLoader(val_set, batch_size=256)

    rundir.write_json_atomic(out / naming.CONFIG, cfg.to_json())
    env = rundir.environment("none", "simulator", [platform.node()], device, None, torch.get_num_threads())
    source = {"sim_step_source": cfg.settings.sim_step_source}
    rundir.write_json_atomic(out / "env.json", {**env, "clock": "simulated", **source})
    record = Recorder(cfg, task, list(server.simulated_columns), writes=True, clock="simulated")
    from tqdm import tqdm

    bar = tqdm(
        total=h["epochs"] * updates_per_epoch,
        unit="update",
        desc=f"{cfg.algorithm}/{cfg.task} (simulated)",
        mininterval=1.0,
        leave=False,
    )
    data = torch.Generator().manual_seed(cfg.seed)
    now, updates, status = 0.0, 0, "completed"
    compute_s = 0.0
    logger.info(
        "%s on %s: %d simulated workers (%s), %d updates/epoch",
        cfg.algorithm,
        cfg.task,
        workers,
        s.straggler,
        updates_per_epoch,
    )
    ends = parts.part_ends(updates_per_epoch, h["evals_per_epoch"])  # where the evaluations of an epoch fall
    gap_sum, lag_sum, served = 0.0, 0.0, 0  # since the last row
    for epoch in range(h["epochs"]):
        order = torch.randperm(len(train_set), generator=data)
        loss_sum, reason = 0.0, None
        for b in range(updates_per_epoch):
            lr = h["lr"] * lr_factor(updates)
            now, i = heapq.heappop(arrivals)  # FIFO at the master = arrival order
            g, loss = _gradient(
                server, model, sent[i], task, train_set, order[b * batch : (b + 1) * batch], h["weight_decay"], device
            )
            payload = async_rules.slim_payload(worker_v[i], g, h["momentum"]) if worker_v is not None else g
            gap_sum += async_rules.gap(master.params, sent[i])
            lag_sum += updates - sent_at[i]
            served += 1
            sent[i] = master.apply(i, payload, lr)
            sent_at[i] = updates + 1
            work = clock.compute(i)
            compute_s += work
            heapq.heappush(arrivals, (now + clock.message() + work + clock.message(), i))
            loss_sum += float(loss)
            updates += 1
            bar.update()
            diverging = not math.isfinite(loss_sum)  # evaluated at once, as at an epoch's end
            if not diverging and b + 1 not in ends:
                continue
            at_end = diverging or b + 1 == updates_per_epoch
            train_loss = loss_sum / (b + 1)
            if at_end:
                master.end_epoch()
                lr_factor.end_epoch(epoch, train_loss)
                if not evaluation_due(epoch, h, train_loss):
                    break
            with torch.no_grad():
                vector_to_parameters(master.params, model.parameters())
            val_loss, val_metric = task.validate(model, val_loader, device)
            row = {
                "epoch": epoch + 1 if at_end else round(epoch + (b + 1) / updates_per_epoch, 4),
                "step": updates,
                "samples": updates * batch,
                "wall_s": now,
                "eval_s": 0.0,  # evaluating the master's model costs no simulated time
                "train_loss": train_loss,
                "val_loss": val_loss,
                "val_metric": val_metric,
                "lr": h["lr"] * lr_factor(updates),  # the next update's, as the runner logs it
                "comm_s": None,
                "gap": gap_sum / served,
                "lag": lag_sum / served,
                "sim_compute_s": compute_s,
                # a gradient to the master and a vector back per update, and each worker's first vector, at the
                # size the link model charges, shared over the P workers and the master (the mean over ranks)
                "sent_mb": (2 * updates + workers) * clock.bytes / (workers + 1) / 1e6,
            }
            gap_sum, lag_sum, served = 0.0, 0.0, 0
            if (reason := record.record(row)) is not None:
                status = "diverged" if reason == "diverged" else status
                break
            if at_end:
                break
        if reason is not None:
            break
    bar.close()
    samples = record.row.get("samples", 0)
    record.finish(status, record.fields(record.row.get("epoch", 0), updates, samples, now))
    return 0


def _gradient(server, model, point, task, train_set, indices, weight_decay, device):
    """A logical worker's gradient at ``point``, as the parameter server's workers compute theirs."""
    x, y = server.batch_at(train_set, indices)
    return server.gradient_at(model, point, task, tasks.to_device(x, device), tasks.to_device(y, device), weight_decay)
