"""Flatten the run directories under ``results/runs/`` into two pandas tables.

Each ``results/runs/<suite>/<run_id>/`` (format in ``results/README.md``) becomes one row of the
runs table (summary, identity and environment fields) and contributes its ``metrics.csv`` rows to
the curves table. A directory without ``summary.json`` is a run still going or cut off: it gets the
status ``running/incomplete`` and is listed, never dropped and never an error. Identity comes from
``config.json`` (fully resolved), then ``summary.json``, then the directory names, so a half-written
run is still placed in the right group.

Run as ``python -m analysis.aggregate --results DIR`` to write ``DIR/tables/runs.csv`` and
``DIR/tables/curves.csv``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

import pandas as pd

logger = logging.getLogger(__name__)

INCOMPLETE = "running/incomplete"
IDENTITY = ["suite", "run_id", "algorithm", "task", "nodes", "procs_per_node", "world_size", "seed"]
SUMMARY_FIELDS = [
    "status", "time_to_target_s", "epochs_to_target", "final_metric", "best_metric",
    "final_train_loss", "epochs", "steps", "samples", "wall_s", "throughput", "comm_share",
    "metric", "target", "clock", "error",
]
ENV_FIELDS = ["python", "torch", "torchvision", "numpy", "wandb", "mpi4py", "horovod", "hosts", "git_commit",
              "git_dirty", "backend", "launcher", "slurm_job_id", "device", "cuda", "nccl", "platform"]
# The run's conditions: runs differing in them are never pooled, and a speed-up never crosses them.
CONDITION = ["straggler", "clock"]
METRIC_COLUMNS = [
    "epoch", "step", "samples", "wall_s", "train_loss", "val_loss", "val_metric", "lr", "comm_s",
]
_INTEGER = ["nodes", "procs_per_node", "world_size", "seed"]
_FLOAT = [
    "time_to_target_s", "epochs_to_target", "final_metric", "best_metric", "final_train_loss",
    "epochs", "steps", "samples", "wall_s", "throughput", "comm_share", "target",
]
# <task>__<algorithm>__n<nodes>x<procs_per_node>__s<seed>, the last resort for identity.
_RUN_ID = re.compile(
    r"^(?P<task>.+)__(?P<algorithm>.+)__n(?P<nodes>\d+)x(?P<procs_per_node>\d+)__s(?P<seed>\d+)$"
)


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
    match = _RUN_ID.match(run_dir.name)
    ident: dict = {"suite": run_dir.parent.name, "run_id": run_dir.name}
    ident.update(match.groupdict() if match else {})
    for source in (summary, config):  # later sources win: config.json is the resolved truth
        ident.update({k: source[k] for k in IDENTITY if source.get(k) is not None})
    if ident.get("world_size") is None and "nodes" in ident and "procs_per_node" in ident:
        ident["world_size"] = int(ident["nodes"]) * int(ident["procs_per_node"])
    return ident


def straggler_label(settings: dict) -> str:
    """The straggler condition of a run's settings, as one label: ``none``, ``fixed 2×320 ms``, ``gamma 50 ms``.

    Runs with different labels are different experiments (the report compares their throughput), so
    the label carries every setting that changes the injected delay.
    """
    kind = str(settings.get("straggler") or "none")
    delay = float(settings.get("straggler_delay_ms") or 0.0)
    if kind == "none":
        return "none"
    if kind == "fixed":
        return f"fixed {int(settings.get('straggler_ranks') or 1)}×{delay:g} ms"
    return f"{kind} {delay:g} ms" if delay else kind  # simulated runs: the model, not a delay


def load_runs(results: Path) -> pd.DataFrame:
    """Load one row per run directory: identity, summary and environment fields.

    Args:
        results: The results directory (the one holding ``runs/``).

    Returns:
        A frame with the columns ``IDENTITY + ["straggler"] + SUMMARY_FIELDS + ENV_FIELDS +
        ["run_dir"]``. ``status`` is ``running/incomplete`` where ``summary.json`` is missing;
        ``straggler`` is :func:`straggler_label` of the run's settings; ``clock`` is ``wall`` or
        ``simulated`` (from the summary, else the settings); ``hosts`` is a comma-separated string;
        absent numbers are NaN.
    """
    rows = []
    for run_dir in run_dirs(results):
        config = _read_json(run_dir / "config.json") or {}
        summary = _read_json(run_dir / "summary.json")
        env = _read_json(run_dir / "env.json") or {}
        row = _identity(run_dir, config, summary or {})
        settings = config.get("settings") or {}
        row["straggler"] = straggler_label(settings)
        row.update({k: (summary or {}).get(k) for k in SUMMARY_FIELDS})
        if summary is None:
            row["status"] = INCOMPLETE
        row["clock"] = row["clock"] or settings.get("clock") or "wall"
        row.update({k: env.get(k) for k in ENV_FIELDS})
        if isinstance(row["hosts"], list):
            row["hosts"] = ",".join(str(h) for h in row["hosts"])
        for field in ("slurm_job_id", "git_dirty"):  # strings: pandas would make 123 beside None 123.0
            if row[field] is not None:
                row[field] = str(row[field])
        row["run_dir"] = str(run_dir)
        rows.append(row)
    runs = pd.DataFrame(rows, columns=IDENTITY + ["straggler"] + SUMMARY_FIELDS + ENV_FIELDS + ["run_dir"])
    for column in _INTEGER:
        runs[column] = pd.to_numeric(runs[column], errors="coerce").astype("Int64")
    for column in _FLOAT:
        runs[column] = pd.to_numeric(runs[column], errors="coerce").astype(float)
    return runs


def load_curves(results: Path, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Load every ``metrics.csv`` row, prefixed with its run's identity and status.

    Args:
        results: The results directory (the one holding ``runs/``).
        runs: The output of :func:`load_runs`, if already loaded (saves reading it twice).

    Returns:
        A frame with ``IDENTITY + CONDITION + ["status"]`` then the metrics columns; the
        algorithms' own columns are kept (NaN for runs without them), and an empty ``comm_s`` reads
        as NaN.
    """
    runs = load_runs(results) if runs is None else runs
    frames = []
    for run in runs.itertuples(index=False):
        path = Path(run.run_dir) / "metrics.csv"
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


def write_tables(results: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write ``tables/runs.csv`` and ``tables/curves.csv`` and return both frames."""
    runs = load_runs(results)
    curves = load_curves(results, runs)
    out = Path(results) / "tables"
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    curves.to_csv(out / "curves.csv", index=False)
    return runs, curves


def parse_results(description: str, argv: list[str] | None = None) -> Path:
    """Parse the shared ``--results DIR`` command line of the analysis modules."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="results directory holding runs/ (default: results)")
    return parser.parse_args(argv).results


def main(argv: list[str] | None = None) -> None:
    """Command line: write the aggregate CSV tables."""
    results = parse_results("Aggregate run directories into runs.csv and curves.csv.", argv)
    runs, curves = write_tables(results)
    print(f"{len(runs)} runs, {len(curves)} evaluations -> {results / 'tables'}")


if __name__ == "__main__":
    main()
