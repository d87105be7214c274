"""Calibration: the virtual cluster's time to target for the embedded runs, beside the measured one.

    python -m tools.calibrate [--algorithms ddp allreduce ...] [--seeds 0 1 2] [--out results/calibration]

The virtual cluster is only as good as its time model. Here it is given this machine's numbers and
asked to predict what the real runs of the embedded default (digits, 2 nodes x 2 processes, its
``config/config.yaml`` settings) measure:

1. the network: a gloo all-reduce among 4 processes of this machine, 256 B to 4 MB, back to back,
   fitted to the ring model's ``2(p-1)(alpha + n / (p beta))`` (one link: every rank here shares
   the loopback), and what the same all-reduce adds to a training iteration beyond that (a batch
   then the all-reduce, less the batch alone, all ranks at once): the wait for the ranks whose
   batch the OS ran last, which the first communication after a compute phase pays (``sync_s``;
   the evaluation's six collectives in a row pay it once). Written as ``network.json``, which
   ``--set sim_network=`` reads;
2. a batch's compute: the runner's training step with no communication, 4 single-process runs at
   once, as the real run's 4 ranks share the cores (``sim_step_ms``);
3. each algorithm's real run and its simulated twin (same seed, same settings, the two numbers above):
   time to target from both summaries. LAP/LPP-SGD's twin is given this machine's updater throughput
   (``updater_speedup``): its real ranks run U updater processes and a busy-polling averager each,
   U + 1 busy processes where the measured batch had one.

It writes ``calibration.csv`` (one row per algorithm and seed, with its ``role``: ``fit`` for the
algorithms the model was chosen on, ``test`` for the others: each class's ``calibration``),
``calibration.json`` (the measured link and batch time: the cells every prediction is fitted to) and
``calibration.png`` (predicted against measured, with the 25 % band), and prints the error per
algorithm and the geometric mean of the test algorithms' |error|, as ``tools.validate`` does. ``analysis/report.py`` shows them where present. The parameter-server
family is not predicted: its arrival model charges no evaluation, and its real runs' master is a
process of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

import algorithms
from analysis import artefacts
from analysis.overview import calibration_summary
from benchmarks import matrix, naming, run, tasks
from benchmarks.virtual import network

ROOT = Path(__file__).resolve().parents[1]
RANKS, NODES, PPN = 4, 2, 2
SIZES = [2**k for k in range(6, 21, 2)]  # float32 elements: 256 B to 4 MB
# Each algorithm says its role (``Algorithm.calibration``): ``fit`` where a choice of the time model
# (``sync_s``, gloo's skipped empty segments, LAP/LPP-SGD's updater speed-up) was made seeing its
# cells, which are then shown, not scored; ``test`` where none was, its cells out of sample. A model
# change chosen on a ``test`` algorithm makes it ``fit`` (tools/validate.py's rule).
FITTED = [name for name in algorithms.names() if algorithms.get(name).calibration == "fit"]
TESTED = [name for name in algorithms.names() if algorithms.get(name).calibration == "test"]
PREDICTED = [*FITTED, *TESTED]


def _init(rank: int, store: str, ranks: int) -> None:
    torch.set_num_threads(tasks.cpu_share(ranks))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ranks)


def _allreduce_times(rank: int, store: str, result: str, ranks: int, reps: int) -> None:
    """Two times per size, on all ``ranks`` ranks at once: an all-reduce back to back with the next (the
    link's own cost), and what it adds to a training iteration (a batch then the all-reduce, less
    the batch alone). They differ by the wait for the ranks whose batch the OS ran last on the
    shared cores: several ms for any size, where the link's own cost is a fraction of one. Timing
    the all-reduce call after a batch alone would count that wait beside the batch time
    (``measure_batch``: 4 runs at once), which holds it already."""
    _init(rank, store, ranks)
    task = tasks.get("digits")
    model = task.make_model()
    train_set, _ = task.make_datasets(None)
    x_batch = torch.stack([train_set[i][0] for i in range(task.hparams["batch_size"])])

    def iteration_s(x: torch.Tensor | None) -> float:
        """Seconds per iteration over ``reps``, the mean over the ranks."""
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            model(x_batch).sum().backward()
            if x is not None:
                dist.all_reduce(x)
        seconds = torch.tensor([(time.perf_counter() - start) / reps], dtype=torch.float64)
        dist.all_reduce(seconds)
        return seconds.item() / ranks

    def back_to_back_s(x: torch.Tensor) -> float:
        """Seconds per all-reduce over ``reps`` in a row, the mean over the ranks."""
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x)
        seconds = torch.tensor([(time.perf_counter() - start) / reps], dtype=torch.float64)
        dist.all_reduce(seconds)
        return seconds.item() / ranks

    batch_s = statistics.median(iteration_s(None) for _ in range(3))
    alone, added = [], []
    for n in SIZES:
        x = torch.ones(n)
        for _ in range(3):
            dist.all_reduce(x)
        alone.append(statistics.median(back_to_back_s(x) for _ in range(3)))
        added.append(max(statistics.median(iteration_s(x) for _ in range(3)) - batch_s, 0.0))
    if rank == 0:
        Path(result).write_text(json.dumps({"back_to_back_s": alone, "added_to_iteration_s": added}))
    dist.destroy_process_group()


def _spawn(fn, ranks: int, *args) -> object:
    with tempfile.TemporaryDirectory() as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        mp.start_processes(fn, args=(store, result, ranks, *args), nprocs=ranks, start_method="fork")
        return json.loads(Path(result).read_text())


def fit_ring(nbytes: list[float], seconds: list[float], ranks: int) -> network.Link:
    """The link whose ring all-reduce (``network.Network.ring_allreduce``) best fits the measured
    times, least squares: ``t(n) = 2(p-1) alpha + 2(p-1)/p n / beta``, a line in ``n``."""
    slope, intercept = np.polyfit(np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float), 1)
    steps = 2 * (ranks - 1)
    return network.Link(latency_s=float(max(intercept, 0.0) / steps), bandwidth_bps=float(steps / (ranks * slope)))


def measure_network(reps: int = 60, ranks: int = RANKS) -> tuple[network.Network, dict[str, list[float]]]:
    """This machine's link, fitted to the ring all-reduce (``t(n) = 2(p-1) alpha + 2(p-1)/p n / beta``)
    on back-to-back all-reduces among ``ranks`` processes, and its ``sync_s``: the median over the
    sizes of what an all-reduce adds to a training iteration beyond its back-to-back time."""
    times = _spawn(_allreduce_times, ranks, reps)
    alone, added = times["back_to_back_s"], times["added_to_iteration_s"]
    link = fit_ring([4 * n for n in SIZES], alone, ranks)
    sync_s = max(statistics.median(a - b for a, b in zip(added, alone)), 0.0)
    where = f"{ranks} processes of this machine ({os.uname().nodename}), 256 B to 4 MB, median of 3 means of {reps}"
    source = f"gloo all-reduces back to back among {where}, least squares on the ring model (tools/calibrate.py)"
    sync = (
        f"what the same all-reduces add to a training iteration (a batch then the all-reduce, less the batch "
        f"alone) beyond their back-to-back time, median over the sizes: the ranks share {os.cpu_count()} cores"
    )
    segments = "gloo's ring: an all-reduce of fewer elements than 2p segments sends its non-empty ones only"
    net = network.Network(
        "this_machine",
        intra=link,
        inter=link,
        sources={"intra": source, "inter": source, "sync": sync, "segments": segments},
        sync_s=sync_s,
        skips_empty_segments=True,
    )
    return net, times


def measure_batch(epochs: tuple[int, int] = (2, 8), ranks: int = RANKS) -> float:
    """Seconds of one training step of the runner on this machine while ``ranks`` ranks share its
    cores: ``ranks`` single-process runs at once (allreduce on 1 x 1: no communication), the
    difference between runs ``epochs`` apart over the steps it adds (start-up and the one evaluation
    cancel)."""
    walls: dict[int, list[float]] = {}
    steps = 0
    for e in epochs:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [sys.executable, "-m", "benchmarks.run", "--algorithm", "allreduce", "--task", "digits"]
            argv += ["--nodes", "1", "--procs-per-node", "1", "--set", "wandb=false", "--set", f"epochs={e}"]
            argv += ["--set", f"eval_every={e}", "--set", "checkpoint_every=0", "--set", "threads=1"]
            outs = [Path(tmp) / str(i) for i in range(ranks)]
            procs = [
                subprocess.Popen([*argv, "--seed", str(i), "--out", str(out)], cwd=ROOT, stderr=subprocess.DEVNULL)
                for i, out in enumerate(outs)
            ]
            if any(p.wait() for p in procs):
                raise RuntimeError(f"a calibration run failed: python -m benchmarks.run {' '.join(argv[3:])}")
            summaries = [json.loads((out / naming.SUMMARY).read_text()) for out in outs]
            walls[e], steps = [x["wall_s"] for x in summaries], summaries[0]["steps"] // e
    short, long = epochs
    return statistics.median((b - a) / ((long - short) * steps) for a, b in zip(walls[short], walls[long]))


def embedded_sets(algorithm: str) -> list[str]:
    """The ``--set`` items the embedded default (config/config.yaml) gives ``algorithm``'s runs."""
    (embedded,) = [
        m
        for m in matrix.matrices(yaml.safe_load((ROOT / "config/config.yaml").read_text()))
        if m["suite"] == "embedded"
    ]
    return matrix.overrides_for(algorithm, "digits", embedded["overrides"])


