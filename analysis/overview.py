"""What the report states, calculated from the earlier steps' tables: the summary (the leader of each
workload by its suite's measure), a suite's table ordered by that measure, the runs that did not
converge or failed, the run metadata, the validation's and the calibration's errors, and how long the
workflow took.

:mod:`analysis.report` renders these; this module formats numbers as text where a table of the report
holds text (a median with its interval), but writes no HTML. It reads the tables the tables step wrote
(:mod:`analysis.tables`) and computes nothing those hold already.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import aggregate, leaders, tables
from analysis.aggregate import CONDITION

# the run metadata table: environment, then clock, and for simulated runs their time models with the batch time's source
METADATA_FIELDS = [*aggregate.ENV_FIELDS, "clock", "time_model", "time_source"]


def _layout(nodes: object, procs: object) -> str:
    return f"{nodes}×{procs}"


# Columns that describe the rows rather than measure them: where one value holds for every row of a
# suite's table, it is said once above the table instead of repeated in a column.
DESCRIPTIVE = ["task", "nodes×procs", "stragglers", "clock", "failed/diverged/timeout", "incomplete"]


def narrowed(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``frame`` less its descriptive columns with one value in every row and its columns empty in
    every row (an em dash), and a line that says what they held: a suite's table fits a window."""
    same = {c: frame[c].iloc[0] for c in DESCRIPTIVE if c in frame and len(frame) > 1 and frame[c].nunique() == 1}
    empty = [c for c in frame.columns if c not in same and len(frame) > 0 and (frame[c] == "—").all()]
    parts = [f"Every row: {', '.join(f'{c} {v}' for c, v in same.items())}."] if same else []
    parts += [f"Nothing to show in any row: {', '.join(empty)}."] if empty else []
    return frame.drop(columns=[*same, *empty]), " ".join(parts)


# How the report states a measure's median: its format, its unit in the summary, its column in a suite's table
SAID = {
    leaders.TIME_TO_TARGET: (".1f", "s", "median time to target (s)"),
    "seconds a step": (".3g", "s a step", "seconds a step"),
    "total time": (".1f", "s in all", "total time (s)"),
    "final metric": (".3f", "", "final metric"),
}


def summary_table(table: pd.DataFrame, measures: dict[str, str] | None = None) -> pd.DataFrame:
    """Per suite, task, node count and condition, by what the suite measures (``measures``,
    :func:`analysis.leaders.suite_measures`: what the claims read of a suite without a target, else
    the time to target): the leader, the algorithms tied with it (their 95 % intervals of the median
    overlap its), its median with the interval, and for the time to target its k/n converged and its
    speed-up over DDP."""
    rows = []
    keys = tables.GROUP + CONDITION
    for values, group in table.groupby(keys, sort=True):
        key = dict(zip(keys, values))
        measure = (measures or {}).get(key["suite"], leaders.TIME_TO_TARGET)
        ranked = leaders.leaders(group, measures, top=None)
        simulated = f" (simulated: {key['time_model']})" if key["clock"] == "simulated" else ""
        row = {
            "suite": key["suite"],
            "task": key["task"],
            "nodes×procs": _layout(key["nodes"], key["procs_per_node"]),
            "stragglers": key["straggler"],
            "measure": measure,
            "leader": "",
            "tied with it": "",
            "median": "—",
            "converged (k/n)": "—",
            "speed-up vs DDP": "—",
        }
        if ranked.empty or ranked["algorithm"].isna().all():
            row["median"] = "none reached the target" if measure == leaders.TIME_TO_TARGET else f"no {measure} yet"
            rows.append(row)
            continue
        best = group.set_index("algorithm").loc[ranked["algorithm"].iloc[0]]
        m = leaders.MEASURES[measure]
        spec, unit, _ = SAID[measure]
        seeds = best["k"] if measure == leaders.TIME_TO_TARGET else best["n"]
        row.update(
            {
                "leader": ranked["algorithm"].iloc[0],
                "tied with it": ", ".join(ranked.loc[ranked["place"] == "tied", "algorithm"]),
                "median": tables.median_text(best[m.median], best[m.low], best[m.high], seeds, spec, unit) + simulated,
            }
        )
        if measure == leaders.TIME_TO_TARGET:
            speedup, low, high = best["speedup_vs_ddp"], best["speedup_low"], best["speedup_high"]
            row["converged (k/n)"] = best["k/n"]
            row["speed-up vs DDP"] = (
                "— (no DDP time)"
                if pd.isna(speedup)
                else f"{speedup:.2f}×" + (f" [{low:.2f}, {high:.2f}]" if low < high else "") + simulated
            )
        rows.append(row)
    return pd.DataFrame(rows)


def problem_runs(runs: pd.DataFrame, measures: dict[str, str] | None = None) -> pd.DataFrame:
    """Runs that failed, are unfinished, or completed without reaching the target in a suite measured
    by its time to target: run_id, status, error. A suite measured otherwise (``measures``,
    :func:`analysis.leaders.suite_measures`) is not meant to reach the target: its completed runs
    did what it asks and are not listed."""
    designed = runs["suite"].isin(list(measures or {})) & (runs["status"] == "completed")
    bad = runs[~tables.converged(runs) & ~designed].sort_values(["suite", "run_id"])
    status = ["completed (target not reached)" if s == "completed" else str(s) for s in bad["status"]]
    return pd.DataFrame(
        {
            "suite": bad["suite"].astype(str),
            "run_id": bad["run_id"].astype(str),
            "status": status,
            "error": bad["error"].fillna("").astype(str),
        }
    )


