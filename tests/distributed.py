"""Run a function on W gloo processes on this machine (the tests' small virtual cluster)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks import launcher


def _entry(rank: int, world: int, store: str, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    # Done: skip the interpreter's teardown, as a rank of the suite does (launcher.exit_process).
    launcher.exit_process(0)


# The ranks come from multiprocessing's fork server, which imports these once for the whole session:
# a spawned rank paid ``import torch`` again (about 3 CPU-seconds on a busy 2-core machine, times 4
# ranks, at about 40 call sites). Forking pytest's own process instead would hand the ranks whatever
# thread pools and locks the earlier tests left in use there.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "algorithms", "benchmarks.tasks.digits", "tests.distributed"]
multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)


def run_on(world: int, fn: Callable, *args: object) -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` processes; re-raises the first failure."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(_entry, args=(world, store, fn, args), nprocs=world, join=True, start_method="forkserver")


def stop_after_first_epoch(
    command: list[str], out: Path, cwd: Path, deadline_s: float = 120, settle_s: float = 0.25
) -> tuple[int, str]:
    """Start a run, send it SIGTERM ``settle_s`` after its first epoch's row is in ``out``/metrics.csv,
    and return its exit code and output; a run that writes no row within ``deadline_s`` is killed.

    The runner checks for a stop request right after it writes the row: a signal in that window
    stops the run at the end of the first epoch, not inside the second, where the callers want it
    (seen once in 20 cases of a full suite under load). The pause lets the runner pass that check;
    the callers' epochs last about a second (a rank sleeps 20 ms a step), so the stop still lands
    well inside the second epoch."""
    launcher = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + deadline_s
        while not ((out / "metrics.csv").exists() and len((out / "metrics.csv").read_text().splitlines()) >= 2):
            if launcher.poll() is not None or time.monotonic() > deadline:
                launcher.kill()
                raise AssertionError(f"no first epoch (exit {launcher.wait()}):\n{launcher.communicate()[0][-3000:]}")
            time.sleep(0.02)
        time.sleep(settle_s)
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return launcher.returncode, output


def train_digits(
    rank: int,
    world: int,
    name: str,
    knobs: dict,
    out: str,
    steps: int,
    steps_per_epoch: int,
    check: Callable | None = None,
) -> None:
    """``steps`` SGD steps (momentum, weight decay) of the digits CNN under algorithm ``name`` on a
    2-node virtual cluster, each rank on its own random batches; rank 0 saves the parameters to
    ``out``. ``check(t, algo, model)`` runs after each step (on every rank)."""
    import algorithms
    from algorithms.topology import Topology
    from benchmarks.tasks import digits

    torch.manual_seed(0)
    model = digits.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    algo = algorithms.build(name, Topology(rank, nodes=2, procs_per_node=world // 2), **knobs)
    plan = algorithms.Plan(steps_per_epoch=steps_per_epoch, epochs=max(1, steps // steps_per_epoch))
    train_model = algo.prepare(model, optimizer, plan)
    data = torch.Generator().manual_seed(100 + rank)
    for t in range(steps):
        x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(train_model(x), y).backward()
        algo.step()
        if check is not None:
            check(t, algo, model)
    algo.close()
    if rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out)


def max_param_diff(a: str, b: str) -> float:
    """The largest element-wise difference between two saved parameter lists."""
    return max((x - y).abs().max().item() for x, y in zip(torch.load(a), torch.load(b)))
