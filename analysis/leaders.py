"""Who leads each workload, by what its suite measures: the report's opening figure.

A workload is one suite, task, layout and condition (stragglers, clock, time model), as in the
report's summary. Most suites measure the time to target. A suite whose runs the papers' claims read
for something else (:mod:`analysis.claims`: seconds a training step, the total time of a fixed
number of epochs, the final metric) is not meant to reach a target, and is shown by that measure
instead (:func:`suite_measures`): WAGMA's suite by its seconds a step, so that the bars read as
WAGMA's speed-ups, DANA's by the final accuracy.

The figure has one panel per measure. A time is drawn over the workload's fastest, so the leader's
bar is 1 and every other bar's number is the leader's speed-up over it; a final metric is drawn as it
is. The line over a bar is the 95 % interval of its median. Colours say the bar's place, the same in
every panel and explained in the legend: the leader, an algorithm tied with it (the intervals
overlap: the seeds cannot tell them apart), the others; none of them red, which reads as a failure.
A time-to-target workload shows its ``TOP`` fastest of up to 21 algorithms; a measured one every
algorithm up to ``TOP_MEASURED`` (the claims' pairs: WAGMA and its five baselines). Times are
divided only within a workload, so simulated and wall-clock times never meet; the leader's own value
is written beside its bar. A workload with nothing to draw says why in its row, so that every suite
has a line.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import matplotlib.patches
import matplotlib.text
import matplotlib.transforms
import numpy as np
import pandas as pd

from analysis import artefacts, intervals, plotting
from analysis.aggregate import CONDITION
from analysis.plotting import plt

GROUP = ["suite", "task", "nodes", "procs_per_node"]  # a layout of a suite's task: one figure of curves
WORKLOAD = [*GROUP, *CONDITION]
TOP = 3
TOP_MEASURED = 6
ROW_IN = 0.22  # inches a bar or a heading takes
PANEL_IN = 0.75  # inches a panel's axis and label take
TIME_TO_TARGET = "time to target"
# What a claim's quantity (analysis/papers/claims.yaml) reads of its runs
QUANTITIES = {"throughput_speedup": "seconds a step", "speedup": "total time", "final_metric_above": "final metric"}
# The bars' colours by place (never red): the leader, tied with it, the others
LEADER, TIED, OTHER = "#1f5f9e", "#86b3dc", "#c4c4c4"


class Measure(NamedTuple):
    """The columns of the time-to-target table (:func:`analysis.tables.time_to_target`) that hold a
    measure's median and its interval, whether more is better, and the axis that draws it."""

    median: str
    low: str
    high: str
    higher: bool
    axis: str


MEASURES = {
    TIME_TO_TARGET: Measure("tta_median_s", "tta_low_s", "tta_high_s", False, "median time to target ÷ the fastest's"),
    "seconds a step": Measure(
        "step_median_s", "step_low_s", "step_high_s", False, "median seconds a step ÷ the fastest's (its speed-up)"
    ),
    "total time": Measure("wall_median_s", "wall_low_s", "wall_high_s", False, "median total time ÷ the fastest's"),
    "final metric": Measure(
        "final_metric_median", "final_metric_low", "final_metric_high", True, "median final validation metric"
    ),
}


def suite_measures(claims: pd.DataFrame) -> dict[str, str]:
    """Per suite whose runs a claim compares (the claims table's ``suite``), what the claims read of
    them (a key of ``MEASURES``): the one most of its claims read, the first read on a tie. A suite
    no claim reads is measured by its time to target."""
    counts: dict[str, dict[str, int]] = {}
    for _, row in claims.iterrows():
        for suite in str(row["suite"]).split(", ") if pd.notna(row["suite"]) and row["suite"] else []:
            what = QUANTITIES.get(row["quantity"])
            if what is not None:
                read = counts.setdefault(suite, {})
                read[what] = read.get(what, 0) + 1
    return {suite: max(read, key=read.get) for suite, read in counts.items()}


