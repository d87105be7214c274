"""Validation: the virtual cluster's predictions against measurements, fit and test apart.

    python -m tools.validate [--cases analysis/papers/validation.yaml] [--out results/tables/validation.csv]
                                  [--work DIR] [--only REGEX] [--ratios-only]

A verdict at a paper's scale is only as good as the time model behind it, and a model is only
checked by a number it was not fitted to. Each case of the case file (``analysis/papers/validation.yaml``)
is a measured number with its source, the simulated run (or two, for a ratio) that predicts it, and
its role: ``fit`` where the model or one of its inputs was chosen on that number, which is then not
scored, ``test`` otherwise. Two kinds of measurement:

- published ones on the papers' own clusters (DASO's Table 2, WAGMA-SGD's Sec. 5 numbers), each
  predicted by a short run of the virtual cluster under that paper's network preset and batch time,
  through ``benchmarks.run --set clock=simulated``; the time of a step is the run's training time
  (its simulated clock less the evaluations it charges) over its steps;
- the emulated two-level network of this machine (``benchmarks/netns.py``, ``--set link_mbit=R``,
  root only): a real 2 x 2 gloo run of digits behind links of R Mbit/s, its steady-state time per
  step (after the first epoch), predicted by its virtual twin on a network built from the rate
  (inter-node: R; the per-message latency, ``sync_s`` and the intra-node link: this machine's
  loopback, measured now as ``tools.calibrate`` does) and the compute time of a step measured
  alone (4 single-process runs at once, ``calibrate.measure_batch``). Without root these are left out,
  with the reason printed.

It writes one row per case (``COLUMNS``) and prints the geometric mean of the test rows' |relative
error| per network, the figure simulators publish (ASTRA-sim, vTrain, Echo: their validation tables).
``geomean_by_network`` reads that file back for the report. Run directories go under ``--work``
(a temporary folder by default, removed at the end); a run already finished there is reused.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import algorithms
from analysis import artefacts
from benchmarks import config, matrix, naming, netns, run
from benchmarks.validation_cases import (  # noqa: F401 - the case file's API, used here and by the tests
    CASES,
    EMULATED,
    QUANTITIES,
    ROLES,
    UNITS,
    algorithm_of,
    geomean_abs,
    load,
    pair_role,
    pairs,
    ratio_rules,
    ratio_summary,
)
from benchmarks.virtual import job, network
from tools import calibrate

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / artefacts.EXTERNAL["validation"]
COLUMNS = ["case", "source", "network", "measured", "predicted", "relative_error", "role", "unit"]


# -- the case file (benchmarks/validation_cases.py) and the errors -------------------------------


def relative_error(measured: float, predicted: float) -> float:
    """Signed: the prediction over the measurement, less 1 (+0.1 predicts 10 % too high)."""
    return predicted / measured - 1.0


def geomean_by_network(rows: list[dict] | Path | str = OUT) -> dict[str, float]:
    """{network: geomean |relative error| of its test rows}, from rows or a validation.csv."""
    if isinstance(rows, (str, Path)):
        with open(rows, newline="") as f:
            rows = list(csv.DictReader(f))
    errors: dict[str, list[float]] = {}
    for r in rows:
        if r["role"] == "test" and r["relative_error"] not in ("", None):
            errors.setdefault(r["network"], []).append(float(r["relative_error"]))
    return {net: geomean_abs(e) for net, e in errors.items()}


# -- the ratios ---------------------------------------------------------------------------------

RATIO_COLUMNS = [
    "ratio", "network", "algorithm", "baseline", "family", "measured", "predicted", "relative_error", "role", "source",
]  # fmt: skip
TIMES = ("time", "emulated_step")  # a smaller number is faster; steps_per_s: a larger one


def family_of(name: str) -> str:
    """How an algorithm communicates (``Algorithm.family``): the ratio errors are summarised by it."""
    return algorithms.get(name).family


def speed(case: dict, value: float) -> float:
    """A number of ``case`` as a speed, so that a speed-up is always the algorithm's over the baseline's."""
    if case["quantity"] in TIMES:
        return 1.0 / value
    if case["quantity"] == "steps_per_s":
        return value
    raise ValueError(f"case {case['case']!r}: a {case['quantity']} is not a time or a throughput; it cannot pair")


def ratio_rows(cases: list[dict], rows: dict[str, dict], rules: list[dict]) -> list[dict]:
    """The speed-ups a verdict reads, measured and predicted: the published ``speedup`` cases as they
    are, and every pair that ``rules`` name (the baseline's time over the algorithm's, from the two
    measured numbers and from the two predictions). A ratio is ``fit`` where either of its cases is
    (a number that chose a model input is in it), ``apparatus`` where either is spoiled by the
    machine. Cases not in ``rows`` (left out, or not asked for with ``--only``) give no ratio."""
    out = []

    def add(name: str, case: dict, base_spec: dict, measured: float, predicted: float, role: str) -> None:
        algorithm, baseline = algorithm_of(case["run"]), algorithm_of(base_spec)
        out.append(
            {
                "ratio": name,
                "network": case["network"],
                "algorithm": algorithm,
                "baseline": baseline,
                "family": family_of(case["run"]["algorithm"]),
                "measured": measured,
                "predicted": predicted,
                "relative_error": relative_error(measured, predicted),
                "role": role,
                "source": case["source"],
            }
        )

    for case in cases:  # the roles are the case file's: a re-read table takes a role changed since
        if case["quantity"] == "speedup" and case["case"] in rows:
            r = rows[case["case"]]
            add(case["case"], case, case["baseline"], r["measured"], r["predicted"], case["role"])
    for case, base in pairs(cases, rules):
        if case["case"] not in rows or base["case"] not in rows:
            continue
        a, b = rows[case["case"]], rows[base["case"]]
        measured = speed(case, a["measured"]) / speed(base, b["measured"])
        predicted = speed(case, a["predicted"]) / speed(base, b["predicted"])
        add(f"{case['case']} over {base['case']}", case, base["run"], measured, predicted, pair_role(case, base))
    return out


# -- the runs -----------------------------------------------------------------------------------


def run_name(spec: dict) -> str:
    """A folder name unique to a run's arguments (cases that share a run share its folder)."""
    items = "_".join(f"{k}={v}" for k, v in sorted(spec.get("set", {}).items()))
    digest = hashlib.sha1(items.encode()).hexdigest()[:10]
    return f"{spec['algorithm']}-{spec['task']}-n{spec['nodes']}x{spec['procs_per_node']}-{digest}"


