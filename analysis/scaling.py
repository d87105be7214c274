"""Scaling across node counts: speed-up and parallel efficiency, and time to target against nodes.

For one algorithm on one suite, task, processes per node and condition, the smallest node count
with a median time to target is the reference ``n0``. At ``n`` nodes (``W`` workers against
``W0``) the speed-up is ``T(n0) / T(n)`` and the parallel efficiency is that speed-up over the ideal
``W / W0``: 1 is perfect strong scaling, as the DASO paper's "twice the GPUs, half the time". The
same is done with throughput (``X(n) / X(n0)`` over ``W / W0``), which exists even where no seed
reached the target. Times on the simulated clock are scaled only against simulated times.

The figure draws the median time to target against the node count on log–log axes, min–max over
seeds as error bars, and each algorithm's ideal line ``T(n0) · W0 / W`` dotted in its colour. A suite
and task run at one node count has no such figure (a single point scales nothing): the report says
so in a sentence, and :func:`analysis.artefacts.figure_files` declares none.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import artefacts, plotting
from analysis.aggregate import CONDITION
from analysis.plotting import plt

LINE = ["suite", "task", "procs_per_node", *CONDITION, "algorithm"]


def scaling(table: pd.DataFrame) -> pd.DataFrame:
    """Speed-up and parallel efficiency of each algorithm against its smallest node count.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).

    Returns:
        One row per line of ``LINE`` and node count, sorted, with ``workers``, ``tta_median_s``,
        ``speedup_tta`` and ``efficiency_tta`` (NaN without a time at ``n`` or at the reference),
        ``throughput_median``, ``speedup_throughput`` and ``efficiency_throughput``, and
        ``reference_nodes`` (``n0`` of the time columns).
    """
    rows = []
    for key, line in table.groupby(LINE, sort=True, dropna=False):
        line = line.sort_values("nodes")
        workers = line["nodes"].astype(float) * line["procs_per_node"].astype(float)
        timed = line[line["tta_median_s"].notna()]
        ref_t = timed.iloc[0] if len(timed) else None
        with_x = line[line["throughput_median"].notna()]
        ref_x = with_x.iloc[0] if len(with_x) else None
        for (_, row), w in zip(line.iterrows(), workers):
            out = dict(zip(LINE, key))
            out.update(
                {
                    "nodes": int(row["nodes"]),
                    "workers": int(w),
                    "tta_median_s": row["tta_median_s"],
                    "throughput_median": row["throughput_median"],
                }
            )
            if ref_t is not None:
                w0 = float(ref_t["nodes"] * ref_t["procs_per_node"])
                out["reference_nodes"] = int(ref_t["nodes"])
                out["speedup_tta"] = ref_t["tta_median_s"] / row["tta_median_s"]
                out["efficiency_tta"] = out["speedup_tta"] / (w / w0)
            if ref_x is not None:
                x0 = float(ref_x["nodes"] * ref_x["procs_per_node"])
                out["speedup_throughput"] = row["throughput_median"] / ref_x["throughput_median"]
                out["efficiency_throughput"] = out["speedup_throughput"] / (w / x0)
            rows.append(out)
    columns = LINE + [
        "nodes",
        "workers",
        "reference_nodes",
        "tta_median_s",
        "speedup_tta",
        "efficiency_tta",
        "throughput_median",
        "speedup_throughput",
        "efficiency_throughput",
    ]
    return pd.DataFrame(rows, columns=columns)


def table(time_to_target: pd.DataFrame) -> pd.DataFrame:
    """The registry's scaling table: :func:`scaling` over the time-to-target table's finished rows."""
    return scaling(time_to_target[time_to_target["n"] > 0])


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """The scaling table for people: one row per algorithm and node count, formatted."""

    def num(value: float, spec: str, suffix: str = "") -> str:
        return "—" if pd.isna(value) else format(value, spec) + suffix

    return pd.DataFrame(
        {
            "task": frame["task"].astype(str),
            "algorithm": frame["algorithm"].astype(str),
            "stragglers": frame["straggler"].astype(str),
            "nodes×procs": [f"{n}×{g}" for n, g in zip(frame["nodes"], frame["procs_per_node"])],
            "median time to target (s)": [num(v, ".1f") for v in frame["tta_median_s"]],
            "speed-up (time)": [num(v, ".2f", "×") for v in frame["speedup_tta"]],
            "efficiency (time)": [num(v, ".0%") for v in frame["efficiency_tta"]],
            "throughput (samples/s)": [num(v, ",.0f") for v in frame["throughput_median"]],
            "speed-up (throughput)": [num(v, ".2f", "×") for v in frame["speedup_throughput"]],
            "efficiency (throughput)": [num(v, ".0%") for v in frame["efficiency_throughput"]],
            "clock": frame["clock"].astype(str),
        }
    )


def plot_scaling(table: pd.DataFrame, out_dir: Path, colours: dict | None = None) -> list[Path]:
    """Draw one log–log time-to-target-against-nodes figure per suite and task run at two node counts or more.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).
        out_dir: Directory for the figures.
        colours: One colour per algorithm (default: :func:`analysis.plotting.colours` of the table).

    Returns:
        The paths written, PNG then SVG per figure.
    """
    colour = colours or plotting.colours(table["algorithm"].dropna())
    paths = []
    for (suite, task), group in table.groupby(["suite", "task"], sort=True):
        if group["nodes"].nunique() < 2:
            continue
        timed = group[group["tta_median_s"].notna()]
        title = f"{suite}: {task}"
        if timed.empty:
            fig = plotting.empty_figure("No run reached the target: nothing to scale.", title)
            paths += plotting.save(fig, out_dir, artefacts.figure_stem("scaling", suite, task))
            continue
        fig, ax = plt.subplots(figsize=(9.5, 4.5))
        nodes_seen = sorted(group["nodes"].unique())
        shared = timed[CONDITION].drop_duplicates()  # one condition: said once, in the title
        common = plotting.condition(*shared.iloc[0]) if len(shared) == 1 else ""
        for key, line in timed.groupby(["algorithm", *CONDITION], sort=True):
            algorithm, straggler, clock, model = key
            line = line.sort_values("nodes")
            nodes = line["nodes"].astype(float).to_numpy()
            median = line["tta_median_s"].to_numpy()
            errors = [median - line["tta_min_s"].to_numpy(), line["tta_max_s"].to_numpy() - median]
            own = plotting.condition(straggler, clock, model)
            label = algorithm + (f" [{own}]" if own and not common else "")
            style = "-" if straggler == "none" else "--"
            ax.errorbar(
                nodes, median, yerr=errors, color=colour[algorithm], marker="o", linestyle=style, capsize=3, label=label
            )
            ideal = median[0] * nodes[0] / nodes
            ax.plot(nodes, ideal, color=colour[algorithm], linestyle=":", linewidth=1)
        ax.plot([], [], color="grey", linestyle=":", label="ideal (time ∝ 1/nodes)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(nodes_seen, [str(n) for n in nodes_seen])
        plotting.plain_log_ticks(ax.yaxis)
        ax.set_xlabel(f"nodes (× {int(group['procs_per_node'].iloc[0])} processes each)")
        ax.set_ylabel(plotting.time_label(group["clock"], "time to target (s)"))
        ax.set_title(plotting.title(title, common), fontsize="medium")
        ax.grid(alpha=0.3, which="both")
        plotting.legend_outside(ax)
        fig.tight_layout()
        paths += plotting.save(fig, out_dir, artefacts.figure_stem("scaling", suite, task))
    return paths


def plot(time_to_target: pd.DataFrame, out_dir: Path, colours: dict) -> list[Path]:
    """The registry's figure: :func:`plot_scaling` over the time-to-target table's finished rows."""
    return plot_scaling(time_to_target[time_to_target["n"] > 0], out_dir, colours)
