"""Flatten run directories into two pandas tables: one row per run, one row per evaluation.

Each ``results/runs/<suite>/<run_id>/`` (format in ``results/README.md``) becomes one row of the
runs table (summary, identity and environment fields) and contributes its ``metrics.csv`` rows to
the curves table. A directory without ``summary.json`` is a run still going or cut off: it gets the
status ``running/incomplete`` and is listed, never dropped and never an error. Identity comes from
``config.json`` (fully resolved), then ``summary.json``, then the directory names, so a half-written
run is still placed in the right group.

``python -m analysis.aggregate --results DIR`` reads every run under ``DIR/runs/`` and writes
``DIR/tables/runs.csv`` and ``DIR/tables/curves.csv``; the Snakefile names the runs' ``summary.json``
files (``--summaries``) and both outputs (``--runs``, ``--curves``). The later steps read the two
tables back with :func:`read_runs` and :func:`read_curves`, which restore what CSV loses (text that
looks like a number, integers beside missing values).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis import artefacts, cli
from benchmarks import naming

logger = logging.getLogger(__name__)

INCOMPLETE = "running/incomplete"
BASELINE = "ddp"  # every speed-up is against it, and it is drawn first
IDENTITY = ["suite", "run_id", "algorithm", "task", "nodes", "procs_per_node", "world_size", "seed"]
SUMMARY_FIELDS = ["status", *naming.MEASUREMENTS, "metric", "target", "clock", "error"]
ENV_FIELDS = [
    "python",
    "torch",
    "torchvision",
    "numpy",
    "wandb",
    "mpi4py",
    "horovod",
    "hosts",
    "git_commit",
    "git_dirty",
    "backend",
    "launcher",
    "slurm_job_id",
    "device",
    "cuda",
    "nccl",
    "platform",
]
# The run's conditions: runs differing in them are never pooled, and a speed-up never crosses them.
CONDITION = ["straggler", "clock", "time_model"]
WALL_CLOCK = "measured"  # the time model of a run on the wall clock
METRIC_COLUMNS = list(naming.METRIC_COLUMNS)
_INTEGER = ["nodes", "procs_per_node", "world_size", "seed"]
_FLOAT = [*naming.MEASUREMENTS, "target"]
# Text however it looks: a CUDA version 12.10 must not come back as the number 12.1.
_TEXT = [
    "suite",
    "run_id",
    "algorithm",
    "task",
    "straggler",
    "status",
    "metric",
    "clock",
    "time_model",
    "time_source",
    "error",
    *ENV_FIELDS,
    "run_dir",
]
FILES = {"summaries": "runs/*/*", **artefacts.files(["runs", "curves"])}


def run_dirs(results: Path) -> list[Path]:
    """Return every ``runs/<suite>/<run_id>`` directory under ``results``, sorted."""
    runs = Path(results) / "runs"
    if not runs.is_dir():
        return []
    return sorted(p for p in runs.glob("*/*") if p.is_dir())


def _read_json(path: Path) -> dict | None:
    """Return the JSON object in ``path``, or None if it is missing or unreadable."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        logger.warning("Skipping unreadable %s: %s", path, error)
        return None
    return data if isinstance(data, dict) else None


def _identity(run_dir: Path, config: dict, summary: dict) -> dict:
    """Identity fields of a run: config.json over summary.json over the directory names."""
    ident: dict = {"suite": run_dir.parent.name, "run_id": run_dir.name}
    ident.update(naming.parse_run_id(run_dir.name) or {})
    for source in (summary, config):  # later sources win: config.json is the resolved truth
        ident.update({k: source[k] for k in IDENTITY if source.get(k) is not None})
    if ident.get("world_size") is None and "nodes" in ident and "procs_per_node" in ident:
        ident["world_size"] = int(ident["nodes"]) * int(ident["procs_per_node"])
    return ident


