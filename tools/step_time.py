"""One worker's time for a batch of a task on this machine: the number the virtual cluster's
``sim_step_ms`` asks for, with its source.

    python -m tools.step_time --task mnist1d_large [--set batch_size=4] [--repeats 3]

It measures the runner's own step, as ``tools.virtual_cost`` measures its plain step: one real
process (1 x 1, allreduce: no communication) with the machine to itself (its threads: ``--set
threads=``, default all cores, as one worker of a cluster has its own device), the wall-clock
difference between two runs ``--epochs`` apart over the steps it adds, so that start-up and the one
evaluation cancel. It prints the median over ``--repeats`` with the range, then the two ``--set``
items that give a simulated run this number and say where it comes from (``sim_step_source``, which
the run writes to ``config.json`` and ``env.json`` and the report shows). Measure once and put the
number in a matrix's ``set:``: a run that measured its own would carry a time model of its own, and
its seeds could not be pooled.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import config
from benchmarks.timing import step_seconds


def measure(
    task: str, overrides: list[str], epochs: tuple[int, int] = (1, 2), repeats: int = 3
) -> tuple[list[float], str]:
    """Wall-clock seconds of a step of ``task`` (its hyper-parameters with ``overrides``) in each of
    ``repeats`` measurements, and the source line that names what was measured."""
    sets = ["stop_at_target=false", *overrides]
    with tempfile.TemporaryDirectory() as tmp:  # checks every key before a run starts; writes nothing
        cfg = config.resolve("allreduce", task, 1, 1, 0, Path(tmp) / "run", sets)
    times = [step_seconds("allreduce", task, 1, 1, epochs, sets)[1] for _ in range(repeats)]
    threads = cfg.settings.threads or "all cores'"
    source = (
        f"measured by python -m tools.step_time on {platform.node()}, {datetime.date.today().isoformat()}: "
        f"the runner's step of {task} at batch {cfg.hparams['batch_size']}, {threads} threads, median of {repeats}"
    )
    return times, source


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.step_time", description=__doc__.splitlines()[0])
    p.add_argument("--task", required=True, help="registered task name (python -m benchmarks.run --list)")
    p.add_argument("--epochs", type=int, nargs=2, default=[1, 2], help="the two runs' epochs")
    p.add_argument("--repeats", type=int, default=3, help="measurements, of which the median counts")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if not 0 < args.epochs[0] < args.epochs[1] or args.repeats < 1:
        print(
            "error: --epochs takes two counts, the first positive and below the second; --repeats >= 1", file=sys.stderr
        )
        return 2
    try:
        times, source = measure(args.task, args.sets, tuple(args.epochs), args.repeats)
    except config.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ms = statistics.median(times) * 1e3
    if min(times) <= 0:  # the runs' difference drowned in their start-up's noise
        print(
            f"error: a measurement came out at {min(times) * 1e3:.3f} ms a step: pass --epochs further apart",
            file=sys.stderr,
        )
        return 1
    if max(times) > 1.25 * min(times):  # on digits at batch 4, epochs 1 and 3 spread from 0.16 to 2.6 ms
        print(
            f"warning: the measurements spread from {min(times) * 1e3:.3f} to {max(times) * 1e3:.3f} ms a step: "
            "pass --epochs further apart for a steadier number",
            file=sys.stderr,
        )
    print(f"{source}: {ms:.3f} ms a step ({min(times) * 1e3:.3f}-{max(times) * 1e3:.3f})")
    print(f'--set sim_step_ms={ms:.3f} --set "sim_step_source={source}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
