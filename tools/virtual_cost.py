"""What simulating costs: the machine time of one worker-step on the virtual cluster, against one real
process's training step on the same task.

    python -m tools.virtual_cost [--task digits] [--algorithms allreduce wagma] [--layouts 2x2 16x4]

Both are measured the same way, through the runner: the difference in machine time between two runs
``--epochs`` apart, divided by the worker-steps that difference adds (steps x ranks), so that
start-up cost cancels. Each run evaluates once, at its end (``eval_every`` past both), so that the
evaluations cancel too: an evaluation is not a step, and it is paid per rank and per evaluation,
which a real cluster's ranks pay alike (each its shard of the validation set and its copy of the
averaged model), but which a 64-rank epoch of 9 steps would spread over 9 steps where the real
single process's 625-step epoch spreads it over 625.

Two real steps stand beside a simulated one. The plain step is one process (1 x 1, allreduce: no
communication), one thread; the simulated ranks get one thread too: that ratio is what a simulated
experiment costs per worker-step beyond running its batches one by one, the algorithm's own work
included (WAGMA's butterfly adds, D-PSGD's neighbours' models), which a real rank pays as well. The
same algorithm run for real (``--real-layout``, 2 x 2 processes by default, each one thread) is what
a worker-step of it costs this machine when it is not simulated: its arithmetic, and gloo's copies
and waits where the simulator has its own.

Machine time is CPU seconds (user + system, of this process and of the ranks it launched and
waited for), which is what a simulation costs its machine: wall-clock seconds on a shared machine
measure its other jobs too (one pair of short real runs moved from 4.9 to 8.2 ms a wall-clock step
between three measurements beside a test run). On a quiet machine the two agree, since one rank
thread of the simulation runs at a time; the wall-clock ratio is printed beside. The measurements
come in ``--repeats`` rounds, each of which measures every run once, and a ratio divides two
measurements of the same round: the median over the rounds is printed, with the range beside it
(a machine shared with other virtual machines drifts by 20 % over minutes, more than the
differences measured here).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from algorithms import comm
from benchmarks import config, tasks
from benchmarks.timing import step_seconds, timed_run
from benchmarks.virtual import job, network


def own_costs(task: str, nodes: int, ppn: int, repeats: int = 200) -> dict[str, float]:
    """CPU microseconds a rank of the virtual cluster spends on its bookkeeping, apart from tensors:
    a hand-off to the next rank (``advance``), an all-reduce of 10 floats; and an all-reduce of the
    task's model (``flat_average_``), beside the same flatten, divide and copy back on one model in
    one process, and the same with the sum on P models in one process with no simulator: the first
    difference is the memory traffic of P models through one machine, and what the simulated
    all-reduce costs beyond the second is the simulator's own work."""
    torch.set_num_threads(1)  # as the measured runs (threads=1)
    model = tasks.get(task).make_model()
    shapes = [p.shape for p in model.parameters()]
    times: dict[str, float] = {}

    def body(rank: int, cluster: job.Cluster) -> None:
        job.init_process_group(rank, cluster)
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

    job.run(nodes * ppn, ppn, network.load("juwels_booster"), body)
    world = nodes * ppn
    params = [torch.zeros(s) for s in shapes]
    start = time.process_time()
    for _ in range(repeats):
        comm.unflatten_into(comm.flatten(params).div_(world), params)
    times["the same on one model, one process"] = (time.process_time() - start) / repeats * 1e6
    # The same arithmetic on P models in one process, with no simulator at all: what P models' memory
    # costs by itself, beside which the simulated all-reduce's bookkeeping is measured.
    models = [[torch.zeros(s) for s in shapes] for _ in range(world)]
    rounds = max(2, repeats // world)
    start = time.process_time()
    for _ in range(rounds):
        flats = [comm.flatten(ps).div_(world) for ps in models]
        total = flats[0].clone()
        for flat in flats[1:]:
            total.add_(flat)
        for ps in models:
            comm.unflatten_into(total, ps)
    times[f"the same on {world} models, one process"] = (time.process_time() - start) / (rounds * world) * 1e6
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.virtual_cost", description=__doc__.splitlines()[0])
    p.add_argument("--task", default="digits")
    p.add_argument("--algorithms", nargs="+", default=["allreduce", "dpsgd", "wagma"])
    p.add_argument("--layouts", nargs="+", default=["2x2", "4x4"], help="NxG: nodes x processes per node")
    p.add_argument(
        "--real-layout",
        default="2x2",
        help="also run each algorithm for real on this layout (NxG processes on this machine), to set a "
        "simulated worker-step beside a real one of the same algorithm ('none': skip)",
    )
    p.add_argument("--epochs", type=int, nargs=2, default=[1, 4], help="the two runs' epochs")
    p.add_argument("--repeats", type=int, default=5, help="rounds of measurements, of which the median counts")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    sets = ["threads=1", "stop_at_target=false", *args.sets]
    # a simulated run's own settings (sim_*) go to the simulated runs only: a real run refuses them
    simulated_only = config.CLOCK_ONLY["simulated"]
    real_sets = [item for item in sets if item.split("=", 1)[0] not in simulated_only]
    layouts = [tuple(int(n) for n in layout.split("x")) for layout in args.layouts]
    same = None if args.real_layout == "none" else tuple(int(n) for n in args.real_layout.split("x"))
    timed_run("allreduce", args.task, 1, 1, 1, real_sets)  # a first run pays the imports (torch._dynamo): not timed

    # Rounds: each measures the plain real step, then every algorithm's real and simulated steps, so
    # that a ratio divides measurements minutes apart, never a whole benchmark apart (a shared
    # machine's speed drifts by more than the differences measured here).
    plain: list[float] = []
    real: dict[str, list[float]] = {a: [] for a in args.algorithms}
    sim: dict[tuple[str, tuple[int, int]], list[tuple[float, float]]] = {
        (a, nxg): [] for a in args.algorithms for nxg in layouts
    }
    epochs = tuple(args.epochs)
    for round_ in range(args.repeats):
        plain.append(step_seconds("allreduce", args.task, 1, 1, epochs, real_sets)[0])
        for algorithm in args.algorithms:
            if same is not None:
                real[algorithm].append(step_seconds(algorithm, args.task, *same, epochs, real_sets)[0])
            for nxg in layouts:
                sim[algorithm, nxg].append(step_seconds(algorithm, args.task, *nxg, epochs, ["clock=simulated", *sets]))
        print(f"round {round_ + 1} of {args.repeats}: one real process's step {plain[-1] * 1e3:.2f} CPU-ms", flush=True)

    def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
        return f"{statistics.median(values) * scale:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"

    print(f"\n{args.task}: one real process's step (1 x 1, no communication) {spread(plain, 1e3)} CPU-ms")
    if same is not None:
        layout = f"{same[0]}x{same[1]}"
        for algorithm in args.algorithms:
            print(
                f"  a real worker-step of {algorithm} at {layout} (processes on this machine): {spread(real[algorithm], 1e3)} CPU-ms"
            )
    print("a simulated worker-step: median (range) over the rounds; each ratio divides measurements of the same round")
    print(
        f"{'algorithm':<12} {'layout':>7} {'CPU-ms':>20} {'/ one real step':>20} {f'/ real {args.real_layout}':>20} {'wall':>6}"
    )
    for (algorithm, (nodes, ppn)), times in sim.items():
        cpu = [c for c, _ in times]
        ratio = [c / r for c, r in zip(cpu, plain)]
        to_same = spread([c / r for c, r in zip(cpu, real[algorithm])]) if same is not None else "-"
        wall = statistics.median(w for _, w in times) / statistics.median(plain)
        print(
            f"{algorithm:<12} {f'{nodes}x{ppn}':>7} {spread(cpu, 1e3):>20} {spread(ratio):>20} {to_same:>20} {wall:>6.2f}"
        )
    nodes, ppn = max(layouts, key=lambda nxg: nxg[0] * nxg[1])
    print(f"the virtual cluster's own costs at {nodes}x{ppn}, CPU-us a rank:")
    for name, us in own_costs(args.task, nodes, ppn).items():
        print(f"  {name:<36} {us:8.1f}")


if __name__ == "__main__":
    main()