def straggler_label(settings: dict) -> str:
    """The straggler condition of a run's settings, as one label: ``none``, ``fixed 2×320 ms``,
    ``slow 1×20 ms``, ``gamma 50 ms``.

    Runs with different labels are different experiments (the report compares their throughput), so
    the label carries every setting that changes the injected delay.
    """
    kind = str(settings.get("straggler") or "none")
    delay = float(settings.get("straggler_delay_ms") or 0.0)
    if kind == "none":
        return "none"
    if kind in ("fixed", "slow"):
        return f"{kind} {int(settings.get('straggler_ranks') or 1)}×{delay:g} ms"
    return f"{kind} {delay:g} ms" if delay else kind  # simulated runs: the model, not a delay


def time_model_label(settings: dict, clock: str) -> str:
    """What a run's times mean, as one label: ``measured`` on the wall clock; on the virtual clock, the
    network, the compute time of a batch and its noise, the message size and LAP/LPP's updater
    speedup where set (``piz_daint, 620 ms a batch (CV 0.01), 102.2 MB``). Simulated runs under different time models are different experiments: never pooled."""
    if clock != "simulated":
        return WALL_CLOCK
    label = str(settings.get("sim_network", "?"))
    if (speed := float(settings.get("sim_inter_speed") or 1)) != 1:
        label += f" (inter-node link ×{speed:g})"
    label += f", {float(settings.get('sim_step_ms') or 0):g} ms a batch"
    if cv := float(settings.get("sim_step_cv") or 0):
        label += f" (CV {cv:g})"
    model_mb = float(settings.get("sim_model_mb") or 0)
    label += f", {model_mb:g} MB" if model_mb else ""
    speedup = float(settings.get("sim_updater_speedup") or 1)
    return label + (f", updaters ×{speedup:g}" if speedup != 1 else "")


def time_source(settings: dict, clock: str) -> str | None:
    """Where a simulated run's batch time comes from (``sim_step_source``: a paper's throughput, a
    measurement of ``tools.step_time``; "set by hand", the default, also for runs from before the
    setting); None on the wall clock."""
    if clock != "simulated":
        return None
    return str(settings.get("sim_step_source") or "set by hand")


def load_runs(results: Path) -> pd.DataFrame:
    """Load one row per run directory under ``results/runs/`` (see :func:`runs_table`)."""
    return runs_table(run_dirs(results))


def runs_table(dirs: Iterable[Path]) -> pd.DataFrame:
    """Load one row per run directory: identity, summary and environment fields.

    Args:
        dirs: Run directories, or their ``summary.json`` files (the Snakefile's inputs).

    Returns:
        A frame with the columns ``IDENTITY + ["straggler"] + SUMMARY_FIELDS + ["time_model",
        "time_source"] + ENV_FIELDS + ["run_dir"]``. ``status`` is ``running/incomplete`` where ``summary.json`` is missing;
        ``straggler`` is :func:`straggler_label` of the run's settings; ``clock`` is ``wall`` or
        ``simulated`` (from the summary, else the settings); ``time_model`` and ``time_source`` are
        :func:`time_model_label` and :func:`time_source`; ``hosts`` is a comma-separated string;
        absent numbers are NaN.
    """
    rows = []
    dirs = {Path(p).parent if Path(p).name == naming.SUMMARY else Path(p) for p in dirs}
    for run_dir in sorted(d for d in dirs if d.is_dir()):
        config = _read_json(run_dir / naming.CONFIG) or {}
        summary = _read_json(run_dir / naming.SUMMARY)
        env = _read_json(run_dir / "env.json") or {}
        row = _identity(run_dir, config, summary or {})
        settings = config.get("settings") or {}
        row["straggler"] = straggler_label(settings)
        row.update({k: (summary or {}).get(k) for k in SUMMARY_FIELDS})
        if summary is None:
            row["status"] = INCOMPLETE
        row["clock"] = row["clock"] or settings.get("clock") or "wall"
        row["time_model"] = time_model_label(settings, row["clock"])
        row["time_source"] = time_source(settings, row["clock"])
        row.update({k: env.get(k) for k in ENV_FIELDS})
        if isinstance(row["hosts"], list):
            row["hosts"] = ",".join(str(h) for h in row["hosts"])
        for field in ("slurm_job_id", "git_dirty"):  # strings: pandas would make 123 beside None 123.0
            if row[field] is not None:
                row[field] = str(row[field])
        row["run_dir"] = str(run_dir)
        rows.append(row)
    runs = pd.DataFrame(
        rows,
        columns=IDENTITY + ["straggler"] + SUMMARY_FIELDS + ["time_model", "time_source"] + ENV_FIELDS + ["run_dir"],
    )
    for column in _INTEGER:
        runs[column] = pd.to_numeric(runs[column], errors="coerce").astype("Int64")
    for column in _FLOAT:
        runs[column] = pd.to_numeric(runs[column], errors="coerce").astype(float)
    return runs