def updater_speedup(algorithm: str) -> list[str]:
    """LAP/LPP-SGD's ``sim_updater_speedup`` on this machine: the U updaters' throughput against the
    one process of the measured batch. Each rank runs U updater processes and an averager that polls
    without pause (``poll_ms=0``), U + 1 busy processes sharing the cores where the batch was measured
    with one a rank: an updater's batch takes U + 1 measured batches, which the virtual clock, charging
    an update a batch x U / speedup, gives with speedup U / (U + 1). Other algorithms: nothing."""
    if algorithm not in ("lap_sgd", "lpp_sgd"):
        return []
    knobs = dict(item.split("=", 1) for item in embedded_sets(algorithm))
    updaters = int(knobs.get("updaters", 4))
    return [f"sim_updater_speedup={updaters / (updaters + 1):.6f}"]


def time_to_target(algorithm: str, seed: int, sets: list[str]) -> float | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = ["--algorithm", algorithm, "--task", "digits", "--nodes", str(NODES), "--procs-per-node", str(PPN)]
        argv += ["--seed", str(seed), "--out", str(out), "--set", "wandb=false"]
        for item in [*embedded_sets(algorithm), *sets]:
            argv += ["--set", item]
        with contextlib.redirect_stderr(io.StringIO()):
            code = run.main(argv)
        if code != 0:
            raise RuntimeError(f"{algorithm} seed {seed} failed: see `python -m benchmarks.run {' '.join(argv)}`")
        return json.loads((out / naming.SUMMARY).read_text())["time_to_target_s"]