def run_argv(spec: dict, out: Path, extra: dict | None = None) -> list[str]:
    """``benchmarks.run``'s arguments for ``spec`` (algorithm, task, nodes, procs_per_node, seed, set),
    the settings of ``extra`` after its own; knobs of other algorithms are dropped, as a matrix does."""
    argv = ["--algorithm", spec["algorithm"], "--task", spec["task"], "--nodes", str(spec["nodes"])]
    argv += ["--procs-per-node", str(spec["procs_per_node"]), "--seed", str(spec.get("seed", 0))]
    argv += ["--out", str(out), "--keep-finished", "--set", "wandb=false", "--set", "checkpoint_every=0"]
    items = [f"{k}={v}" for k, v in {**spec.get("set", {}), **(extra or {})}.items()]
    for item in matrix.overrides_for(spec["algorithm"], spec["task"], items):
        argv += ["--set", item]
    return argv


_SIMULATED: set[Path] = set()  # the folders this process ran: it holds their locks until it ends


def simulate(spec: dict, work: Path, extra: dict | None = None) -> Path:
    """Run ``spec`` on the virtual cluster in this process (its ranks are threads); its folder. A run
    that several cases share (a speed-up's baseline) runs once."""
    out = work / (run_name({**spec, "set": {**spec.get("set", {}), **(extra or {})}}))
    if out in _SIMULATED:
        return out
    argv = run_argv(spec, out, {"clock": "simulated", **(extra or {})})
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        code = run.main(argv)
    if code != 0:
        raise RuntimeError(f"simulated run failed: python -m benchmarks.run {' '.join(argv)} (see {out}/log.txt)")
    _SIMULATED.add(out)
    return out