def load_curves(results: Path | None, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Load every ``metrics.csv`` row, prefixed with its run's identity and status.

    Args:
        results: The results directory (the one holding ``runs/``); unused where ``runs`` is given.
        runs: The output of :func:`load_runs` or :func:`runs_table`: the runs whose curves to load.

    Returns:
        A frame with ``IDENTITY + CONDITION + ["status"]`` then the metrics columns; the
        algorithms' own columns are kept (NaN for runs without them), and an empty ``comm_s`` reads
        as NaN.
    """
    runs = load_runs(results) if runs is None else runs
    frames = []
    for run in runs.itertuples(index=False):
        path = Path(run.run_dir) / naming.METRICS
        if not path.is_file():
            continue
        try:
            metrics = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError) as error:
            logger.warning("Skipping unreadable %s: %s", path, error)
            continue
        if metrics.empty:
            continue
        ident = {k: getattr(run, k) for k in IDENTITY + CONDITION + ["status"]}
        metrics = metrics.drop(columns=[c for c in ident if c in metrics.columns])
        frames.append(pd.concat([pd.DataFrame([ident] * len(metrics)), metrics], axis=1))
    columns = IDENTITY + CONDITION + ["status"] + METRIC_COLUMNS
    if not frames:
        return pd.DataFrame(columns=columns)
    curves = pd.concat(frames, ignore_index=True)
    for column in METRIC_COLUMNS:
        if column not in curves:
            curves[column] = float("nan")
        curves[column] = pd.to_numeric(curves[column], errors="coerce")
    extra = [c for c in curves.columns if c not in columns]
    return curves[columns + extra]


def read_runs(path: Path) -> pd.DataFrame:
    """Read back the runs table that :func:`write` wrote, with the types :func:`runs_table` gave it."""
    dtype = {**{c: str for c in _TEXT}, **{c: "Int64" for c in _INTEGER}, **{c: float for c in _FLOAT}}
    return pd.read_csv(path, dtype=dtype, keep_default_na=False, na_values=[""])


def read_curves(path: Path) -> pd.DataFrame:
    """Read back the curves table that :func:`write` wrote; the algorithms' own columns as read_csv infers."""
    text = [c for c in _TEXT if c in IDENTITY + CONDITION + ["status"]]
    dtype = {**{c: str for c in text}, **{c: "Int64" for c in _INTEGER}}
    return pd.read_csv(path, dtype=dtype, keep_default_na=False, na_values=[""])


def write(files: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write the runs and curves tables of the runs in ``files["summaries"]``; return both frames."""
    runs = runs_table(files["summaries"])
    curves = load_curves(None, runs)
    for name, frame in (("runs", runs), ("curves", curves)):
        Path(files[name]).parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(files[name], index=False)
    return runs, curves


def main(argv: list[str] | None = None) -> None:
    """Command line: write the aggregate CSV tables."""
    files = cli.parse("Aggregate run directories into runs.csv and curves.csv.", FILES, argv)
    runs, curves = write(files)
    print(f"{len(runs)} runs, {len(curves)} evaluations -> {files['runs']}, {files['curves']}")


if __name__ == "__main__":
    main()