def leaders(table: pd.DataFrame, measures: dict[str, str] | None = None, top: int | None = TOP) -> pd.DataFrame:
    """Each workload's algorithms ranked by its suite's measure, best first.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).
        measures: The suites measured by something other than the time to target
            (:func:`suite_measures`).
        top: How many algorithms a time-to-target workload shows (None: all); a measured one shows
            up to ``TOP_MEASURED``.

    Returns:
        Per workload (``WORKLOAD``, sorted): ``measure``, then its algorithms with a value, each with
        ``value`` (the median), ``relative`` with ``low`` and ``high`` (a time over the workload's
        best median, so that the leader is 1; a metric as it is), ``place`` (``leader``, ``tied``:
        its interval overlaps the leader's, or ``other``) and ``k/n``; or one row with no
        ``algorithm`` (NaN) and ``k/n`` the runs that converged over those that finished, where no
        algorithm has a value.
    """
    measures = measures or {}
    rows = []
    for key, group in table[table["n"] > 0].groupby(WORKLOAD, sort=True, dropna=False):
        head = dict(zip(WORKLOAD, key))
        measure = measures.get(head["suite"], TIME_TO_TARGET)
        m = MEASURES[measure]
        ranked = group.dropna(subset=[m.median]).sort_values([m.median, "algorithm"], ascending=[not m.higher, True])
        if ranked.empty:
            rows.append({**head, "measure": measure, "k/n": f"{int(group['k'].sum())}/{int(group['n'].sum())}"})
            continue
        best = ranked.iloc[0]
        scale = 1.0 if m.higher else best[m.median]  # a time over the fastest's; a metric as it is
        shown = ranked.head(top if measure == TIME_TO_TARGET else TOP_MEASURED) if top else ranked
        for i, (_, row) in enumerate(shown.iterrows()):
            tied = intervals.overlap(row[m.low], row[m.high], best[m.low], best[m.high])
            rows.append(
                {
                    **head,
                    "measure": measure,
                    "algorithm": row["algorithm"],
                    "value": row[m.median],
                    "relative": row[m.median] / scale,
                    "low": row[m.low] / scale,
                    "high": row[m.high] / scale,
                    "place": "leader" if i == 0 else "tied" if tied else "other",
                    "k/n": row["k/n"],
                }
            )
    columns = [*WORKLOAD, "measure", "algorithm", "value", "relative", "low", "high", "place", "k/n"]
    return pd.DataFrame(rows, columns=columns)


def workload_label(key: dict) -> str:
    """A workload in a few words: suite, task and layout, and its stragglers where it has them (the
    leader's value says whether it is simulated)."""
    label = f"{key['suite']} · {key['task']} {key['nodes']}×{key['procs_per_node']}"
    return label + ("" if key["straggler"] == "none" else f" · stragglers {key['straggler']}")


def _fit(text: matplotlib.text.Text, fig: plt.Figure) -> None:
    """Shrink a heading's font until it ends inside the figure: a long suite name is read whole."""
    renderer = fig.canvas.get_renderer()
    while text.get_window_extent(renderer).x1 > fig.bbox.x1 - 2 and text.get_fontsize() > 5:
        text.set_fontsize(text.get_fontsize() - 0.5)


def plot_first_to_target(table: pd.DataFrame, out_dir: Path, measures: dict[str, str] | None = None) -> list[Path]:
    """Draw the opening figure of the report; returns its PNG and SVG paths.

    One panel per measure the workloads have (time to target first, then in ``MEASURES``' order);
    in it each workload has a heading row across the figure's width, then a bar per leading
    algorithm, or a row that says why there is none.
    """
    stem = artefacts.figure_stem("first_to_target")
    shown = leaders(table, measures)
    title = "Who leads each workload, by what its suite measures"
    if shown.empty:
        return plotting.save(plotting.empty_figure("No finished runs yet.", title), out_dir, stem)
    panels = [(name, shown[shown["measure"] == name]) for name in MEASURES if (shown["measure"] == name).any()]
    sizes = [rows.groupby(WORKLOAD, dropna=False).ngroups + len(rows) for _, rows in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(5.4, 0.55 + sum(ROW_IN * n + PANEL_IN for n in sizes)),
        gridspec_kw={"height_ratios": [ROW_IN * n + PANEL_IN for n in sizes]},
        squeeze=False,
    )
    headings = []
    for ax, (name, rows) in zip(axes[:, 0], panels):
        headings += _panel(ax, fig, MEASURES[name], rows)
    places = {"the leader": LEADER, "tied with it (95 % intervals overlap)": TIED, "the others": OTHER}
    handles = [matplotlib.patches.Patch(color=c, label=label) for label, c in places.items()]
    fig.legend(
        handles=handles, loc="upper center", ncol=3, fontsize="x-small", frameon=False, bbox_to_anchor=(0.5, 0.97)
    )
    fig.suptitle(title, fontsize="medium", y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.42 / fig.get_figheight()))  # the title and legend above
    for heading in headings:
        _fit(heading, fig)
    return plotting.save(fig, out_dir, stem)


