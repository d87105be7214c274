"""The algorithms' own traces: every extra numeric column of ``metrics.csv`` over epochs.

An algorithm may log columns of its own beside the common ones (DASO's ``B`` and ``S`` and its
global synchronisations, DANA's ``gap``, a model spread across workers, SGP's push-sum weight). This
module finds them generically: any column outside the common ones that holds numbers for an
algorithm gets a panel, so a new algorithm's trace appears in the report without a line of
analysis code. The simulator's own counters (``sim_compute_s`` and the other ``sim_`` columns: the
virtual clock's seconds of compute, communication and idling) are the clock's bookkeeping, not an
algorithm's state, and get none. Each panel shows the median over seeds against the epoch with the
min–max band; epochs align across seeds, unlike wall times.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import artefacts, plotting
from analysis.aggregate import CONDITION, IDENTITY, INCOMPLETE, METRIC_COLUMNS
from analysis.leaders import GROUP
from analysis.plotting import plt

COMMON = set(IDENTITY + CONDITION + ["status"] + METRIC_COLUMNS)
SIMULATOR = "sim_"  # the prefix of the virtual clock's counters in a simulated run's metrics.csv
COLUMNS_PER_ROW = 4  # the report's width holds four panels, and the page a quarter fewer rows than with three
PANEL_IN = (3.2, 2.3)  # width and height of a panel, inches
TITLE_IN = 0.3  # the band above the panels that holds the figure's title, inches


def trace_columns(curves: pd.DataFrame) -> list[tuple[str, str]]:
    """``(algorithm, column)`` for every extra column that holds numbers for that algorithm at two
    epochs or more: a trace over epochs (a one-epoch run's single point is in its metrics.csv). The
    simulator's counters are not an algorithm's."""
    extra = [c for c in curves.columns if c not in COMMON and not c.startswith(SIMULATOR)]
    pairs = []
    for algorithm, rows in curves.groupby("algorithm", sort=True):
        for column in extra:
            values = pd.to_numeric(rows[column], errors="coerce")
            if rows.loc[values.notna(), "epoch"].nunique() > 1:
                pairs.append((algorithm, column))
    return pairs


def plot(runs: pd.DataFrame, curves: pd.DataFrame, out_dir: Path, colours: dict) -> list[Path]:
    """The registry's figure: :func:`plot_traces` of the finished runs' curves, one per layout with
    finished runs."""
    finished = runs.loc[runs["status"] != INCOMPLETE, GROUP].drop_duplicates()
    groups = [tuple(key) for key in finished.itertuples(index=False)]
    return plot_traces(curves[curves["status"] != INCOMPLETE], out_dir, groups, colours)


def epoch_band(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Median, min and max over seeds of ``column`` per epoch; columns ``epoch, median, low, high``."""
    values = rows.assign(value=pd.to_numeric(rows[column], errors="coerce")).dropna(subset=["value"])
    band = values.groupby("epoch")["value"].agg(["median", "min", "max"]).reset_index()
    return band.rename(columns={"min": "low", "max": "high"})


def plot_traces(
    curves: pd.DataFrame, out_dir: Path, groups: list[tuple] | None = None, colours: dict | None = None
) -> list[Path]:
    """Draw one figure per suite, task and layout with a panel per (algorithm, own column).

    Args:
        curves: Evaluations (:func:`analysis.aggregate.load_curves`), unfinished runs included.
        out_dir: Directory for the figures.
        groups: ``(suite, task, nodes, procs_per_node)`` keys to draw even without curves (an
            explanatory figure then), so that every group's file exists.
        colours: One colour per algorithm (default: :func:`analysis.plotting.colours` of the curves).

    Returns:
        The paths written, PNG then SVG per figure.
    """
    colour = colours or plotting.colours(curves["algorithm"].dropna())
    keys = {tuple(k) for k in curves[GROUP].drop_duplicates().itertuples(index=False)}
    keys |= set(groups or [])
    paths = []
    for key in sorted(keys):
        suite, task, nodes, ppn = key
        rows = curves[(curves[GROUP] == pd.Series(dict(zip(GROUP, key)))).all(axis=1)]
        pairs = trace_columns(rows) if not rows.empty else []
        title = f"{suite}: {task}, {nodes}×{ppn} — the algorithms' own metrics"
        stem = artefacts.figure_stem("traces", suite, task, nodes, ppn)
        if not pairs:
            fig = plotting.empty_figure(
                "No algorithm here logs a column of its own in metrics.csv over two epochs or more.", title
            )
            paths += plotting.save(fig, out_dir, stem)
            continue
        n_rows = -(-len(pairs) // COLUMNS_PER_ROW)
        n_cols = min(len(pairs), COLUMNS_PER_ROW)
        height = PANEL_IN[1] * n_rows + TITLE_IN
        fig, axes = plt.subplots(n_rows, n_cols, figsize=(PANEL_IN[0] * n_cols, height), squeeze=False)
        for ax, (algorithm, column) in zip(axes.flat, pairs):
            band = epoch_band(rows[rows["algorithm"] == algorithm], column)
            ax.plot(band["epoch"], band["median"], color=colour[algorithm], marker=".", markersize=3)
            ax.fill_between(band["epoch"], band["low"], band["high"], color=colour[algorithm], alpha=0.2, linewidth=0)
            ax.set_title(f"{algorithm}: {column}", fontsize="small")
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(pairs) :]:
            ax.axis("off")
        # The panels below a band of TITLE_IN, the title in it: tight_layout alone leaves a tall
        # figure's title over the first row's.
        fig.tight_layout(rect=(0, 0, 1, 1 - TITLE_IN / height))
        fig.suptitle(title + " (median, min–max over seeds)", fontsize="medium", y=1 - 0.06 / height, va="top")
        paths += plotting.save(fig, out_dir, stem)
    return paths
