"""One run of the runner, timed: its CPU and wall-clock seconds, and a worker-step's seconds from two
runs ``epochs`` apart. Each run evaluates once, at its end (``eval_every`` past both), so that
start-up and the evaluation cancel in the difference. The measuring commands (``tools.virtual_cost``,
``tools.step_time``) and ``benchmarks.device_check``'s cost line share it.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import tempfile
import time
from pathlib import Path

from benchmarks import matrix, naming, run


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
        for item in matrix.overrides_for(algorithm, task, sets):  # an algorithm's knob goes to its runs only
            argv += ["--set", item]
        cpu, start = cpu_seconds(), time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            code = run.main(argv)
        cpu, wall = cpu_seconds() - cpu, time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"{algorithm} {nodes}x{ppn} failed: see `python -m benchmarks.run {' '.join(argv)}`")
        return cpu, wall, json.loads((out / naming.SUMMARY).read_text())


def step_seconds(
    algorithm: str, task: str, nodes: int, ppn: int, epochs: tuple[int, int], sets: list[str]
) -> tuple[float, float]:
    """CPU and wall-clock seconds per worker-step: the difference between two runs ``epochs`` apart,
    over the worker-steps it adds (start-up and the one evaluation cancel)."""
    short_cpu, short_wall, _ = timed_run(algorithm, task, nodes, ppn, epochs[0], sets)
    long_cpu, long_wall, summary = timed_run(algorithm, task, nodes, ppn, epochs[1], sets)
    worker_steps = (epochs[1] - epochs[0]) * summary["steps"] // summary["epochs"] * nodes * ppn
    return (long_cpu - short_cpu) / worker_steps, (long_wall - short_wall) / worker_steps