def rows_of(rundir: Path) -> list[dict]:
    with open(rundir / naming.METRICS, newline="") as f:
        return list(csv.DictReader(f))


def train_step_s(rundir: Path) -> float:
    """Seconds of simulated training a step (``summary.json``'s ``step_s``: the run's clock less its
    evaluations, over its steps). The papers' throughputs count training steps."""
    return json.loads((rundir / naming.SUMMARY).read_text())["step_s"]


def steady_step_s(rundir: Path) -> float:
    """Seconds a training step after the first evaluation: start-up and the first steps' warm-up left
    out, and the evaluations (``eval_s``: the forward passes, the models' spread and average, which
    the real run and its twin time differently and no algorithm's step pays)."""
    rows = rows_of(rundir)
    first, last = rows[0], rows[-1]
    train = [float(r["wall_s"]) - float(r["eval_s"]) for r in (first, last)]
    return (train[1] - train[0]) / (int(last["step"]) - int(first["step"]))


def predict_published(case: dict, work: Path) -> float:
    """The case's number from its simulated run (and its baseline's)."""
    step = train_step_s(simulate(case["run"], work))
    quantity, unit = case["quantity"], case["unit"]
    if quantity == "steps_per_s":
        return 1.0 / step
    if quantity == "speedup":
        return train_step_s(simulate(case["baseline"], work)) / step
    steps = case["steps"]
    total = steps["epochs"] * steps["samples"] / (steps["gpus"] * steps["batch"])
    return step * total / UNITS[unit]


def predict_bus_bandwidth(case: dict) -> float:
    """nccl-tests' bus bandwidth of one all-reduce of ``bytes`` over ``nodes`` x ``procs_per_node``
    ranks, as the virtual cluster times it under the case's network: the bytes over the time, times
    2(n-1)/n (nccl-tests' doc/PERFORMANCE.md), in GB/s."""
    spec = case["allreduce"]
    n = spec["nodes"] * spec["procs_per_node"]

    def body(rank: int, cluster: job.Cluster) -> float:
        job.init_process_group(rank, cluster)
        cluster.byte_scale = spec["bytes"] / 4.0  # one float on the wire as the case's bytes
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()
        return cluster.scheduler.now()

    seconds = max(job.run(n, spec["procs_per_node"], network.load(case["network"]), body))
    return spec["bytes"] / seconds * 2 * (n - 1) / n / 1e9


# -- the emulated network -----------------------------------------------------------------------


def measure_machine(work: Path, ranks: set[int] = frozenset({calibrate.RANKS})) -> dict[int, dict]:
    """The inputs of the emulated cases' twins, for each number of ranks in ``ranks``: this machine's
    loopback link and ``sync_s`` among that many processes (``calibrate.measure_network``) and a
    step's compute with that many ranks on its cores (``calibrate.measure_batch``), measured on the
    calibration's own cells (all ranks on loopback, no shaping). What a message or a step costs here
    depends on how many processes share the cores: 2 ranks on 2 cores have one each, 4 do not."""
    machine = {}
    for n in sorted(ranks):
        net, _ = calibrate.measure_network(reps=20, ranks=n)  # a third of the calibration's: a minute, not three
        machine[n] = {"intra": vars(net.intra), "sync_s": net.sync_s, "skips": net.skips_empty_segments}
        machine[n]["step_ms"] = calibrate.measure_batch(ranks=n) * 1e3
    (work / "machine.json").write_text(json.dumps(machine, indent=2) + "\n")  # for the record: never reused
    return machine


def world_size(case: dict) -> int:
    return case["run"]["nodes"] * case["run"]["procs_per_node"]


