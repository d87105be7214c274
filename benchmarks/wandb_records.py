"""A finished run's wandb record, written from its run directory's files.

A run's plain files (``config.json``, ``metrics.csv``, ``summary.json``) are what it measured; its
wandb run is made from them once the run has ended, never while it trains:

- nothing of wandb sits on the run's clock or start-up (its import and service start cost 1.2 s on a
  2-core machine, every rank waiting; writing a record from the files costs 0.1 s once wandb is up);
- a resumed run is one wandb run, with every row, not one per piece;
- a workflow writes all its records in one process, after its runs (the Snakefile's ``wandb`` rule,
  on the submitting host, which can reach wandb's server where compute nodes cannot).

``python -m benchmarks.run`` writes its own run's record when it ends (``--set wandb=true``, the
default; ``--defer-wandb`` leaves it to the workflow); ``python -m benchmarks.wandb_records RUN_DIR...``
writes or rewrites those of finished runs.
The mode is the run's ``wandb_mode`` (offline: ``RUN/wandb/offline-run-*``, uploaded later by
``wandb sync``), or ``WANDB_MODE`` from the environment.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from benchmarks import naming

logger = logging.getLogger("benchmarks.run")

# metrics.csv's common columns, and their names in wandb (an algorithm's own go under ``algo/``)
WANDB_KEYS = {
    "train_loss": "train/loss",
    "val_loss": "val/loss",
    "val_metric": "val/metric",
    "lr": "train/lr",
    "wall_s": "time/wall_s",
    "eval_s": "time/eval_s",
    "comm_s": "time/comm_s",
    "sent_mb": "comm/sent_mb",
    "samples": "train/samples",
    "epoch": "epoch",
}
# A record is made after the run, on the host that writes it: that host's package list (0.4 s a
# record to read), its system metrics and its machine's description are not the run's. The run's own
# software and machine are its env.json, which goes into the record's config as ``env``.
RECORD_SETTINGS = {"x_save_requirements": False, "x_disable_stats": True, "x_disable_meta": True, "disable_git": True}
DONE = "record.json"  # in RUN/wandb: the summary a record was made from (a rerun's record is remade)


def wandb_row(row: dict[str, str]) -> tuple[int, dict[str, float]]:
    """One metrics.csv row as wandb's step, and its other numbers under wandb's keys (empty cells and
    words, such as DASO's ``phase``, left out: wandb plots numbers)."""
    out = {}
    for column, text in row.items():
        if column == "step" or text in ("", None):
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        out[WANDB_KEYS.get(column, f"algo/{column}")] = int(value) if value.is_integer() else value
    return int(row["step"]), out


def write(runs: list[Path], mode: str | None = None) -> tuple[list[Path], dict[Path, str]]:
    """Write the wandb records of ``runs`` (run directories) from their files; return the runs whose
    record was written, and why each failed one failed (one run's trouble leaves the others').

    None is written for a run that has not ended (no summary, or ``timeout``: it resumes), whose
    settings turn wandb off, or whose record is already made from its current summary. An earlier
    record of the same directory (a run done again) is replaced: it is derived from files that changed.
    A record counts as written (``RUN/wandb/record.json``) only once wandb's service has shut down:
    ``finish`` may return before the service has written the run's file (seen 1 time in 25).
    """
    written, failed = [], {}
    try:
        for run_dir in map(Path, runs):
            try:
                if _record(run_dir, mode):
                    written.append(run_dir)
            except Exception as error:  # noqa: BLE001
                failed[run_dir] = f"{type(error).__name__}: {error}"
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None:
            wandb.teardown()
    for run_dir in written:
        (run_dir / "wandb" / DONE).write_text((run_dir / naming.SUMMARY).read_text())
    return written, failed


def _record(run_dir: Path, mode: str | None) -> bool:
    summary_path, config_path = run_dir / naming.SUMMARY, run_dir / naming.CONFIG
    if not summary_path.is_file() or not config_path.is_file():
        return False
    summary, cfg = json.loads(summary_path.read_text()), json.loads(config_path.read_text())
    env_path = run_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    settings = cfg["settings"]
    mode = mode or os.environ.get("WANDB_MODE") or settings["wandb_mode"]
    if summary.get("status") == "timeout" or not settings["wandb"] or mode == "disabled":
        return False
    folder = run_dir / "wandb"
    done = folder / DONE
    if done.is_file() and json.loads(done.read_text()) == summary:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # noqa: PLC0415 - 0.6 s: only where a record is written

    run = wandb.init(
        project=settings["wandb_project"],
        group=settings["suite"],
        job_type=cfg["algorithm"],
        name=cfg["run_id"],
        tags=[cfg["task"], f"nodes={cfg['nodes']}", f"procs_per_node={cfg['procs_per_node']}", summary["status"]],
        config={**cfg, "env": env},
        dir=str(run_dir),
        mode=mode,
        reinit="create_new",
        settings=wandb.Settings(**RECORD_SETTINGS),
    )
    try:
        metrics = run_dir / naming.METRICS
        if metrics.is_file():
            with metrics.open(newline="") as f:
                for row in csv.DictReader(f):
                    step, values = wandb_row(row)
                    run.log(values, step=step)
        run.summary.update(
            {k: v for k, v in summary.items() if k in (*naming.MEASUREMENTS, "status", "clock", "error")}
        )
    finally:
        run.finish(exit_code=int(summary["status"] == "failed"))
    return True


def write_safely(run_dir: Path) -> None:
    """The record of one run that has just ended; any failure logged: wandb trouble never changes a run."""
    try:
        _, failed = write([run_dir])
    except Exception as error:  # noqa: BLE001 - the service's teardown, too
        failed = {run_dir: f"{type(error).__name__}: {error}"}
    for why in failed.values():
        logger.warning("wandb record of %s not written: %s", run_dir, why)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.wandb_records", description="Write finished runs' wandb records from their files."
    )
    p.add_argument("runs", nargs="*", type=Path, help="run directories")
    p.add_argument("--runs-file", type=Path, help="a file with one run directory (or its summary.json) a line")
    p.add_argument("--mode", choices=("offline", "online"), help="instead of each run's wandb_mode")
    p.add_argument("--done", type=Path, help="a file to write when every record is written (for Snakemake)")
    args = p.parse_args(argv)
    runs = list(args.runs)
    if args.runs_file:
        runs += [Path(line) for line in args.runs_file.read_text().split()]
    runs = [r.parent if r.name == naming.SUMMARY else r for r in runs]
    written, failed = write(runs, args.mode)
    for run_dir, why in failed.items():
        print(f"warning: {run_dir}: {why}", file=sys.stderr)
    print(
        f"wandb records: {len(written)} written, {len(runs) - len(written) - len(failed)} up to date or not ended, "
        f"{len(failed)} failed"
    )
    if args.done:
        args.done.write_text(f"{len(written)} written, {len(failed)} failed\n")
    return 0  # a record that failed is said above; it never fails the workflow that made the runs


if __name__ == "__main__":
    sys.exit(main())
