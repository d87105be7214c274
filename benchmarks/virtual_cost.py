"""What simulating costs: the machine time of one worker-step on the virtual cluster, against one real
process's training step on the same task.

    python -m benchmarks.virtual_cost [--task digits] [--algorithms allreduce wagma] [--layouts 2x2 16x4]

Both are measured the same way, through the runner: the difference in machine time between two runs
``--epochs`` apart, divided by the worker-steps that difference adds (steps x ranks), so that
start-up cost cancels and each epoch's evaluation counts on both sides. The real step is one process
(1 x 1, allreduce: no communication), one thread; the simulated ranks get one thread too. The ratio
is what a simulated experiment costs per worker-step beyond running its batches one by one.
Each is measured ``--repeats`` times and the median taken, with the range beside it: one pair of
short real runs moved from 4.9 to 8.2 ms a step between three measurements on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import config, run


def timed_run(algorithm: str, task: str, nodes: int, ppn: int, epochs: int, sets: list[str]) -> tuple[float, dict]:
    """Machine seconds of one run of the runner, and its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = ["--algorithm", algorithm, "--task", task, "--nodes", str(nodes), "--procs-per-node", str(ppn)]
        argv += ["--out", str(out), "--set", "wandb=false", "--set", f"epochs={epochs}", "--set", "checkpoint_every=0"]
        for item in config.overrides_for(algorithm, task, sets):  # an algorithm's knob goes to its runs only
            argv += ["--set", item]
        start = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            code = run.main(argv)
        seconds = time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"{algorithm} {nodes}x{ppn} failed: see `python -m benchmarks.run {' '.join(argv)}`")
        return seconds, json.loads((out / "summary.json").read_text())


def step_seconds(algorithm: str, task: str, nodes: int, ppn: int, epochs: tuple[int, int], sets: list[str]) -> float:
    """Machine seconds per worker-step: the difference between two runs ``epochs`` apart, over the
    worker-steps it adds (start-up cancels; each epoch's evaluation counts, on both sides alike)."""
    short, _ = timed_run(algorithm, task, nodes, ppn, epochs[0], sets)
    long, summary = timed_run(algorithm, task, nodes, ppn, epochs[1], sets)
    steps_per_epoch = summary["steps"] // summary["epochs"]
    return (long - short) / ((epochs[1] - epochs[0]) * steps_per_epoch * nodes * ppn)


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

    def measured(algorithm: str, nodes: int, ppn: int, extra: list[str]) -> tuple[float, float, float]:
        times = [step_seconds(algorithm, args.task, nodes, ppn, args.epochs, extra + sets) for _ in range(args.repeats)]
        return statistics.median(times), min(times), max(times)

    real, low, high = measured("allreduce", 1, 1, [])
    print(
        f"{args.task}: one real process's step {real * 1e3:.2f} ms (median of {args.repeats}; "
        f"{low * 1e3:.2f}-{high * 1e3:.2f})"
    )
    print(f"{'algorithm':<12} {'layout':>7} {'worker-step (median, range)':>30} {'ratio':>6}")
    for algorithm in args.algorithms:
        for layout in args.layouts:
            nodes, ppn = (int(n) for n in layout.split("x"))
            per, low, high = measured(algorithm, nodes, ppn, ["clock=simulated"])
            spread = f"{per * 1e3:.2f} ms ({low * 1e3:.2f}-{high * 1e3:.2f})"
            print(f"{algorithm:<12} {layout:>7} {spread:>30} {per / real:>6.2f}")


if __name__ == "__main__":
    main()