def by_design(runs: pd.DataFrame, measures: dict[str, str]) -> str:
    """A line on the completed runs :func:`problem_runs` leaves out, per suite with what it measures;
    "" where there are none."""
    designed = runs[runs["suite"].isin(list(measures)) & (runs["status"] == "completed") & ~tables.converged(runs)]
    if designed.empty:
        return ""
    counts = designed.groupby("suite").size()
    each = "; ".join(f"{suite}: {n}, measured by its {measures[suite]}" for suite, n in counts.items())
    return (
        f"Not listed: {len(designed)} completed run{'s' * (len(designed) != 1)} of suites without a target, "
        f"which their claims read for something else ({each})."
    )


def problem_counts(problems: pd.DataFrame) -> str:
    """The runs of :func:`problem_runs` in a line, by status, most first: the fold's label, so that a
    long list is read at a glance and opened only to find one run."""
    counts = problems["status"].value_counts()
    by_status = ", ".join(f"{count} {status}" for status, count in counts.items())
    return f"{len(problems)} run{'s' if len(problems) != 1 else ''}: {by_status}"


def metadata_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Each environment field with its distinct values over all runs (fields no run has are left out)."""
    rows = []
    for field in METADATA_FIELDS:
        values = runs[field].dropna().astype(str)
        if field == "hosts":  # union of the hosts, not of the host lists
            values = pd.Series([h for v in values for h in v.split(",") if h])
        distinct = sorted(set(values))
        if distinct:
            rows.append({"field": field, "values": ", ".join(distinct)})
    return pd.DataFrame(rows, columns=["field", "values"])


def hardware_here(runs: pd.DataFrame) -> str:
    """The suite's hardware in one line: devices, host count and backends over the runs."""

    def distinct(column: str) -> str:
        return "/".join(sorted(set(runs[column].dropna().astype(str)))) or "unknown"

    hosts = {h for v in runs["hosts"].dropna().astype(str) for h in v.split(",") if h}
    if runs["world_size"].dropna().empty:
        return "no runs yet"
    return (
        f"{distinct('device')} on {len(hosts)} host{'s' if len(hosts) != 1 else ''}, "
        f"{distinct('backend')} backend, largest job {int(runs['world_size'].max())} processes"
    )


# The time-to-target table's columns that say nothing of a suite without a target where no run reached it
TARGET_COLUMNS = [
    "converged (k/n)",
    "median time to target (s)",
    "min–max (s)",
    tables.STEP_AT_TARGET,
    "MB sent a rank to target",
    "speed-up vs DDP",
]


def suite_table(table: pd.DataFrame, measure: str) -> tuple[pd.DataFrame, str]:
    """A suite's rows of the time-to-target table for people, best first by the suite's measure within
    each task, layout and condition, and a line on what was left out. A suite measured otherwise
    (:func:`analysis.leaders.suite_measures`) gets its measure's median and interval beside the
    algorithm, and loses the time-to-target columns where no run reached the target; the best metric
    goes where it equals the final one in every row (a metric that only rises)."""
    m = leaders.MEASURES[measure]
    keys = ["task", "nodes", "procs_per_node", *CONDITION]
    ordered = table.sort_values(
        [*keys, m.median, "algorithm"], ascending=[True] * len(keys) + [not m.higher, True], na_position="last"
    )
    shown = tables.display_table(ordered).drop(columns=["suite"])
    notes = []
    if len(shown) and (shown["best metric"] == shown["final metric"]).all():
        shown = shown.drop(columns=["best metric"])
        notes.append("The best metric equals the final one in every row.")
    if measure != leaders.TIME_TO_TARGET:
        spec, _, column = SAID[measure]
        values = [
            tables.median_text(*v, spec) for v in zip(ordered[m.median], ordered[m.low], ordered[m.high], ordered["n"])
        ]
        shown = shown.drop(columns=[column], errors="ignore")  # the final metric, now with its interval
        shown.insert(shown.columns.get_loc("algorithm") + 1, column, values)
        if not (table["k"] > 0).any():
            shown = shown.drop(columns=TARGET_COLUMNS)
            notes.append("No run reached a target: the time-to-target columns are left out.")
    return shown, " ".join(notes)


def validation_errors(rows: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """{network: (geomean |relative error| of its test rows, their count)}; fit rows are never scored."""
    tested = rows[rows["role"] == "test"].dropna(subset=["relative_error"])
    return {
        str(net): (float(np.exp(np.log(np.maximum(g["relative_error"].abs(), 1e-12)).mean())), len(g))
        for net, g in tested.groupby("network")
    }


def calibration_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm, from ``tools/calibrate.py``'s rows (one per seed): the median measured and
    predicted times to target over the seeds where both reached it, and the prediction's error
    (predicted / measured - 1)."""
    both = rows.dropna(subset=["measured_s", "predicted_s"])
    out = both.groupby("algorithm", sort=False)[["measured_s", "predicted_s"]].median()
    out["error"] = out["predicted_s"] / out["measured_s"] - 1.0
    out["seeds"] = both.groupby("algorithm", sort=False).size()
    return out.reindex(rows["algorithm"].unique()).reset_index()


def workflow_minutes(path: Path, now: float | None = None) -> float | None:
    """Minutes the workflow's last invocation took: from its start (``started.txt``, seconds since the
    epoch) to its end (``finished.txt`` beside it, written when it ended), or to ``now`` while it
    runs (the workflow renders the report before it ends); None where no workflow wrote the file."""

    def seconds(file: Path) -> float | None:
        try:
            return float(file.read_text().strip())
        except (OSError, ValueError):
            return None

    path = Path(path)
    started, finished = seconds(path), seconds(path.with_name("finished.txt"))
    if started is None:
        return None
    if finished is not None and finished >= started:  # the invocation has ended: a rebuild by hand
        return (finished - started) / 60.0
    return ((time.time() if now is None else now) - started) / 60.0
