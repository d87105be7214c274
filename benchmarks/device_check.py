"""Every GPU path of the suite, checked on the accelerator at hand by one prepared command.

    python -m benchmarks.device_check --out device_check.json     # at most 8 minutes on one GPU

A GPU comes to this project rarely and briefly (one GPU, minutes, nothing installable), so what to
run on it is written beforehand, and each part that fails is reported without stopping the others.
The check prints one table, a line per check: what ran, its result (pass, fail or skip, with a number
or the reason) and the seconds it took. It runs the suite's own entry points, ``python -m
benchmarks.run`` and ``benchmarks.timing``, on the embedded ``digits`` task with wandb off:

* **the virtual cluster on the device** (``clock=simulated``: P ranks as threads of one process, the
  compute on the GPU): every registered algorithm at 2x2 and 8x1, 2 epochs (with each class's ``short_run_knobs``, so that
  each does its own work in them), beside the same run on the CPU. The synchronous family, whose simulated run follows the real job's trajectory
  (``tests/virtual/test_virtual.py``), must follow the CPU's (``LOSS_RTOL``, ``METRIC_ATOL``); the others,
  whose updates race or arrive in an order (threads, updaters, a parameter server), must train as
  they do on the CPU (``TRAINED_ATOL``). Their decisions follow the virtual clock, which is the
  same on both devices, but one that turns on a value may flip with the device's rounding.
  "Above chance" alone would not do: NAG-ASGD at 8 workers stays at chance on the CPU too (0.11
  after 2 epochs, the failure the DANA paper reports).
* **real one-rank jobs** (world size 1: NCCL takes one GPU a rank, and there is one): DDP (its
  ``device_ids``) and allreduce (the runner's collectives on the NCCL group), a stop by SIGTERM
  inside the second epoch and its resume, equal to the uninterrupted run, and LAP-SGD and LPP-SGD
  with their updater processes and the feed's CUDA copy stream;
* **the loaders**: DataLoader worker processes and pinned memory, as a decoding task gets them
  (``tasks.loader_options``), on digits' data;
* **the virtual cluster's cost**: simulated worker-steps per second at 64 ranks (16x4), on the
  device and on the CPU.

Each line's budget is in ``BUDGET_S``, enforced as its processes' timeout. A line starts only if
its budget ends within ``--budget-s`` (480 s) less the cost line's budget; the cost line runs last
and alone, as it is a timing. So the check ends within ``--budget-s``. The lines run side by side, the real jobs one at a time in a lane of their own. On one GPU
the whole check should take 2-4 minutes (an estimate: it has not yet run on one).

``--strict-stand-in`` runs the same lines on a CPU, with the strict device of ``tests/strict_device.py``
as the accelerator (the tests use it: ``tests/benchmarks/test_device_check.py``); there the runs go through a
forkserver that registers it first (``benchmarks/forkserver.py``). What only CUDA has (pinned
memory) is a skip there; NCCL's role is played by the stand-in's own process groups, which keep
NCCL's rules; every budget is 3x (``STAND_IN_SLOWER``). All 50 lines take about 8 minutes on 2 busy
cores; ``--algorithms`` limits the virtual-cluster lines to some algorithms (the test runs 3).

Exit codes: 0 no line failed (also where there is no accelerator: a line says so and nothing runs),
1 some line failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

import algorithms
from benchmarks import EXIT_TIMEOUT, naming

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = {  # seconds each line may take on one GPU (its processes' timeout); typical use is a fifth
    "virtual": 90,  # a run on the device, then one on the CPU
    "real": 90,  # one one-rank job
    "resume": 150,  # a stopped job, its resume, and the uninterrupted job
    "updaters": 120,  # one one-rank job, its updaters spawned (each imports torch and starts CUDA)
    "loader": 60,  # one process reading digits twice
    "cost": 150,  # runs at 64 ranks: a warm-up, then 1 and 5 epochs, on the device and on the CPU
}
TOTAL_BUDGET_S = 480
STAND_IN_SLOWER = 3  # the stand-in runs each operation in Python: its budgets are 3x, with a margin
LAYOUTS = ((2, 2), (8, 1))
EPOCHS = 2
# The algorithms whose simulated 2x2 run follows the real job's trajectory (tests/virtual/test_virtual.py):
# on the device it must follow the CPU's, within the device's rounding.
DETERMINISTIC = "ddp allreduce local_sgd post_local_sgd dpsgd sgp daso diloco powersgd horovod".split()
LOSS_RTOL = 5e-3  # train and val loss at every evaluation: far above a device's rounding, far below a wrong rule
METRIC_ATOL = 0.01  # val accuracy: 3 of digits' 359 validation samples
TRAINED_ATOL = 0.05  # the others' final accuracy against the CPU's; an untrained model scores 0.1
NO_ACCELERATOR = (
    "device_check: no accelerator here (torch.cuda.is_available() is False): nothing checked. "
    "On a machine without a GPU, --strict-stand-in runs the same lines on the strict CPU stand-in."
)


def short_run_sets(algorithm: str) -> list[str]:
    """The ``--set`` items under which ``algorithm`` does its own work within 2 epochs of digits
    (its class's ``short_run_knobs``)."""
    return [f"{k}={v}" for k, v in algorithms.get(algorithm).short_run_knobs.items()]


class Skipped(Exception):
    """The line cannot mean anything here; the message says why."""


class Failed(Exception):
    """The line ran and its result is wrong; the message says how."""


@dataclasses.dataclass
class Line:
    """One line of the table: a check, its budget, and once run its result."""

    check: str
    kind: str  # a key of BUDGET_S
    work: Callable[[Context, Line], str]  # returns the detail of a pass; raises Skipped or Failed
    budget_s: float
    result: str = "not run"
    detail: str = ""
    seconds: float = 0.0
    deadline: float = 0.0


@dataclasses.dataclass
class Context:
    """What every line needs: the device, how to start a run, where to write, when to stop."""

    device: str  # "cuda", or "strict" under the stand-in
    stand_in: bool
    runner: list[str]  # what stands for ``python -m benchmarks.run``
    tmp: Path
    threads: int  # torch threads of each run: the machine's cores shared among the lanes
    deadline: float  # monotonic seconds: a line starts only if its budget ends before (the cost line: after)

    def timeout(self, line: Line) -> float:
        """Seconds left of ``line``'s budget."""
        left = line.deadline - time.monotonic()
        if left <= 0:
            raise Failed(f"out of its budget of {line.budget_s:.0f} s")
        return left

    def command(self, algorithm: str, nodes: int, ppn: int, out: Path, sets: list[str]) -> list[str]:
        argv = ["--algorithm", algorithm, "--task", "digits", "--nodes", str(nodes), "--procs-per-node", str(ppn)]
        # the real jobs' collectives time out after 60 s; a simulated run has no timeout to set, and refuses one
        timeout = [] if "clock=simulated" in sets else ["collective_timeout_s=60"]
        for item in ["wandb=false", f"threads={self.threads}", *timeout, *sets]:
            argv += ["--set", item]
        return [*self.runner, *argv, "--out", str(out)]

    def run(self, line: Line, algorithm: str, nodes: int, ppn: int, name: str, sets: list[str]) -> Path:
        """Run the job to its end in ``tmp``/``name``; return its directory (fail unless it completed)."""
        out = self.tmp / name
        command = self.command(algorithm, nodes, ppn, out, sets)
        timeout = self.timeout(line)
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as error:
            raise Failed(f"{name}: no end within {timeout:.0f} s") from error
        summary = _read_json(out / naming.SUMMARY)
        if done.returncode != 0 or summary.get("status") != "completed":
            said = summary.get("error") or (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise Failed(f"{name}: exit {done.returncode}, {summary.get('status')}: {said}"[:300])
        return out


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / naming.METRICS) as f:
        return list(csv.DictReader(f))


def _rel(a: str, b: str) -> float:
    x, y = float(a), float(b)
    return abs(x - y) / max(abs(y), 1e-12)


# ---- the lines ---------------------------------------------------------------------------------------


def virtual(algorithm: str, nodes: int, ppn: int) -> Callable[[Context, Line], str]:
    """The algorithm on the virtual cluster, on the device and on the CPU."""

    def work(ctx: Context, line: Line) -> str:
        sets = ["clock=simulated", f"epochs={EPOCHS}", *short_run_sets(algorithm)]
        name = f"virtual-{algorithm}-{nodes}x{ppn}"
        dev = ctx.run(line, algorithm, nodes, ppn, name, [*sets, f"device={ctx.device}"])
        cpu = ctx.run(line, algorithm, nodes, ppn, f"{name}-cpu", [*sets, "device=cpu"])
        on_dev, on_cpu = _rows(dev), _rows(cpu)
        metric, cpu_metric = float(on_dev[-1]["val_metric"]), float(on_cpu[-1]["val_metric"])
        if [r["step"] for r in on_dev] != [r["step"] for r in on_cpu]:
            raise Failed(f"evaluated at steps {[r['step'] for r in on_dev]}, the CPU at {[r['step'] for r in on_cpu]}")
        loss = max(_rel(a[k], b[k]) for a, b in zip(on_dev, on_cpu) for k in ("train_loss", "val_loss"))
        if algorithm not in DETERMINISTIC:
            if abs(metric - cpu_metric) > TRAINED_ATOL:
                raise Failed(f"accuracy {metric:.3f}, the CPU's {cpu_metric:.3f} (tolerance {TRAINED_ATOL})")
            return f"trained as on the CPU: accuracy {metric:.3f} vs {cpu_metric:.3f} (loss off by {loss:.1e})"
        worst = max(abs(float(a["val_metric"]) - float(b["val_metric"])) for a, b in zip(on_dev, on_cpu))
        clock = max(_rel(a["wall_s"], b["wall_s"]) for a, b in zip(on_dev, on_cpu))
        if loss > LOSS_RTOL or worst > METRIC_ATOL or clock > 1e-6:
            raise Failed(
                f"off the CPU's trajectory: loss by {loss:.1e}, accuracy by {worst:.3f}, virtual time by {clock:.1e}"
            )
        return f"CPU's trajectory: loss to {loss:.1e} (tol {LOSS_RTOL:.0e}), accuracy {metric:.3f}"

    return work


def _backend(ctx: Context) -> str:
    return "nccl" if ctx.device == "cuda" else ctx.device


def _real_job(ctx: Context, out: Path) -> str:
    """Check a finished one-rank job's device and backend; return what it scored."""
    env, summary = _read_json(out / "env.json"), _read_json(out / naming.SUMMARY)
    if env.get("device") != ctx.device or env.get("backend") != _backend(ctx):
        raise Failed(f"ran on {env.get('device')} with {env.get('backend')}, not {ctx.device} with {_backend(ctx)}")
    if summary["final_metric"] <= 0.5:  # digits in 2 epochs on one rank: 0.93-0.97; untrained: 0.1
        raise Failed(f"did not train: accuracy {summary['final_metric']:.3f}")
    where = f"{env['backend']} on {env['devices'][0]}" if ctx.device == "cuda" else env["backend"]
    return f"accuracy {summary['final_metric']:.3f}, {summary['steps']} steps, {where}"


def real(algorithm: str) -> Callable[[Context, Line], str]:
    """A real job of one rank on the device, its default group the device's (NCCL on CUDA)."""

    def work(ctx: Context, line: Line) -> str:
        out = ctx.run(line, algorithm, 1, 1, f"real-{algorithm}", [f"device={ctx.device}", f"epochs={EPOCHS}"])
        done = _real_job(ctx, out)
        if algorithm == "ddp":
            done += ", DDP given device_ids=[0]" if ctx.device == "cuda" else " (device_ids: CUDA only)"
        return done

    return work


def updaters(algorithm: str) -> Callable[[Context, Line], str]:
    """LAP/LPP-SGD on one rank: two updater processes, spawned on the device, fed through the copy stream."""

    def work(ctx: Context, line: Line) -> str:
        sets = [f"device={ctx.device}", f"epochs={EPOCHS}", "updaters=2", "batch_size=32"]
        done = _real_job(ctx, ctx.run(line, algorithm, 1, 1, f"real-{algorithm}", sets))
        return done + (", copy stream" if ctx.device == "cuda" else " (copy stream: CUDA only)")

    return work


def resume(ctx: Context, line: Line) -> str:
    """DDP on one rank, stopped by SIGTERM inside its second epoch, resumed; equal to an uninterrupted run.

    The rank sleeps 20 ms before each of its 89 steps an epoch (``straggler=slow``), so that the
    signal, sent once the first epoch's row is written, lands inside the second epoch."""
    sets = [f"device={ctx.device}", f"epochs={EPOCHS}", "straggler=slow", "straggler_delay_ms=20"]
    out = ctx.tmp / "resume"
    command = ctx.command("ddp", 1, 1, out, sets)
    with open(ctx.tmp / "resume.log", "w") as log:  # a file, not a pipe that nobody reads while it runs
        job = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        timeout = ctx.timeout(line)
        start = time.monotonic()
        while not ((out / naming.METRICS).exists() and len((out / naming.METRICS).read_text().splitlines()) >= 2):
            if job.poll() is not None or time.monotonic() - start > timeout:
                raise Failed(f"no first epoch (exit {job.poll()})")
            time.sleep(0.02)
        time.sleep(0.25)  # past the runner's stop check after the row (tests/distributed.py)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=ctx.timeout(line))
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    stopped = _read_json(out / naming.SUMMARY)
    if job.returncode != EXIT_TIMEOUT or stopped.get("status") != "timeout":
        said = (ctx.tmp / "resume.log").read_text().strip()[-200:]
        raise Failed(f"the stop: exit {job.returncode}, {stopped.get('status')}: {said}")
    ctx.run(line, "ddp", 1, 1, "resume", sets)  # the same command again resumes
    log = (out / "log.txt").read_text()
    where = log.split("resumed at epoch ")[-1].split(",")[0].split("\n")[0] if "resumed at epoch" in log else ""
    if not where.startswith("1 batch ") or where == "1 batch 0":
        raise Failed(f"not resumed inside the second epoch: {where or 'no resume in the log'}")
    whole = _read_json(ctx.run(line, "ddp", 1, 1, "resume-whole", sets) / naming.SUMMARY)
    resumed = _read_json(out / naming.SUMMARY)
    exact = ctx.device != "cuda"  # the stand-in computes on the CPU; cuDNN may add in another order
    for key in ("final_metric", "final_train_loss", "steps"):
        off = abs(resumed[key] - whole[key]) / max(abs(whole[key]), 1e-12)
        if off > (1e-6 if exact else LOSS_RTOL):
            raise Failed(f"{key} {resumed[key]} resumed, {whole[key]} uninterrupted")
    return f"stopped at epoch {where}, resumed: {'equal' if exact else 'within ' + str(LOSS_RTOL)} to the uninterrupted run"


def probe(name: str) -> Callable[[Context, Line], str]:
    """One of this module's probes (``--probe``), in a process of its own."""

    def work(ctx: Context, line: Line) -> str:
        if name == "pinned" and ctx.device != "cuda":
            raise Skipped(f"pinned memory is CUDA's (tasks.loader_options pins for CUDA only), not {ctx.device}'s")
        found = ctx.tmp / f"probe-{name}.json"
        command = [sys.executable, "-m", "benchmarks.device_check", "--probe", name, "--probe-out", str(found)]
        command += ["--device", ctx.device, *(["--strict-stand-in"] if ctx.stand_in else [])]
        timeout = ctx.timeout(line)
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as error:
            raise Failed(f"no end within {timeout:.0f} s") from error
        if done.returncode != 0:
            raise Failed((done.stderr.strip().splitlines() or ["no output"])[-1][:300])
        return _read_json(found)["detail"]

    return work


# ---- the probes: each runs in a process of its own (``--probe NAME``) ---------------------------------


def _digits_loaders(device: torch.device, workers: int, batch_size: int = 64) -> tuple[object, object]:
    """Digits read as a decoding task's items are (``decodes``): by ``workers`` processes with the
    loader options of the device, beside the same read in this process."""
    from benchmarks import checkpoint, tasks  # noqa: PLC0415 - after the stand-in's registration

    task = dataclasses.replace(tasks.get("digits"), decodes=True)
    train_set, _ = task.make_datasets(None)
    model = task.make_model().to(device)
    loaders = []
    for n in (workers, 0):
        sampler = checkpoint.ResumableSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
        loaders.append(task.train_loader(train_set, sampler, batch_size, model, device, n))
    return loaders[0], loaders[1]


def probe_loader(device: torch.device, pinned: bool) -> str:
    """Two worker processes read digits onto the device: the batches equal the in-process reading's;
    on CUDA each comes in pinned memory and reaches the GPU by a non-blocking copy."""
    from benchmarks import tasks  # noqa: PLC0415

    fed, plain = _digits_loaders(device, workers=2)
    if fed.num_workers != 2 or fed.pin_memory != (device.type == "cuda"):
        raise RuntimeError(f"the loader has {fed.num_workers} workers, pin_memory={fed.pin_memory}")
    count = 0
    for (x, y), (x0, y0) in zip(fed, plain, strict=True):
        if pinned and not (x.is_pinned() and y.is_pinned()):
            raise RuntimeError(f"batch {count} is not in pinned memory")
        x, y = tasks.to_device((x, y), device)
        if x.device.type != device.type or not (torch.equal(x.cpu(), x0) and torch.equal(y.cpu(), y0)):
            raise RuntimeError(f"batch {count} differs from the one read in-process")
        count += 1
    if pinned:
        return f"{count} batches from pinned memory, non-blocking to {device}: equal"
    return f"{count} batches from 2 worker processes onto {device}: equal to the in-process reading"


def probe_cost(device: str) -> str:
    """Simulated worker-steps per second of allreduce at 16x4, on the device and on the CPU (wall
    clock: the GPU's work is not this process's CPU time), as ``tools.virtual_cost`` measures
    them: the difference between runs of 1 and 5 epochs (one step each at 64 ranks), after a run
    that pays the device's start. The stand-in's speed means nothing: it runs 1 and 2 epochs."""
    from benchmarks import timing  # noqa: PLC0415

    epochs = (1, 5) if device == "cuda" else (1, 2)
    sets = ["clock=simulated", "threads=1", "stop_at_target=false"]
    timing.timed_run("allreduce", "digits", 16, 4, 1, [*sets, f"device={device}"])
    rates = {}
    for where in (device, "cpu"):
        _, wall = timing.step_seconds("allreduce", "digits", 16, 4, epochs, [*sets, f"device={where}"])
        # a busy machine can make the longer run no slower than the shorter: then there is no number
        rates[where] = f"{1 / wall:.0f}/s" if wall > 0 else "unmeasured (the longer run was not slower)"
    note = " (the stand-in's speed means nothing)" if device != "cuda" else ""
    return f"worker-steps on {device} {rates[device]}, on the cpu {rates['cpu']} (64 ranks, 1 thread){note}"


def run_probe(name: str, device: str, out: Path) -> None:
    """``--probe NAME``: run one probe here and write its detail to ``out``."""
    if name == "cost":
        detail = probe_cost(device)
    else:
        detail = probe_loader(torch.device(device, 0), pinned=name == "pinned")
    out.write_text(json.dumps({"detail": detail}))


# ---- the check -----------------------------------------------------------------------------------------


def lines(names: list[str], scale: float = 1.0) -> list[Line]:
    """Every line, the real jobs first (they share one lane), the cost line last (it runs alone);
    their budgets are ``BUDGET_S`` times ``scale``."""
    checks = [
        ("real ddp 1x1: NCCL, device_ids", "real", real("ddp")),
        ("real allreduce 1x1: the runner's collectives", "real", real("allreduce")),
        ("real ddp 1x1: SIGTERM mid-epoch, resume", "resume", resume),
        ("real lap_sgd 1x1: 2 updater processes", "updaters", updaters("lap_sgd")),
        ("real lpp_sgd 1x1: 2 updater processes", "updaters", updaters("lpp_sgd")),
        ("loader: 2 worker processes", "loader", probe("workers")),
        ("loader: pinned memory", "loader", probe("pinned")),
    ]
    for name in names:
        for nodes, ppn in LAYOUTS:
            checks.append((f"virtual {name} {nodes}x{ppn}", "virtual", virtual(name, nodes, ppn)))
    checks.append(("virtual cluster's cost at 16x4", "cost", probe("cost")))
    return [Line(check, kind, work, BUDGET_S[kind] * scale) for check, kind, work in checks]


def run_line(ctx: Context, line: Line, report: Callable[[Line], None]) -> None:
    """Run one line, catching whatever it raises: a failing line never stops the others."""
    start = time.monotonic()
    line.deadline = start + line.budget_s
    try:
        if line.kind != "cost" and line.deadline > ctx.deadline:
            raise Skipped("not started: its budget no longer fits in the check's (--budget-s)")
        line.result, line.detail = "pass", line.work(ctx, line)
    except Skipped as reason:
        line.result, line.detail = "skip", str(reason)
    except Exception as error:  # noqa: BLE001 - the line's failure is its result
        line.result = "fail"
        line.detail = str(error) if isinstance(error, Failed) else f"{type(error).__name__}: {error}"
    line.seconds = time.monotonic() - start
    report(line)


def table(header: str, all_lines: list[Line], total_s: float) -> str:
    width = max(len(line.check) for line in all_lines)
    rows = [header, f"{'check':<{width}}  result  {'seconds':>7}  {'budget':>6}  detail"]
    for line in all_lines:
        rows.append(
            f"{line.check:<{width}}  {line.result:<6}  {line.seconds:7.1f}  {line.budget_s:6.0f}  {line.detail}"
        )
    counts = {r: sum(line.result == r for line in all_lines) for r in ("pass", "fail", "skip")}
    rows.append(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped in {total_s:.0f} s")
    return "\n".join(rows)


def describe(ctx: Context) -> dict[str, object]:
    """The machine and software the check ran on, for the table's header and the JSON."""
    info: dict[str, object] = {"device": ctx.device, "stand_in": ctx.stand_in, "torch": torch.__version__}
    info |= {"python": platform.python_version(), "cpus": os.cpu_count()}
    if ctx.device == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


@contextlib.contextmanager
def strict_forkserver(tmp: Path):
    """A forkserver whose runs have the strict device registered (as ``tests/conftest.py``'s): each
    run is forked from it with torch imported, as ``python -m tests.strict_run`` would start it."""
    path = tmp / "strict.sock"
    code = f"import tests.strict_device; from benchmarks import forkserver; forkserver.serve({str(path)!r})"
    server = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not path.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not path.exists():  # a client that found no socket would run without the stand-in
            raise RuntimeError(f"the strict forkserver did not start (exit {server.poll()})")
        yield [sys.executable, "-m", "benchmarks.forkserver", "run", str(path)]
    finally:
        server.terminate()
        server.wait(timeout=60)


def check(args: argparse.Namespace) -> int:
    device = "strict" if args.strict_stand_in else "cuda"
    begin = time.monotonic()
    scale = STAND_IN_SLOWER if args.strict_stand_in else 1
    all_lines = lines(args.algorithms, scale)
    lanes = max(2, min(8, (os.cpu_count() or 2) // 2))
    with tempfile.TemporaryDirectory(prefix="device_check-") as tmp, contextlib.ExitStack() as stack:
        runner = [sys.executable, "-m", "benchmarks.run"]
        if args.strict_stand_in:
            runner = stack.enter_context(strict_forkserver(Path(tmp)))
        cost_starts = begin + (args.budget_s or TOTAL_BUDGET_S * scale) - all_lines[-1].budget_s
        threads = max(1, (os.cpu_count() or 1) // lanes)
        ctx = Context(device, args.strict_stand_in, runner, Path(tmp), threads, cost_starts)
        info = describe(ctx)
        shown = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("device", "stand_in"))
        header = f"device check on {device}{' (the strict CPU stand-in)' if ctx.stand_in else ''}: {shown}"
        lock, done = threading.Lock(), []

        def report(line: Line) -> None:  # progress on stderr; the JSON after every line, in case the machine goes
            with lock:
                done.append(line)
                print(
                    f"[{len(done)}/{len(all_lines)}] {line.check}: {line.result} ({line.seconds:.1f} s)",
                    file=sys.stderr,
                )
                if args.out:
                    write_json(args.out, info, all_lines, time.monotonic() - begin)

        real_jobs = [line for line in all_lines if line.check.startswith("real ")]
        others = [line for line in all_lines if line not in real_jobs and line.kind != "cost"]
        with (
            concurrent.futures.ThreadPoolExecutor(1) as one_at_a_time,
            concurrent.futures.ThreadPoolExecutor(lanes - 1) as side_by_side,
        ):
            futures = [one_at_a_time.submit(run_line, ctx, line, report) for line in real_jobs]
            futures += [side_by_side.submit(run_line, ctx, line, report) for line in others]
            for future in futures:
                future.result()
        run_line(ctx, all_lines[-1], report)  # alone: it measures speed
    total = time.monotonic() - begin
    print(table(header, all_lines, total))
    if args.out:
        write_json(args.out, info, all_lines, total)
    return 1 if any(line.result == "fail" for line in all_lines) else 0


def write_json(path: Path, info: dict[str, object], all_lines: list[Line], total_s: float) -> None:
    rows = [{k: getattr(line, k) for k in ("check", "result", "detail", "seconds", "budget_s")} for line in all_lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({**info, "total_s": round(total_s, 1), "lines": rows}, indent=1) + "\n")
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="also write the table as JSON here")
    p.add_argument(
        "--strict-stand-in",
        action="store_true",
        help="check on the CPU, the strict device of tests/strict_device.py standing in for CUDA (the tests)",
    )
    p.add_argument(
        "--algorithms",
        nargs="+",
        default=algorithms.names(),
        metavar="NAME",
        help="the virtual-cluster lines' algorithms (default: all)",
    )
    p.add_argument(
        "--budget-s", type=float, help=f"seconds for the whole check (default {TOTAL_BUDGET_S}; 3x on the stand-in)"
    )
    p.add_argument("--probe", choices=("workers", "pinned", "cost"), help=argparse.SUPPRESS)  # a line's own process
    p.add_argument("--probe-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--device", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = sorted(set(args.algorithms) - set(algorithms.names()))
    if unknown:
        p.error(f"--algorithms: unknown {', '.join(unknown)}; valid: {', '.join(algorithms.names())}")
    if args.probe:
        if args.strict_stand_in:
            import tests.strict_device  # noqa: F401, PLC0415 - registers the stand-in, before any device use
        run_probe(args.probe, args.device, args.probe_out)
        return 0
    if not args.strict_stand_in and not torch.cuda.is_available():
        print(NO_ACCELERATOR)
        if args.out:
            write_json(args.out, {"device": None, "note": NO_ACCELERATOR}, [], 0.0)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