def emulated_network(rate_mbit: float, machine: dict, work: Path, ranks: int = calibrate.RANKS) -> Path:
    """The virtual cluster's network for links of ``rate_mbit``: between nodes the payload the
    configured rate carries (tc's mbit: 10^6 bit/s, of which each full frame's 1514 bytes hold 1448
    of TCP payload) and the loopback's per-message latency (tbf adds no delay: no netem here); inside
    a node the loopback itself; this machine's ``sync_s`` and gloo's empty segments, as measured
    among ``ranks`` processes (``machine``: ``measure_machine``'s entry for them)."""
    intra = network.Link(**machine["intra"])
    payload = rate_mbit * 1e6 / 8 * netns.PAYLOAD_BYTES / netns.FRAME_BYTES
    inter = network.Link(latency_s=intra.latency_s, bandwidth_bps=payload)
    source = "tools/validate.py: the TCP payload of benchmarks/netns.py's tbf rate, the loopback's latency"
    net = network.Network(
        f"emulated_{rate_mbit:g}mbit",
        intra,
        inter,
        {"inter": source, "intra": "this machine's loopback (tools.calibrate.measure_network)"},
        sync_s=machine["sync_s"],
        skips_empty_segments=machine["skips"],
    )
    path = work / f"network-{rate_mbit:g}mbit-{ranks}ranks.json"
    network.save(net, path)
    return path


def measure_emulated(case: dict, work: Path) -> Path:
    """The case's real run behind links of its rate (a process of its own: the launcher forks its
    ranks, which a process that has run the virtual cluster's threads must not)."""
    out = work / f"real-{run_name(case['run'])}-{case['rate_mbit']:g}mbit"
    argv = run_argv(case["run"], out, {"link_mbit": case["rate_mbit"], "device": "cpu"})
    done = subprocess.run([sys.executable, "-m", "benchmarks.run", *argv], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"emulated run failed: python -m benchmarks.run {' '.join(argv)}\n{done.stderr[-2000:]}")
    return out


def predict_emulated(case: dict, machine: dict, work: Path) -> float:
    """The twin of the case's real run: same run, virtual clock, this rate's network, the batch alone;
    the real links' own settings (``link_queue_ms``) have no twin."""
    knobs = {k: v for k, v in case["run"].get("set", {}).items() if k not in config.CLOCK_ONLY["wall"]}
    ranks = world_size(case)
    extra = {
        "sim_network": str(emulated_network(case["rate_mbit"], machine[ranks], work, ranks)),
        "sim_step_ms": round(machine[ranks]["step_ms"], 4),
        "sim_step_source": f"tools.validate: calibrate.measure_batch, {ranks} runs at once",
        "device": "cpu",
    }
    return steady_step_s(simulate({**case["run"], "set": knobs}, work, extra))


# -- the table ----------------------------------------------------------------------------------


def evaluate(case: dict, work: Path, machine: dict | None) -> dict:
    """One row of the table: the case measured (from the file, or by its real run) and predicted."""
    if case["quantity"] == "emulated_step":
        measured = steady_step_s(measure_emulated(case, work)) / UNITS[case["unit"]]
        predicted = predict_emulated(case, machine, work) / UNITS[case["unit"]]
    elif case["quantity"] == "bus_bandwidth":
        measured, predicted = float(case["measured"]), predict_bus_bandwidth(case)
    else:
        measured, predicted = float(case["measured"]), predict_published(case, work)
    error = relative_error(measured, predicted)
    row = {k: case[k] for k in ("case", "source", "network", "role", "unit")}
    return {**row, "measured": measured, "predicted": predicted, "relative_error": error}


def write(rows: list[dict], path: Path, columns: list[str] = COLUMNS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, **{k: f"{r[k]:.6g}" for k in ("measured", "predicted", "relative_error")}})