def plot(time_to_target: pd.DataFrame, claims: pd.DataFrame, out_dir: Path, colours: dict) -> list[Path]:
    """The registry's figure: :func:`plot_first_to_target`, each suite by what the claims measure it by
    (:func:`suite_measures`); bars are coloured by place, not by algorithm."""
    return plot_first_to_target(time_to_target, out_dir, suite_measures(claims))


def _panel(ax: plt.Axes, fig: plt.Figure, measure: Measure, rows: pd.DataFrame) -> list[matplotlib.text.Text]:
    """One measure's workloads in ``ax``; returns their headings (fitted to the figure once laid out)."""
    # room for the note beside the longest bar: a metric on its own scale, a time at least to 1.5× the fastest
    longest = float(np.nanmax(rows["high"].to_numpy(dtype=float), initial=0.0))
    right = max(0.1, longest * 1.25) if measure.higher else max(1.5, longest * 1.2)
    across = matplotlib.transforms.blended_transform_factory(fig.transFigure, ax.transData)
    y, ticks, labels, headings = 0, [], [], []
    for key, workload in rows.groupby(WORKLOAD, sort=True, dropna=False):
        head = dict(zip(WORKLOAD, key))
        heading = ax.text(0.01, y, workload_label(head), transform=across, va="center", fontsize="small")
        heading.set(fontweight="bold", backgroundcolor="white", zorder=3)  # over the line at 1
        heading.set_in_layout(False)  # placed in the figure's width, not the axes': the layout need not fit it
        headings.append(heading)
        y += 1
        for _, row in workload.iterrows():
            if pd.isna(row["algorithm"]):
                none = (
                    f"none reached the target ({row['k/n']} runs)"
                    if row["measure"] == TIME_TO_TARGET
                    else f"no run has its {row['measure']} yet"
                )
                ax.text(0.02 * right, y, none, va="center", color="#666666", backgroundcolor="white", zorder=3)
            else:
                _bar(ax, y, row, measure, head["clock"] == "simulated")
                ticks.append(y)
                labels.append(row["algorithm"])
            y += 1
    ax.set_yticks(ticks, labels, fontsize="small")
    ax.set_ylim(y - 0.4, -0.6)
    ax.set_xlim(0, right)
    if not measure.higher:
        ax.axvline(1.0, color="#888888", linewidth=0.8, linestyle=":")
    ax.set_xlabel(f"{measure.axis} (line: 95 % interval)", fontsize="small")
    ax.tick_params(axis="x", labelsize="small")
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.tick_params(axis="y", length=0)
    return headings


def _bar(ax: plt.Axes, y: int, row: pd.Series, measure: Measure, simulated: bool) -> None:
    """One bar, its interval, and beside it the leader's value, or another's ratio or value."""
    colour = {"leader": LEADER, "tied": TIED}.get(row["place"], OTHER)
    ax.barh(y, row["relative"], height=0.7, color=colour)
    ax.plot([row["low"], row["high"]], [y, y], color="black", linewidth=1)
    if measure.higher:
        note = f"{row['value']:.3g}"
    elif row["place"] == "leader":
        note = f"{row['value']:.3g} s" + (" (simulated)" if simulated else "")
    else:
        note = f"{row['relative']:.2f}×"
    ax.text(max(row["high"], row["relative"]) * 1.02, y, note, va="center", fontsize="small")
