"""Time-to-target table: median over seeds, min–max, k/n converged, speed-up against DDP.

Follows MLPerf Training's timing rules (Mattson et al., "MLPerf Training Benchmark", MLSys 2020,
arXiv:1910.01500; the rules are mlcommons/training_policies ``training_rules.adoc``, sections 11
"Run Results" and 12 "Benchmark Results", where a run that does not converge counts as infinitely
slow and is never left out): a run counts as converged when it completed and reached the target
(``time_to_target_s`` not null); runs that did not converge are never dropped, they count in ``n``
and in the failure columns. Times are medians over the converged seeds, and the speed-up is the
median DDP time over the median time of the algorithm on the same suite, task, node count,
processes per node and conditions (straggler injection and clock: a simulated time is never
divided by a wall-clock one). Unfinished runs (no ``summary.json``) are counted apart in
``incomplete`` and left out of ``n``.

``python -m analysis.tables --results DIR`` reads ``DIR/tables/runs.csv`` and ``curves.csv`` and
writes every table of the report into ``DIR/tables/`` (see :func:`write`); the Snakefile names each
file instead. The later steps read them back with :func:`read_table`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import artefacts, claims, cli, intervals, traces
from analysis.aggregate import BASELINE, CONDITION, INCOMPLETE, read_curves, read_runs
from analysis.leaders import GROUP

KEYS = GROUP + CONDITION + ["algorithm"]
FAILURES = ["failed", "diverged", "timeout"]
# What this step reads (the aggregates and the papers' files) and writes (every table of the registry)
FILES = artefacts.files(["runs", "curves", *artefacts.SOURCES, *(t.name for t in artefacts.TABLES)])
# The largest time between the evaluation that reached the target and the one before, over the time
# to target: how finely the evaluations resolve it (a share, not seconds)
STEP_AT_TARGET = "evaluation step at target (% of time to target)"
# Columns that hold text whatever they look like, in every table this module writes.
_TEXT = ["suite", "task", "algorithm", "straggler", "clock", "k/n", "metric"]


def converged(runs: pd.DataFrame) -> pd.Series:
    """Return the mask of runs that completed and reached the target."""
    return (runs["status"] == "completed") & runs["time_to_target_s"].notna()


def _joined(values: pd.Series) -> str:
    """Sorted distinct non-null values as one comma-separated string."""
    return ",".join(sorted({str(v) for v in values.dropna()}))


def time_to_target(runs: pd.DataFrame) -> pd.DataFrame:
    """Summarise the runs per suite, task, nodes, processes per node, conditions and algorithm.

    Args:
        runs: One row per run, as :func:`analysis.aggregate.load_runs` returns.

    Returns:
        One row per group with ``n`` (finished runs), ``k`` (converged), ``k/n``,
        ``tta_median_s``/``tta_min_s``/``tta_max_s`` over converged seeds (NaN if none) with
        ``tta_low_s``/``tta_high_s`` the median's 95 % bootstrap interval over them,
        ``mb_median`` (the megabytes a rank sent to reach the target) with ``mb_low``/``mb_high``,
        ``step_share_max`` (the largest, over converged seeds, of the time between the evaluation
        that reached the target and the one before it, as a share of the time to target),
        ``speedup_vs_ddp`` (NaN where DDP or the algorithm has no median) with its interval
        ``speedup_low``/``speedup_high`` (``analysis/intervals.py``), the medians of
        ``final_metric``, ``best_metric``, ``throughput``, ``comm_share``, ``wall_s`` (the
        whole run, for the papers' fixed-epoch comparisons) and ``step_s`` (seconds a training
        step, evaluation excluded: what the throughput claims read) over finished runs, the first,
        second and last with their 95 % intervals (``_low``/``_high``: what a suite without a
        target is shown by, :mod:`analysis.leaders`), the counts
        ``failed``, ``diverged``, ``timeout`` and ``incomplete``, ``metric`` and ``target``.
        ``straggler`` and ``clock`` (``simulated`` where the times come from the simulator) are
        part of the key.
    """
    rows, samples = [], {}
    for key, group in runs.groupby(KEYS, sort=True, dropna=False):
        finished = group[group["status"] != INCOMPLETE]
        tta = finished.loc[converged(finished), "time_to_target_s"]
        mb = finished.loc[converged(finished), "sent_mb_to_target"].dropna()  # none in runs older than the count
        # how finely each time to target is resolved: the step from the evaluation before the target's
        step = (finished.loc[converged(finished), "target_step_s"] / tta).dropna()
        n, k = len(finished), len(tta)
        row = dict(zip(KEYS, key))
        samples[key] = tta.tolist()
        low, high = intervals.median_interval(tta.tolist())
        mb_low, mb_high = intervals.median_interval(mb.tolist())
        # what the suites without a target measure (the claims' seconds a step, total time, final metric)
        measured = {c: finished[c].dropna().tolist() for c in ("step_s", "wall_s", "final_metric")}
        step_low, step_high = intervals.median_interval(measured["step_s"])
        wall_low, wall_high = intervals.median_interval(measured["wall_s"])
        final_low, final_high = intervals.median_interval(measured["final_metric"])
        row.update(
            {
                "n": n,
                "k": k,
                "k/n": f"{k}/{n}",
                "tta_median_s": tta.median() if k else math.nan,
                "tta_low_s": low,
                "tta_high_s": high,
                "tta_min_s": tta.min() if k else math.nan,
                "tta_max_s": tta.max() if k else math.nan,
                "mb_median": mb.median() if len(mb) else math.nan,
                "mb_low": mb_low,
                "mb_high": mb_high,
                "step_share_max": step.max() if len(step) else math.nan,
                "final_metric_median": finished["final_metric"].median(),
                "final_metric_low": final_low,
                "final_metric_high": final_high,
                "best_metric_median": finished["best_metric"].median(),
                "throughput_median": finished["throughput"].median(),
                "comm_share_median": finished["comm_share"].median(),
                "wall_median_s": finished["wall_s"].median(),
                "wall_low_s": wall_low,
                "wall_high_s": wall_high,
                "step_median_s": finished["step_s"].median(),
                "step_low_s": step_low,
                "step_high_s": step_high,
            }
        )
        row.update({status: int((finished["status"] == status).sum()) for status in FAILURES})
        row["incomplete"] = len(group) - n
        row["metric"] = _joined(group["metric"])
        targets = group["target"].dropna()
        row["target"] = targets.iloc[0] if len(targets) else math.nan
        rows.append(row)
    columns = KEYS + [
        "n",
        "k",
        "k/n",
        "tta_median_s",
        "tta_low_s",
        "tta_high_s",
        "tta_min_s",
        "tta_max_s",
        "mb_median",
        "mb_low",
        "mb_high",
        "step_share_max",
        "speedup_vs_ddp",
        "speedup_low",
        "speedup_high",
        "final_metric_median",
        "final_metric_low",
        "final_metric_high",
        "best_metric_median",
        "throughput_median",
        "comm_share_median",
        "wall_median_s",
        "wall_low_s",
        "wall_high_s",
        "step_median_s",
        "step_low_s",
        "step_high_s",
        *FAILURES,
        "incomplete",
        "metric",
        "target",
    ]
    speedups = ("speedup_vs_ddp", "speedup_low", "speedup_high")
    table = pd.DataFrame(rows, columns=[c for c in columns if c not in speedups])
    base = table.loc[table["algorithm"] == BASELINE, GROUP + CONDITION + ["tta_median_s"]]
    table = table.merge(base.rename(columns={"tta_median_s": "_ddp"}), on=GROUP + CONDITION, how="left")
    # NaN propagates: no DDP median or no algorithm median gives no speed-up.
    table["speedup_vs_ddp"] = table["_ddp"] / table["tta_median_s"]
    bounds = []  # the 95 % interval of DDP's median over the algorithm's, each resampled over its seeds
    for row in table.itertuples(index=False):
        key = tuple(getattr(row, k) for k in KEYS)
        ddp = samples.get((*key[:-1], BASELINE), [])
        same = row.algorithm == BASELINE and ddp  # DDP against itself: 1 by definition
        bounds.append((1.0, 1.0) if same else intervals.ratio_interval(ddp, samples[key]))
    table["speedup_low"], table["speedup_high"] = zip(*bounds) if bounds else ((), ())
    return table[columns]


def drawn(curves: pd.DataFrame) -> pd.DataFrame:
    """What each algorithm's curves let the figures draw, per ``KEYS``: ``evaluations``, the most
    evaluations a finished run of it made (a metric curve needs two: a suite of one-epoch runs,
    evaluated once, has points and no curve), and ``traced``, how many columns of its own
    :mod:`analysis.traces` draws in its group's figure. The report shows a sentence instead of a
    figure that would be empty by design."""
    finished = curves[curves["status"] != INCOMPLETE]
    if finished.empty:
        return pd.DataFrame(columns=[*KEYS, "evaluations", "traced"])
    per_run = finished.groupby([*KEYS, "run_id"], sort=True, dropna=False).size()
    out = per_run.groupby(level=KEYS, dropna=False).max().rename("evaluations").reset_index()
    traced: dict[tuple, int] = {}
    for key, rows in finished.groupby(GROUP, sort=True):
        for algorithm, _ in traces.trace_columns(rows):
            traced[(*key, algorithm)] = traced.get((*key, algorithm), 0) + 1
    out["traced"] = [traced.get((*row[GROUP], row["algorithm"]), 0) for _, row in out.iterrows()]
    return out


def _num(value: float, spec: str) -> str:
    """Format a number with ``spec``, or an em dash where it is missing."""
    return "—" if value is None or pd.isna(value) else format(value, spec)


def median_text(value: float, low: float, high: float, seeds: int, spec: str, unit: str = "") -> str:
    """A median over ``seeds`` with its unit and 95 % interval, ``5.3 s [4.8, 5.8]``; where the
    interval is one point, the seeds say why instead (one seed, or every seed the same), never a
    "[2.00, 2.00]" that claims a certainty one seed cannot give."""
    if pd.isna(value):
        return "—"
    number = f"{value:{spec}}" + (f" {unit}" if unit else "")
    if low < high:
        return f"{number} [{low:{spec}}, {high:{spec}}]"
    return f"{number} (" + ("1 seed)" if seeds == 1 else f"{seeds} seeds, all equal)")


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """Format a :func:`time_to_target` table for people: strings, seconds to 1 decimal, ``×``."""
    out = pd.DataFrame(
        {
            "suite": table["suite"].astype(str),
            "task": table["task"].astype(str),
            "nodes×procs": [f"{n}×{g}" for n, g in zip(table["nodes"], table["procs_per_node"])],
            "algorithm": table["algorithm"].astype(str),
            "stragglers": table["straggler"].astype(str),
            "converged (k/n)": table["k/n"],
            "median time to target (s)": [
                median_text(v, lo, hi, k, ".2f")
                for v, lo, hi, k in zip(table["tta_median_s"], table["tta_low_s"], table["tta_high_s"], table["k"])
            ],
            "min–max (s)": [
                "—" if pd.isna(lo) else f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(table["tta_min_s"], table["tta_max_s"])
            ],
            STEP_AT_TARGET: [_num(v, ".0%") for v in table["step_share_max"]],
            "MB sent a rank to target": [
                median_text(v, lo, hi, k, ".3g")
                for v, lo, hi, k in zip(table["mb_median"], table["mb_low"], table["mb_high"], table["k"])
            ],
            "speed-up vs DDP": [  # a ratio of two medians: no interval where both are one point
                _num(v, ".2f") + ("" if pd.isna(v) else "×" + (f" [{lo:.2f}, {hi:.2f}]" if lo < hi else ""))
                for v, lo, hi in zip(table["speedup_vs_ddp"], table["speedup_low"], table["speedup_high"])
            ],
            "final metric": [_num(v, ".4g") for v in table["final_metric_median"]],
            "best metric": [_num(v, ".4g") for v in table["best_metric_median"]],
            "throughput (samples/s)": [_num(v, ",.0f") for v in table["throughput_median"]],
            "comm share": [_num(v, ".1%") for v in table["comm_share_median"]],
            "failed/diverged/timeout": [
                f"{f}/{d}/{t}" for f, d, t in zip(table["failed"], table["diverged"], table["timeout"])
            ],
            "incomplete": table["incomplete"].astype(str),
            "clock": [
                f"simulated ({m})" if c == "simulated" else str(c) for c, m in zip(table["clock"], table["time_model"])
            ],
        }
    )
    return out


def to_markdown(frame: pd.DataFrame) -> str:
    """Render a frame of strings as a GitHub markdown table (no ``tabulate`` needed)."""

    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(c) for c in frame.columns) + " |",
        "|" + "|".join("---" for _ in frame.columns) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def global_syncs(curves: pd.DataFrame) -> pd.DataFrame:
    """Global synchronisations of the hierarchical algorithms (DASO) against DDP's one per step.

    Per suite, task, layout and algorithm with a ``global_syncs`` column: the median over seeds of
    the run's total global syncs and of its optimizer steps (DDP all-reduces across all nodes once
    per step), the share of syncs saved, and the median bytes put on the inter-node links. An
    epoch's count is the one its last row (at the whole epoch) holds: the rows of the next epoch's
    evaluations repeat it. No rows, with these columns, where no run has the column (the report
    reads the file back by name).
    """
    if "global_syncs" not in curves.columns or curves["global_syncs"].isna().all():
        return pd.DataFrame(columns=[*GROUP, "algorithm", "syncs", "steps", "sync_bytes", "saved vs DDP"])
    rows = curves.dropna(subset=["global_syncs"])
    steps = rows.groupby(GROUP + ["algorithm", "run_id"], sort=True)["step"].max()
    ends = rows[np.isclose(rows["epoch"], rows["epoch"].round()) & (rows["epoch"] > 0)]
    ends = ends.drop_duplicates(subset=[*GROUP, "algorithm", "run_id", "epoch"], keep="last")
    per_run = ends.groupby(GROUP + ["algorithm", "run_id"], sort=True).agg(
        syncs=("global_syncs", "sum"), sync_bytes=("global_sync_bytes", "sum")
    )
    per_run["steps"] = steps
    per_run = per_run[["syncs", "steps", "sync_bytes"]]
    out = per_run.groupby(GROUP + ["algorithm"], sort=True).median().reset_index()
    out["saved vs DDP"] = 1.0 - out["syncs"] / out["steps"]
    return out


def read_table(path: Path) -> pd.DataFrame:
    """Read back a table this module wrote: names stay text, layouts stay integers, an empty cell is NaN."""
    dtype = {**{c: str for c in _TEXT}, "nodes": "Int64", "procs_per_node": "Int64"}
    return pd.read_csv(path, dtype=dtype, keep_default_na=False, na_values=[""])


def time_to_target_table(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """The time-to-target table as the later steps read it: :func:`time_to_target` with what the
    figures can draw of each row (:func:`drawn`; 0 where nothing)."""
    table = time_to_target(runs).merge(drawn(curves), on=KEYS, how="left")
    table[["evaluations", "traced"]] = table[["evaluations", "traced"]].fillna(0).astype(int)
    return table


def markdown(table: pd.DataFrame) -> str:
    """The time-to-target table for people, as a markdown page."""
    heading = "# Time to target\n\nMedian over converged seeds; speed-up against DDP.\n\n"
    return heading + to_markdown(display_table(table))


def claims_table(runs: pd.DataFrame, claims_yaml: Path) -> pd.DataFrame:
    """Each claim of ``claims_yaml`` with its verdict over ``runs`` (:mod:`analysis.claims`)."""
    return claims.table(runs, claims.load(claims_yaml))


def write(files: dict) -> pd.DataFrame:
    """Make every table of :data:`analysis.artefacts.TABLES`, in its order, into its file of ``files``
    (CSV of raw numbers; the ``.md`` one formatted), and return the time-to-target table.

    Each table's function is called with the tables it reads as made here, in memory, so that
    every table the report shows is computed once, here, and the report computes none.
    """
    made: dict[str, object] = {"runs": read_runs(files["runs"]), "curves": read_curves(files["curves"])}
    made |= {name: Path(files[name]) for name in artefacts.SOURCES}
    for entry in artefacts.TABLES:
        made[entry.name] = artefacts.load(entry.make)(*(made[name] for name in entry.reads))
        path = Path(files[entry.name])
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".md":
            path.write_text(made[entry.name], encoding="utf-8")
        else:
            made[entry.name].to_csv(path, index=False)
    return made["time_to_target"]


def main(argv: list[str] | None = None) -> None:
    """Command line: write the tables and print the time-to-target table."""
    table = write(cli.parse("Write the report's tables (csv, and markdown for time to target).", FILES, argv))
    print(to_markdown(display_table(table)), end="")


if __name__ == "__main__":
    main()