def read_rows(path: Path) -> dict[str, dict]:
    """A written table of cases, by case name, its numbers as floats."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("measured", "predicted", "relative_error"):
            r[k] = float(r[k])
    return {r["case"]: r for r in rows}


def report(rows: list[dict], left_out: list[dict], skipped: list[str]) -> None:
    print(f"{'case':<34} {'role':<4} {'measured':>10} {'predicted':>10} {'error':>7}")
    for r in rows:
        m, p, e = r["measured"], r["predicted"], r["relative_error"]
        print(f"{r['case']:<34} {r['role']:<4} {m:>10.4g} {p:>10.4g} {e:>+7.1%}  {r['unit']}")
    for why in skipped:
        print(f"left out: {why}")
    for item in left_out:
        print(f"not predicted: {item['source']}: {item['what']} ({item['why']})")
    counts = {}
    for r in rows:
        if r["role"] == "test":
            counts[r["network"]] = counts.get(r["network"], 0) + 1
    for net, g in geomean_by_network(rows).items():
        print(f"geomean |relative error| of the {counts[net]} test rows on {net}: {g:.1%}")


def report_ratios(ratios: list[dict]) -> None:
    """The speed-ups' errors by network and family, the test ratios only: what a verdict reads."""
    print(
        f"\nspeed-ups (the baseline's time over the algorithm's), {sum(r['role'] == 'test' for r in ratios)} test ratios:"
    )
    print(f"{'network':<20} {'family':<19} {'ratios':>6} {'geomean':>8} {'largest':>8}  largest at")
    for s in ratio_summary(ratios):
        g, worst = s["geomean_abs_error"], s["largest_abs_error"]
        print(f"{s['network']:<20} {s['family']:<19} {s['test_ratios']:>6} {g:>8.1%} {worst:>8.1%}  {s['largest']}")
    spoiled = sorted({r["algorithm"] for r in ratios if r["role"] == "apparatus"})
    if spoiled:
        n = sum(r["role"] == "apparatus" for r in ratios)
        print(f"left out: {n} ratios the machine spoils ({', '.join(spoiled)}; the cases' `apparatus` says how)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.validate", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=Path, default=CASES)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--work", type=Path, help="where the runs go (default: a temporary folder, removed)")
    p.add_argument("--only", help="only the cases whose name this regular expression finds (e.g. 'emulated|nccl')")
    p.add_argument(
        "--ratios-only",
        action="store_true",
        help="rebuild the ratio table from the table of cases at --out, run nothing",
    )
    args = p.parse_args(argv)
    every, left_out = load(args.cases)
    rules = ratio_rules(args.cases)
    pairs(every, rules)  # a rule that pairs nothing is an error before any run
    if args.ratios_only:
        ratios = ratio_rows(every, read_rows(args.out), rules)
        write(ratios, artefacts.validation_ratios(args.out), RATIO_COLUMNS)
        report_ratios(ratios)
        print(f"wrote {artefacts.validation_ratios(args.out)}")
        return 0
    cases = [c for c in every if args.only is None or re.search(args.only, c["case"])]
    ok, why = netns.available() if any(c["quantity"] == "emulated_step" for c in cases) else (True, "")
    skipped = [] if ok else [f"the emulated cases: {why}"]
    cases = [c for c in cases if ok or c["quantity"] != "emulated_step"]
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="validate-")))
        work.mkdir(parents=True, exist_ok=True)
        emulated = [c for c in cases if c["quantity"] == "emulated_step"]
        machine = measure_machine(work, {world_size(c) for c in emulated}) if emulated else None
        # The emulated cases first, beside the measurement of their machine's numbers.
        rows = {c["case"]: evaluate(c, work, machine) for c in emulated}
        rows |= {c["case"]: evaluate(c, work, machine) for c in cases if c not in emulated}
    ordered = [rows[c["case"]] for c in cases]
    write(ordered, args.out)
    ratios = ratio_rows(every, rows, rules)
    write(ratios, artefacts.validation_ratios(args.out), RATIO_COLUMNS)
    report(ordered, left_out, skipped)
    report_ratios(ratios)
    print(f"wrote {args.out} and {artefacts.validation_ratios(args.out)} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