def figure(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    done = [r for r in rows if r["measured_s"] is not None and r["predicted_s"] is not None]
    names = sorted({r["algorithm"] for r in done})
    for i, name in enumerate(names):
        points = [(r["measured_s"], r["predicted_s"]) for r in done if r["algorithm"] == name]
        marker = "os^D"[i // 10 % 4]  # tab10 has 10 colours; the 11th algorithm on gets another shape
        ax.scatter(*zip(*points), label=name, color=plt.cm.tab10(i % 10), marker=marker, s=28)
    top = max([max(r["measured_s"], r["predicted_s"]) for r in done], default=1.0) * 1.15
    line = np.linspace(0, top, 50)
    ax.plot(line, line, color="black", lw=1)
    ax.fill_between(line, 0.75 * line, 1.25 * line, color="grey", alpha=0.2, label="within 25 %")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="measured time to target (s, wall clock)")
    ax.set(ylabel="predicted (s, virtual clock)", title="Virtual cluster against this machine: digits, 2 x 2")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--algorithms", nargs="+", default=PREDICTED)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=ROOT / "results" / "calibration")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    net, times = measure_network()
    network.save(net, args.out / "network.json")
    step_s = measure_batch()
    link = net.inter
    print(
        f"link: {link.latency_s * 1e6:.1f} us + n / {link.bandwidth_bps / 1e9:.2f} GB/s, "
        f"{net.sync_s * 1e3:.2f} ms after compute; batch {step_s * 1e3:.2f} ms"
    )
    allreduce = {k: dict(zip(SIZES, v)) for k, v in times.items()}
    (args.out / "calibration.json").write_text(
        json.dumps({"network": str(args.out / "network.json"), "allreduce_s": allreduce,
                    "sim_step_ms": step_s * 1e3, "ranks": RANKS}, indent=2) + "\n"
    )  # fmt: skip
    simulated = ["clock=simulated", f"sim_network={args.out / 'network.json'}", f"sim_step_ms={step_s * 1e3:.4f}"]
    simulated.append(
        f"sim_step_source=measured by python -m tools.calibrate on {os.uname().nodename}: {RANKS} runs at once"
    )
    rows = []
    for algorithm in args.algorithms:
        for seed in args.seeds:
            measured = time_to_target(algorithm, seed, [])
            predicted = time_to_target(algorithm, seed, [*simulated, *updater_speedup(algorithm)])
            role = "fit" if algorithm in FITTED else "test"
            rows.append(
                {"algorithm": algorithm, "seed": seed, "measured_s": measured, "predicted_s": predicted, "role": role}
            )
            print(f"  {algorithm:<15} seed {seed}: measured {measured} s, predicted {predicted} s", flush=True)
    table = args.out / Path(artefacts.EXTERNAL["calibration"]).name
    with open(table, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["algorithm", "seed", "measured_s", "predicted_s", "role"])
        writer.writeheader()
        writer.writerows(rows)
    figure(rows, artefacts.calibration_figure(table))
    summary = calibration_summary(pd.DataFrame(rows))
    print(f"{'algorithm':<15} {'measured':>9} {'predicted':>10} {'error':>7}")
    for r in summary.itertuples():
        if pd.isna(r.error):
            print(f"{r.algorithm:<15} {'no target':>9}")
            continue
        role = "fit" if r.algorithm in FITTED else "test"
        print(f"{r.algorithm:<15} {r.measured_s:>8.2f}s {r.predicted_s:>9.2f}s {r.error:>+7.0%} {role}")
    tested = [abs(e) for a, e in zip(summary["algorithm"], summary["error"]) if a not in FITTED and not pd.isna(e)]
    if tested:  # the geometric mean, as tools.validate scores its test rows
        mean = float(np.exp(np.mean(np.log(np.maximum(tested, 1e-12)))))
        print(f"test algorithms (out of sample): geomean |error| {mean:.1%} over {len(tested)}")
    print(f"wrote {args.out}/calibration.csv, calibration.png, network.json")


if __name__ == "__main__":
    main()
