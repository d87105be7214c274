"""One worker's compute time for a batch of a task on this machine: the number the virtual cluster's
``sim_step_ms`` asks for, with its source.

    python -m benchmarks.step_time --task mnist1d_large [--set batch_size=4] [--steps 50]

It times the runner's training step with no communication (the batch to the device, forward, loss,
backward, the task's optimizer step), one step at a time after ``--warmup`` untimed ones, in one
process that has the machine to itself (its threads: ``--set threads=``, default all cores, as one
worker of a cluster has its own device), and prints the median with the range, then the two
``--set`` items that give a simulated run this number and say where it comes from
(``sim_step_source``, which the run writes to ``config.json`` and ``env.json`` and the report shows).
Measure once and put the number in a matrix's ``set:``: a run that measured its own would carry a
time model of its own, and its seeds could not be pooled.

Data loading is left out, as the virtual clock leaves it out (a cluster's loader workers overlap it
with compute); the optimizer step is in, as it is in a real step.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import config, launcher, tasks
from benchmarks.checkpoint import ResumableSampler
from benchmarks.clock import WallClock
from benchmarks.schedule import make_optimizer


def measure(task_name: str, overrides: list[str], steps: int = 50, warmup: int = 10) -> tuple[list[float], str]:
    """Seconds of each of ``steps`` timed training steps of ``task_name`` (its hyper-parameters with
    ``overrides``), and the source line that names what was measured."""
    with tempfile.TemporaryDirectory() as tmp:  # resolve only checks the settings; nothing is written
        cfg = config.resolve("allreduce", task_name, 1, 1, 0, Path(tmp) / "run", overrides)
    task, h, s = tasks.get(task_name), cfg.hparams, cfg.settings
    device = launcher.pick_device(s["device"], 0)
    threads = s["threads"] or tasks.default_threads(1, device, task)
    torch.set_num_threads(threads)
    train_set, _ = task.make_datasets(Path(s["data_root"]) if s["data_root"] else None)
    torch.manual_seed(0)
    model = task.make_model().to(device)
    optimizer = make_optimizer(model.parameters(), h)
    sampler = ResumableSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
    loader = task.train_loader(train_set, sampler, h["batch_size"], model, device, 0)
    now, times, epoch = WallClock(device), [], 0
    while len(times) < warmup + steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = tasks.to_device(x, device), tasks.to_device(y, device)
            start = now()
            optimizer.zero_grad(set_to_none=True)
            task.loss(model(x), y).backward()
            optimizer.step()
            times.append(now() - start)
            if len(times) == warmup + steps:
                break
        epoch += 1
    timed = times[warmup:]
    day = datetime.date.today().isoformat()
    source = (
        f"measured by python -m benchmarks.step_time on {platform.node()} ({device}, {threads} threads), {day}: "
        f"median of {steps} steps of {task_name} at batch {h['batch_size']}"
    )
    return timed, source


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__.splitlines()[0])
    p.add_argument("--task", required=True, help="registered task name (python -m benchmarks.run --list)")
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        print("error: --steps must be positive and --warmup non-negative", file=sys.stderr)
        return 2
    try:
        times, source = measure(args.task, args.sets, args.steps, args.warmup)
    except config.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ms = statistics.median(times) * 1e3
    print(f"{source}: {ms:.3f} ms a step ({min(times) * 1e3:.3f}-{max(times) * 1e3:.3f})")
    print(f'--set sim_step_ms={ms:.3f} --set "sim_step_source={source}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
