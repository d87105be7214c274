"""What simulating costs: the machine time of one worker-step on the virtual cluster, against one real
process's training step on the same task.

    python -m benchmarks.virtual_cost [--task digits] [--algorithms allreduce wagma] [--layouts 2x2 16x4]

Both are measured the same way, through the runner: the difference in machine time between two runs
``--epochs`` apart, divided by the worker-steps that difference adds (steps x ranks), so that
start-up cost cancels. Each run evaluates once, at its end (``eval_every`` past both), so that the
evaluations cancel too: an evaluation is not a step, and it is paid per rank and per evaluation,
which a real cluster's ranks pay alike (each its shard of the validation set and its copy of the
averaged model), but which a 64-rank epoch of 9 steps would spread over 9 steps where the real
single process's 625-step epoch spreads it over 625. The real step is one process
(1 x 1, allreduce: no communication), one thread; the simulated ranks get one thread too. The ratio
is what a simulated experiment costs per worker-step beyond running its batches one by one.

Machine time is CPU seconds (user + system, of this process and of the ranks it launched and
waited for), which is what a simulation costs its machine: wall-clock seconds on a shared machine
measure its other jobs too (one pair of short real runs moved from 4.9 to 8.2 ms a wall-clock step
between three measurements beside a test run). On a quiet machine the two agree, since one rank
thread of the simulation runs at a time; the wall-clock ratio is printed beside. Each is measured
``--repeats`` times and the median taken, with the range beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from algorithms import comm
from benchmarks import cluster, config, run, tasks, virtual


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_run(
    algorithm: str, task: str, nodes: int, ppn: int, epochs: int, sets: list[str]
) -> tuple[float, float, dict]:
    """CPU seconds and wall-clock seconds of one run of the runner, and its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = ["--algorithm", algorithm, "--task", task, "--nodes", str(nodes), "--procs-per-node", str(ppn)]
        argv += ["--out", str(out), "--set", "wandb=false", "--set", f"epochs={epochs}", "--set", "checkpoint_every=0"]
        argv += ["--set", "eval_every=1000"]  # one evaluation, after the last epoch (see the module's docstring)
        for item in config.overrides_for(algorithm, task, sets):  # an algorithm's knob goes to its runs only
            argv += ["--set", item]
        cpu, start = cpu_seconds(), time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            code = run.main(argv)
        cpu, wall = cpu_seconds() - cpu, time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"{algorithm} {nodes}x{ppn} failed: see `python -m benchmarks.run {' '.join(argv)}`")
        return cpu, wall, json.loads((out / "summary.json").read_text())


def step_seconds(
    algorithm: str, task: str, nodes: int, ppn: int, epochs: tuple[int, int], sets: list[str]
) -> tuple[float, float]:
    """CPU and wall-clock seconds per worker-step: the difference between two runs ``epochs`` apart,
    over the worker-steps it adds (start-up and the one evaluation cancel)."""
    short_cpu, short_wall, _ = timed_run(algorithm, task, nodes, ppn, epochs[0], sets)
    long_cpu, long_wall, summary = timed_run(algorithm, task, nodes, ppn, epochs[1], sets)
    worker_steps = (epochs[1] - epochs[0]) * summary["steps"] // summary["epochs"] * nodes * ppn
    return (long_cpu - short_cpu) / worker_steps, (long_wall - short_wall) / worker_steps


