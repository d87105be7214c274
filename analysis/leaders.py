"""Who reaches the target first: the report's opening figure, a group of bars per workload.

A workload is one suite, task, layout and condition (stragglers, clock, time model), as in the
report's summary. Its ``TOP`` fastest algorithms by median time to target are drawn as bars of that
time over the fastest one's, so 1 is the winner, with the median's 95 % interval as a line over the
bar's end: a bar whose line reaches the winner's is tied with it. Times are divided only within a
workload, so simulated and wall-clock times never meet; the winner's own time is written beside its
bar. A workload where no algorithm reached the target says so in its heading, so that every suite
has a line and the reader sees at once where the comparison is still open; where the papers' claims
use its runs for something else (steps per second, total time of a fixed number of epochs), it says
that instead, since such runs are not meant to reach the target.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.text
import matplotlib.transforms
import numpy as np
import pandas as pd

from analysis import plotting
from analysis.aggregate import CONDITION
from analysis.plotting import plt
from benchmarks import naming

WORKLOAD = ["suite", "task", "nodes", "procs_per_node", *CONDITION]
TOP = 3
ROW_IN = 0.27  # inches a bar or a heading takes
# What a claim's quantity (analysis/papers/claims.yaml) measures of its runs, in a few words
MEASURES = {"throughput_speedup": "steps per second", "speedup": "total time", "final_metric_above": "final metric"}


def claim_measures(claims: pd.DataFrame) -> dict[str, str]:
    """Per suite whose runs a claim compares (the claims table's ``suite``, :mod:`analysis.claims`),
    what they measure there: "steps per second for 4 claims"."""
    found: dict[str, dict[str, int]] = {}
    for _, row in claims.iterrows():
        for suite in str(row["suite"]).split(", ") if pd.notna(row["suite"]) and row["suite"] else []:
            counts = found.setdefault(suite, {})
            what = MEASURES.get(row["quantity"], str(row["quantity"]))
            counts[what] = counts.get(what, 0) + 1
    return {
        suite: " and ".join(f"{what} for {n} claim{'s' * (n > 1)}" for what, n in counts.items())
        for suite, counts in found.items()
    }


def leaders(table: pd.DataFrame, top: int = TOP) -> pd.DataFrame:
    """The ``top`` fastest algorithms of each workload, fastest first.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).
        top: How many algorithms a workload shows.

    Returns:
        Per workload (``WORKLOAD``, sorted), its algorithms that reached the target with
        ``tta_median_s``, ``relative`` (over the workload's fastest) and its interval ``low`` and
        ``high`` (the median's over the same fastest median), ``k/n``; or one row with no
        ``algorithm`` (NaN) and ``k/n`` the runs that converged over those that finished, where no
        algorithm reached the target.
    """
    rows = []
    for key, group in table[table["n"] > 0].groupby(WORKLOAD, sort=True, dropna=False):
        head = dict(zip(WORKLOAD, key))
        reached = group[group["k"] > 0].sort_values(["tta_median_s", "algorithm"]).head(top)
        if reached.empty:
            rows.append({**head, "algorithm": np.nan, "k/n": f"{int(group['k'].sum())}/{int(group['n'].sum())}"})
            continue
        best = reached["tta_median_s"].iloc[0]
        for _, row in reached.iterrows():
            rows.append(
                {
                    **head,
                    "algorithm": row["algorithm"],
                    "tta_median_s": row["tta_median_s"],
                    "relative": row["tta_median_s"] / best,
                    "low": row["tta_low_s"] / best,
                    "high": row["tta_high_s"] / best,
                    "k/n": row["k/n"],
                }
            )
    columns = [*WORKLOAD, "algorithm", "tta_median_s", "relative", "low", "high", "k/n"]
    return pd.DataFrame(rows, columns=columns)


def workload_label(key: dict) -> str:
    """A workload in a few words: suite, task and layout, and its stragglers where it has them (the
    winner's time says whether it is simulated)."""
    label = f"{key['suite']} · {key['task']} {key['nodes']}×{key['procs_per_node']}"
    return label + ("" if key["straggler"] == "none" else f" · stragglers {key['straggler']}")


def _fit(text: matplotlib.text.Text, fig: plt.Figure) -> None:
    """Shrink a heading's font until it ends inside the figure: a long suite name is read whole."""
    renderer = fig.canvas.get_renderer()
    while text.get_window_extent(renderer).x1 > fig.bbox.x1 - 2 and text.get_fontsize() > 5:
        text.set_fontsize(text.get_fontsize() - 0.5)


def plot_first_to_target(
    table: pd.DataFrame, out_dir: Path, colours: dict | None = None, measures: dict[str, str] | None = None
) -> list[Path]:
    """Draw the opening figure of the report; returns its PNG and SVG paths.

    Each workload has a heading row across the figure's width, then a bar per leading algorithm, or a
    row that says none reached the target, or, for a suite in ``measures`` (:func:`claim_measures`),
    what the claims measure of its runs instead.
    """
    measures = measures or {}
    stem = naming.figure_stem("first_to_target")
    shown = leaders(table)
    title = "Who reaches the target first"
    if shown.empty:
        return plotting.save(plotting.empty_figure("No finished runs yet.", title), out_dir, stem)
    colour = colours or plotting.colours(shown["algorithm"].dropna())
    workloads = list(shown.groupby(WORKLOAD, sort=True, dropna=False))
    fig, ax = plt.subplots(figsize=(5.4, 0.8 + ROW_IN * (len(workloads) + len(shown))))
    right = max(1.5, float(np.nanmax(shown["high"].to_numpy(dtype=float), initial=1.0)) * 1.2)
    across = matplotlib.transforms.blended_transform_factory(fig.transFigure, ax.transData)
    y, ticks, labels, headings = 0, [], [], []
    for key, rows in workloads:
        head = dict(zip(WORKLOAD, key))
        heading = ax.text(0.01, y, workload_label(head), transform=across, va="center", fontsize="small")
        heading.set(fontweight="bold", backgroundcolor="white", zorder=3)  # over the line at 1
        heading.set_in_layout(False)  # placed in the figure's width, not the axes': the layout need not fit it
        headings.append(heading)
        y += 1
        for _, row in rows.iterrows():
            if pd.isna(row["algorithm"]):
                none = f"none reached the target ({row['k/n']} runs)"
                if head["suite"] in measures:  # not meant to: the claims read something else of its runs
                    none = f"no target: {measures[head['suite']]}"
                ax.text(0.02 * right, y, none, va="center", color="#666666", backgroundcolor="white", zorder=3)
            else:
                _bar(ax, y, row, colour.get(row["algorithm"], "grey"), head["clock"] == "simulated")
                ticks.append(y)
                labels.append(row["algorithm"])
            y += 1
    ax.set_yticks(ticks, labels, fontsize="small")
    ax.set_ylim(y - 0.4, -0.6)
    ax.set_xlim(0, right)
    ax.axvline(1.0, color="#888888", linewidth=0.8, linestyle=":")
    ax.set_xlabel("median time to target ÷ the fastest's (line: 95 % interval)", fontsize="small")
    ax.tick_params(axis="x", labelsize="small")
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    for heading in headings:
        _fit(heading, fig)
    return plotting.save(fig, out_dir, stem)


def _bar(ax: plt.Axes, y: int, row: pd.Series, colour: object, simulated: bool) -> None:
    """One leader's bar, its interval, and beside it the winner's time or the others' ratio."""
    ax.barh(y, row["relative"], height=0.7, color=colour)
    ax.plot([row["low"], row["high"]], [y, y], color="black", linewidth=1)
    unit = " (simulated)" if simulated else ""
    note = f"{row['tta_median_s']:.3g} s{unit}" if row["relative"] == 1 else f"{row['relative']:.2f}×"
    ax.text(max(row["high"], row["relative"]) * 1.02, y, note, va="center", fontsize="small")
