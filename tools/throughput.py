"""Step throughput of each algorithm against the same loop with no communication at all.

    python -m tools.throughput [--task mnist1d] [--algorithms ddp allreduce] [--world 2 4]
                                    [--nodes 2] [--set key=value ...] [--stragglers K --delay-ms D]

For each world size W it starts W gloo processes on this machine (``--nodes`` virtual nodes of W/N
processes) and times ``--steps`` training steps after ``--warmup`` untimed ones, for the bare loop
(``optimizer.step()`` only, "none") and for each algorithm, in one process group so they share the
conditions; an algorithm that owns its loop (LAP/LPP-SGD) gets the warm-up and the timed steps as
two epochs of batches. It prints samples per second over all workers, the ratio to "none", and the implied
share of a step spent communicating (1 - ratio). Samples count the workers only: a parameter
server's master computes no gradient, and its rate is the gradients it applied per second. Repeat ``--repeats`` times and compare ratios
within one invocation: on a shared 2-core machine absolute numbers move by ±20 %. The timed steps
form one epoch, so schedule-driven algorithms are measured in their steady state: post-local SGD
after its switch, DASO in its cycling phase (the default ``--set`` turns its blocking warm-up and
cool-down off), PowerSGD compressing from its second step and DiLoCo averaging every 10 steps; a
``--set`` key goes to the algorithms that know it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

import algorithms
from algorithms.topology import Topology
from benchmarks import tasks
from benchmarks.config import coerce
from benchmarks.stragglers import Stragglers


def _time_steps(
    rank: int,
    world: int,
    nodes: int,
    task_name: str,
    name: str,
    steps: int,
    warmup: int,
    knobs: dict[str, object],
    straggle: tuple[int, float, int],
) -> tuple[float, int]:
    """``(seconds, samples)`` of ``steps`` steps per worker of ``name`` ("none" = no communication):
    the slowest rank's time and the samples all workers computed gradients on in it."""
    task = tasks.get(task_name)
    train_set, _ = task.make_datasets(None)
    batch = task.hparams["batch_size"]
    torch.manual_seed(0)
    model = task.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if name == "none":
        train_model, step, workers = model, optimizer.step, range(world)
    else:
        algo = algorithms.build(name, Topology(rank, nodes=nodes, procs_per_node=world // nodes), **knobs)
        plan = algorithms.Plan(steps_per_epoch=warmup + steps, epochs=1)
        train_model, step, workers = algo.prepare(model, optimizer, plan), algo.step, algo.worker_ranks()
    kind, delay_ms, seed = straggle
    stragglers = Stragglers("fixed" if kind else "none", rank, workers, kind, delay_ms, seed=seed)
    x_all, y_all = train_set[:][0], train_set[:][1]
    g = torch.Generator().manual_seed(rank)
    samples = steps * batch * len(workers)
    if name != "none" and algo.owns_loop:  # asynchronous family: it runs the batches itself, one epoch each

        def epoch(index: int, n: int, first: int) -> int:
            if len(workers) < world:  # a parameter server deals one stream: n batches per worker
                picks = torch.randint(0, len(y_all), (n * len(workers) * batch,), generator=torch.Generator())
                batches = DataLoader(TensorDataset(x_all[picks], y_all[picks]), batch_size=batch)
            else:  # Hogwild updaters: n batches on every rank
                picks = [torch.randint(0, len(y_all), (batch,), generator=g) for _ in range(n)]
                batches = [(x_all[idx], y_all[idx]) for idx in picks]
            _, done = algo.train_epoch(
                algorithms.Epoch(
                    epoch=index,
                    batches=batches,
                    task=task,
                    optimizer=optimizer,
                    lr_factor=lambda s: 1.0,
                    step=first,
                    stragglers=stragglers,
                    device=torch.device("cpu"),
                    progress=lambda n: None,
                )
            )
            return done

        epoch(0, warmup, 0)
        dist.barrier()
        start = time.perf_counter()
        done = epoch(1, steps, warmup)
        if len(workers) < world:  # the master's count of the updates (gradients) it applied
            total = torch.tensor([float(done)])
            dist.all_reduce(total)
            samples = int(total.item()) * batch
    for i in range(warmup + steps) if name == "none" or not algo.owns_loop else ():
        if i == warmup:
            dist.barrier()
            start = time.perf_counter()
        idx = torch.randint(0, len(y_all), (batch,), generator=g)
        stragglers.before_step(i)
        optimizer.zero_grad(set_to_none=True)
        task.loss(train_model(x_all[idx]), y_all[idx]).backward()
        step()
    elapsed = torch.tensor([time.perf_counter() - start])
    if name != "none":
        algo.close()
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item(), samples


def _worker(rank: int, world: int, store: str, args: argparse.Namespace, results) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    for repeat in range(args.repeats):
        for name in ["none", *args.algorithms]:
            nodes = args.nodes if world % args.nodes == 0 else 1
            seconds, samples = _time_steps(
                rank,
                world,
                nodes,
                args.task,
                name,
                args.steps,
                args.warmup,
                args.knobs.get(name, {}),
                (args.stragglers, args.delay_ms, repeat),
            )
            if rank == 0:
                results.append((repeat, name, seconds, samples / seconds))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="mnist1d")
    p.add_argument("--algorithms", nargs="+", default=[n for n in algorithms.names()])
    p.add_argument("--world", nargs="+", type=int, default=[2, 4])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nodes", type=int, default=2, help="virtual nodes (1 where W is not a multiple)")
    p.add_argument("--stragglers", type=int, default=0, help="ranks delayed at every step (WAGMA's imbalance)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="delay of each delayed rank")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        # the steady state: DASO cycling, PowerSGD compressing, DiLoCo's outer steps within the timed ones
        default=["sync_warmup_epochs=0", "sync_cooldown_epochs=0", "start_powerSGD_iter=2", "inner_steps=10"],
    )
    args = p.parse_args(argv)
    args.knobs = {}
    for name in args.algorithms:  # fail on a bad name or knob before starting processes
        knobs = algorithms.params(name)
        mine = [o.partition("=") for o in args.overrides if o.partition("=")[0] in knobs]
        args.knobs[name] = {k: coerce(k, v, knobs[k][0]) for k, _, v in mine}
    batch = tasks.get(args.task).hparams["batch_size"]
    print(
        f"task {args.task}, batch {batch} per worker, {args.steps} timed steps, median of {args.repeats}, "
        f"{args.nodes} virtual nodes, {os.cpu_count()} cores"
        + (f", {args.stragglers} rank(s) delayed {args.delay_ms:g} ms per step" if args.stragglers else "")
    )
    print(f"{'world':>5} {'algorithm':<15} {'samples/s':>10} {'vs none':>8} {'comm share':>10}")
    for world in args.world:
        with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
            results = manager.list()
            mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), args, results), nprocs=world)
            rows = list(results)
        names = ["none", *args.algorithms]
        rate = {n: statistics.median(x for _, m, _, x in rows if m == n) for n in names}
        ratios = {
            n: statistics.median(
                x / b for (r, m, _, x) in rows if m == n for (r2, m2, _, b) in rows if m2 == "none" and r2 == r
            )
            for n in names
        }
        for name in names:
            print(f"{world:>5} {name:<15} {rate[name]:>10.0f} {ratios[name]:>8.2f} {1 - ratios[name]:>10.0%}")


if __name__ == "__main__":
    main()