def own_costs(task: str, nodes: int, ppn: int, repeats: int = 200) -> dict[str, float]:
    """CPU microseconds a rank of the virtual cluster spends on its bookkeeping, apart from tensors:
    a hand-off to the next rank (``advance``), an all-reduce of 10 floats; and an all-reduce of the
    task's model (``flat_average_``), beside the same flatten, divide and copy back on one model in
    one process, whose difference is the memory traffic of P models through one machine."""
    torch.set_num_threads(1)  # as the measured runs (threads=1)
    model = tasks.get(task).make_model()
    shapes = [p.shape for p in model.parameters()]
    times: dict[str, float] = {}

    def body(rank: int, cluster: virtual.Cluster) -> None:
        virtual.init_process_group(rank, cluster)
        params = [torch.zeros(s) for s in shapes]
        small = torch.zeros(10)
        for name, work in (
            ("hand-off", lambda: cluster.scheduler.advance(1e-3)),
            ("all-reduce of 10 floats", lambda: dist.all_reduce(small)),
            ("all-reduce of the model", lambda: comm.flat_average_(params)),
        ):
            start = time.process_time()  # the process's: the ranks' threads run one at a time
            for _ in range(repeats):
                work()
            if rank == 0:
                times[name] = (time.process_time() - start) / (repeats * nodes * ppn) * 1e6

    virtual.run(nodes * ppn, ppn, cluster.network("juwels_booster"), body)
    params = [torch.zeros(s) for s in shapes]
    start = time.process_time()
    for _ in range(repeats):
        comm.unflatten_into(comm.flatten(params).div_(nodes * ppn), params)
    times["the same on one model, one process"] = (time.process_time() - start) / repeats * 1e6
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.virtual_cost", description=__doc__.splitlines()[0])
    p.add_argument("--task", default="digits")
    p.add_argument("--algorithms", nargs="+", default=["allreduce", "dpsgd", "wagma"])
    p.add_argument("--layouts", nargs="+", default=["2x2", "4x4"], help="NxG: nodes x processes per node")
    p.add_argument("--epochs", type=int, nargs=2, default=[1, 4], help="the two runs' epochs")
    p.add_argument("--repeats", type=int, default=5, help="measurements of each, of which the median counts")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    sets = ["threads=1", "stop_at_target=false", *args.sets]
    timed_run("allreduce", args.task, 1, 1, 1, sets)  # a first run pays the imports (torch._dynamo): not timed

    def measured(algorithm: str, nodes: int, ppn: int, extra: list[str]) -> tuple[float, float, float, float]:
        """The median CPU seconds per worker-step, their range, and the median wall-clock seconds."""
        times = [step_seconds(algorithm, args.task, nodes, ppn, args.epochs, extra + sets) for _ in range(args.repeats)]
        cpu = [c for c, _ in times]
        return statistics.median(cpu), min(cpu), max(cpu), statistics.median(w for _, w in times)

    real, low, high, real_wall = measured("allreduce", 1, 1, [])
    print(
        f"{args.task}: one real process's step {real * 1e3:.2f} CPU-ms (median of {args.repeats}; "
        f"{low * 1e3:.2f}-{high * 1e3:.2f}), {real_wall * 1e3:.2f} ms wall-clock"
    )
    print(
        f"{'algorithm':<12} {'layout':>7} {'CPU-ms a worker-step (median, range)':>38} {'ratio':>6} {'extra ms':>9} {'wall':>6}"
    )
    for algorithm in args.algorithms:
        for layout in args.layouts:
            nodes, ppn = (int(n) for n in layout.split("x"))
            per, low, high, wall = measured(algorithm, nodes, ppn, ["clock=simulated"])
            spread = f"{per * 1e3:.2f} ({low * 1e3:.2f}-{high * 1e3:.2f})"
            extra = (per - real) * 1e3  # what the simulation adds to a worker-step: messages, switches, cold caches
            print(f"{algorithm:<12} {layout:>7} {spread:>38} {per / real:>6.2f} {extra:>9.2f} {wall / real_wall:>6.2f}")
    nodes, ppn = max(
        (tuple(int(n) for n in layout.split("x")) for layout in args.layouts), key=lambda nxg: nxg[0] * nxg[1]
    )
    largest = f"{nodes}x{ppn}"
    print(f"the virtual cluster's own costs at {largest}, CPU-us a rank:")
    for name, us in own_costs(args.task, nodes, ppn).items():
        print(f"  {name:<36} {us:8.1f}")


if __name__ == "__main__":
    main()
