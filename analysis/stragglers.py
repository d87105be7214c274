"""Throughput with and without stragglers: how much of its speed each algorithm keeps.

Runs whose settings inject stragglers (``straggler`` other than ``none``: WAGMA's fixed delays,
DANA's gamma times) are set beside the runs of the same suite, task, node count, processes per node,
clock and algorithm without them. Only the suite's own runs: a suite is one matrix under one set of
conditions, so another suite's runs differ in more than the stragglers (two kinds of stragglers, a
time model, a network), and setting them beside each other would compare those too. A suite that
runs only with stragglers, or only without, has nothing to compare, and its table is empty. The
retained share is the median throughput with stragglers over the median without; a synchronous
algorithm waits for the slowest rank at every step and keeps little, a wait-avoiding or asynchronous
one keeps more.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import artefacts, plotting
from analysis.plotting import plt

MATCH = ["suite", "task", "nodes", "procs_per_node", "clock", "time_model", "algorithm"]


def straggler_throughput(table: pd.DataFrame) -> pd.DataFrame:
    """Median throughput per condition, against the same runs without stragglers.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).

    Returns:
        One row per ``MATCH`` (the suite included) and straggler condition, with
        ``throughput_median``, ``throughput_none`` (NaN where the suite has no straggler-free run
        that matches) and ``retained`` (their ratio; 1 for the ``none`` rows).
    """
    finished = table[table["n"] > 0]
    pooled = finished.groupby(MATCH + ["straggler"], sort=True)["throughput_median"].median().reset_index()
    none = pooled[pooled["straggler"] == "none"].drop(columns="straggler")
    out = pooled.merge(none.rename(columns={"throughput_median": "throughput_none"}), on=MATCH, how="left")
    out["retained"] = out["throughput_median"] / out["throughput_none"]
    return out[MATCH + ["straggler", "throughput_median", "throughput_none", "retained"]]


def compared(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`straggler_throughput` that compare: with stragglers, beside a run without."""
    return frame[(frame["straggler"] != "none") & frame["throughput_none"].notna()]


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """The straggler table for people: the conditions with stragglers that have a run without, formatted."""
    frame = compared(frame)
    return pd.DataFrame(
        {
            "task": frame["task"].astype(str),
            "nodes×procs": [f"{n}×{g}" for n, g in zip(frame["nodes"], frame["procs_per_node"])],
            "algorithm": frame["algorithm"].astype(str),
            "stragglers": frame["straggler"].astype(str),
            "throughput without (samples/s)": [f"{v:,.0f}" for v in frame["throughput_none"]],
            "throughput with (samples/s)": [f"{v:,.0f}" for v in frame["throughput_median"]],
            "retained": ["—" if pd.isna(v) else f"{v:.0%}" for v in frame["retained"]],
            "clock": frame["clock"].astype(str),
        }
    )


def nothing_to_compare(conditions: Iterable[str]) -> str:
    """Why a suite's runs, with these straggler ``conditions``, give no comparison: a sentence."""
    present = set(conditions)
    injected = sorted(present - {"none"})
    if not injected:
        return (
            "No run of this suite has stragglers: add runs with set: {straggler: fixed} (or gamma) to this "
            "suite to see how much throughput each algorithm keeps."
        )
    if "none" not in present:
        return f"Every run of this suite has stragglers ({', '.join(injected)}): none without them to compare with."
    return "No run with stragglers here has a run without them of the same task, layout and algorithm."


def plot_stragglers(pooled: pd.DataFrame, out_dir: Path, order: list[str] | None = None) -> list[Path]:
    """One bar chart per suite and task: throughput per algorithm, one bar per straggler condition.

    ``pooled`` is :func:`straggler_throughput` of the time-to-target table; a panel per layout of the suite where
    runs with and without stragglers compare, and where none does, a figure that says why (the file
    exists for every suite and task). The algorithms stand in ``order`` (default: that of
    :func:`analysis.plotting.colours`).
    """
    paths = []
    for (suite, task), own in pooled.groupby(["suite", "task"], sort=True):
        stem = artefacts.figure_stem("stragglers", suite, task)
        both = compared(own)
        layouts = sorted({(int(n), int(g)) for n, g in zip(both["nodes"], both["procs_per_node"])})
        if not layouts:
            fig = plotting.empty_figure(nothing_to_compare(own["straggler"]), f"{suite}: {task}")
            paths += plotting.save(fig, out_dir, stem)
            continue
        present = set(own["algorithm"])
        algorithms = [a for a in order or plotting.colours(present) if a in present]
        width_in = max(7.5, 0.9 * len(algorithms) + 3.5)
        fig, axes = plt.subplots(len(layouts), 1, figsize=(width_in, 3.8 * len(layouts)), squeeze=False)
        for ax, (nodes, ppn) in zip(axes[:, 0], layouts):
            rows = own[(own["nodes"] == nodes) & (own["procs_per_node"] == ppn)]
            _bars(ax, rows, algorithms)
            clock = " (simulated clock)" if "simulated" in set(rows["clock"]) else ""
            ax.set_title(f"{suite}: {task}, {nodes}×{ppn}{clock}", fontsize="medium")
        fig.tight_layout()
        paths += plotting.save(fig, out_dir, stem)
    return paths


def plot(pooled: pd.DataFrame, out_dir: Path, colours: dict) -> list[Path]:
    """The registry's figure: :func:`plot_stragglers` of the straggler table, the algorithms in the
    order of ``colours``."""
    return plot_stragglers(pooled, out_dir, list(colours))


def _bars(ax: plt.Axes, rows: pd.DataFrame, algorithms: list[str]) -> None:
    """Throughput bars of one layout, a group per algorithm and a bar per straggler condition."""
    conditions = sorted(rows["straggler"].unique(), key=lambda s: (s != "none", s))
    width = 0.8 / max(len(conditions), 1)
    for i, condition in enumerate(conditions):
        values = [
            rows.loc[(rows["algorithm"] == a) & (rows["straggler"] == condition), "throughput_median"].median()
            for a in algorithms
        ]
        x = np.arange(len(algorithms)) + (i - (len(conditions) - 1) / 2) * width
        ax.bar(
            x,
            values,
            width,
            label=f"stragglers: {condition}",
            hatch=["", "//", "xx", ".."][i % 4],
            color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][i % 4],
            edgecolor="white",
        )
    ax.set_xticks(np.arange(len(algorithms)), algorithms, rotation=30, ha="right")
    ax.set_ylabel("samples/s (all workers)")
    ax.grid(alpha=0.3, axis="y")
    plotting.legend_outside(ax)
