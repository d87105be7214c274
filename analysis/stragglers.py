"""Throughput with and without stragglers: how much of its speed each algorithm keeps.

Runs whose settings inject stragglers (``straggler`` other than ``none``: WAGMA's fixed delays,
DANA's gamma times) are set beside the runs of the same task, node count, processes per node,
clock and algorithm without them, from any suite: a straggler study is usually a second matrix
run next to the first. The retained share is the median throughput with stragglers over the
median without; a synchronous algorithm waits for the slowest rank at every step and keeps little,
a wait-avoiding or asynchronous one keeps more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import plotting
from analysis.plotting import plt
from benchmarks import naming

MATCH = ["task", "nodes", "procs_per_node", "clock", "time_model", "algorithm"]


def straggler_throughput(table: pd.DataFrame) -> pd.DataFrame:
    """Median throughput per condition, against the same runs without stragglers.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).

    Returns:
        One row per ``MATCH`` and straggler condition (pooled over suites: the median of the
        suites' medians), with ``throughput_median``, ``throughput_none`` (NaN where no
        straggler-free run matches) and ``retained`` (their ratio; 1 for the ``none`` rows).
    """
    finished = table[table["n"] > 0]
    pooled = finished.groupby(MATCH + ["straggler"], sort=True)["throughput_median"].median().reset_index()
    none = pooled[pooled["straggler"] == "none"].drop(columns="straggler")
    out = pooled.merge(none.rename(columns={"throughput_median": "throughput_none"}), on=MATCH, how="left")
    out["retained"] = out["throughput_median"] / out["throughput_none"]
    return out[MATCH + ["straggler", "throughput_median", "throughput_none", "retained"]]


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """The straggler table for people: only the conditions with stragglers, formatted."""
    frame = frame[frame["straggler"] != "none"]
    return pd.DataFrame(
        {
            "task": frame["task"].astype(str),
            "nodes×procs": [f"{n}×{g}" for n, g in zip(frame["nodes"], frame["procs_per_node"])],
            "algorithm": frame["algorithm"].astype(str),
            "stragglers": frame["straggler"].astype(str),
            "throughput without (samples/s)": [
                "— (no run without stragglers)" if pd.isna(v) else f"{v:,.0f}" for v in frame["throughput_none"]
            ],
            "throughput with (samples/s)": [f"{v:,.0f}" for v in frame["throughput_median"]],
            "retained": ["—" if pd.isna(v) else f"{v:.0%}" for v in frame["retained"]],
            "clock": frame["clock"].astype(str),
        }
    )


def plot_stragglers(
    table: pd.DataFrame, pooled: pd.DataFrame, out_dir: Path, order: list[str] | None = None
) -> list[Path]:
    """One bar chart per suite and task: throughput per algorithm, one bar per straggler condition.

    The suite's own layouts and algorithms are drawn, with the matching runs of the other
    condition taken from any suite: ``pooled`` is :func:`straggler_throughput` of ``table``. The
    algorithms stand in ``order`` (default: that of :func:`analysis.plotting.colours`).
    """
    paths = []
    for (suite, task), own in table[table["n"] > 0].groupby(["suite", "task"], sort=True):
        layouts = sorted({(int(n), int(g)) for n, g in zip(own["nodes"], own["procs_per_node"])})
        present = set(own["algorithm"])
        algorithms = [a for a in order or plotting.colours(present) if a in present]
        width_in = max(7.5, 0.9 * len(algorithms) + 2)
        fig, axes = plt.subplots(len(layouts), 1, figsize=(width_in, 3.8 * len(layouts)), squeeze=False)
        for ax, (nodes, ppn) in zip(axes[:, 0], layouts):
            rows = pooled[
                (pooled["task"] == task)
                & (pooled["nodes"] == nodes)
                & (pooled["procs_per_node"] == ppn)
                & pooled["algorithm"].isin(algorithms)
            ]
            conditions = sorted(rows["straggler"].unique(), key=lambda s: (s != "none", s))
            width = 0.8 / max(len(conditions), 1)
            hatches = ["", "//", "xx", ".."]
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
                    hatch=hatches[i % 4],
                    color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][i % 4],
                    edgecolor="white",
                )
            ax.set_xticks(np.arange(len(algorithms)), algorithms, rotation=30, ha="right")
            ax.set_ylabel("samples/s (all workers)")
            clocks = rows["clock"].unique()
            clock = " (simulated clock)" if "simulated" in clocks else ""
            note = "" if len(conditions) > 1 else " — no straggler runs to compare yet"
            ax.set_title(f"{suite}: {task}, {nodes}×{ppn} — throughput{clock}{note}", fontsize="medium")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize="small")
        fig.tight_layout()
        paths += plotting.save(fig, out_dir, naming.figure_stem("stragglers", suite, task))
    return paths
