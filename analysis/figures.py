"""Validation metric against wall time, one figure per suite, task and node count.

Each algorithm is drawn as the median over its seeds with a shaded min–max band. A seed's curve is
a step function: the metric is known only at evaluations, so between two evaluations it keeps the
last value (which is also how time to target is measured), before its first evaluation it has none,
and past its last evaluation it keeps its last value. The common grid is the union of all the
seeds' evaluation times, so the median step curve is exact, not resampled. Failed and non-converged
runs are drawn like the others (never dropped); unfinished runs are left out, since their curves
would stop early and pull the median down. The target is a dashed horizontal line. Simulated times
are labelled as such on the x axis.

``python -m analysis.figures --results DIR`` draws every figure of :data:`analysis.artefacts.FIGURES`
from the tables in ``DIR/tables/`` they read (the Snakefile names each) into ``DIR/figures/`` as PNG
and SVG, named by :func:`analysis.artefacts.figure_stem`:
``first_to_target`` (:mod:`analysis.leaders`) over all workloads, ``metric_vs_time``,
``metric_vs_bytes`` and ``traces`` (:mod:`analysis.traces`) per group, ``scaling``
(:mod:`analysis.scaling`) and ``stragglers`` (:mod:`analysis.stragglers`) per suite and task, and
``performance_profile`` (:mod:`analysis.profile`) over all workloads. Every figure but the first
gives an algorithm the same colour (:func:`analysis.plotting.colours` over all the runs); the first
colours a bar by its place (leader, tied, other), its legend says so.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import artefacts, cli, plotting
from analysis.aggregate import CONDITION, INCOMPLETE, read_runs
from analysis.plotting import plt
from analysis.tables import GROUP, converged

# What this step reads (every table a figure of the registry reads) and the folder it draws into
FILES = {**artefacts.files(["runs", *artefacts.figure_reads()]), "figures": artefacts.FIGURES_DIR}


def step_values(wall: np.ndarray, value: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Sample a step curve at ``grid``: the last value at or before each time, NaN before any."""
    wall, value = np.asarray(wall, dtype=float), np.asarray(value, dtype=float)
    order = np.argsort(wall, kind="stable")
    wall, value = wall[order], value[order]
    index = np.searchsorted(wall, grid, side="right") - 1
    return np.where(index >= 0, value[np.clip(index, 0, None)], np.nan)


def median_band(curves: pd.DataFrame, x: str = "wall_s") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median, min and max over seeds of the ``val_metric`` step curves of one algorithm.

    Args:
        curves: ``metrics.csv`` rows of one algorithm in one group, with ``run_id``, ``x`` and
            ``val_metric``.
        x: the column the curves run along: ``wall_s``, or ``sent_mb`` (the megabytes sent).

    Returns:
        ``(grid, median, low, high)`` on the union of the seeds' values of ``x`` at their evaluations.
    """
    grid = np.unique(curves[x].to_numpy(dtype=float))
    stack = np.vstack(
        [
            step_values(seed[x].to_numpy(dtype=float), seed["val_metric"].to_numpy(dtype=float), grid)
            for _, seed in curves.groupby("run_id", sort=True)
        ]
    )
    with warnings.catch_warnings():  # a grid point before every seed's first evaluation is NaN
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return grid, np.nanmedian(stack, axis=0), np.nanmin(stack, axis=0), np.nanmax(stack, axis=0)


def _first(values: pd.Series) -> object:
    """First non-null value, or None."""
    values = values.dropna()
    return values.iloc[0] if len(values) else None


def plot_metric_vs_time(
    runs: pd.DataFrame, curves: pd.DataFrame, out_dir: Path, colours: dict | None = None, x: str = "wall_s"
) -> list[Path]:
    """Draw and save one metric-vs-time figure per suite, task, nodes and processes per node.

    Args:
        runs: One row per run (:func:`analysis.aggregate.load_runs`), for targets and k/n.
        curves: Evaluations (:func:`analysis.aggregate.load_curves`).
        out_dir: Directory for the figures; created if needed.
        colours: One colour per algorithm (default: :func:`analysis.plotting.colours` of the runs).
        x: ``wall_s``, or ``sent_mb`` for the metric against the megabytes a rank sent
            (``metric_vs_bytes``, on a log axis: the algorithms differ by orders of magnitude).

    Returns:
        The paths written, PNG then SVG for each group.
    """
    curves = curves[curves["status"] != INCOMPLETE].dropna(subset=[x, "val_metric"])
    finished = runs[runs["status"] != INCOMPLETE]
    colours = colours or plotting.colours(runs["algorithm"].dropna())
    kind = "metric_vs_bytes" if x == "sent_mb" else "metric_vs_time"
    paths = []
    for key, group_runs in finished.groupby(GROUP, sort=True):
        group = curves[(curves[GROUP] == pd.Series(dict(zip(GROUP, key)))).all(axis=1)]
        fig = metric_figure(key, group_runs, group, colours, x)
        paths += plotting.save(fig, out_dir, artefacts.figure_stem(kind, *key))
    return paths


def plot_metric_vs_bytes(runs: pd.DataFrame, curves: pd.DataFrame, out_dir: Path, colours: dict) -> list[Path]:
    """:func:`plot_metric_vs_time` against the megabytes a rank sent."""
    return plot_metric_vs_time(runs, curves, out_dir, colours, x="sent_mb")


def ranking(runs: pd.DataFrame) -> list[str]:
    """The algorithms of ``runs`` best first: by median time to target over their converged runs, then,
    for those with none, by median final metric (highest first)."""
    tta = runs[converged(runs)].groupby("algorithm")["time_to_target_s"].median()
    final = runs.groupby("algorithm")["final_metric"].median().fillna(-math.inf)
    return sorted(runs["algorithm"].unique(), key=lambda a: (tta.get(a, math.inf), -final.get(a, -math.inf), a))


def metric_figure(key: tuple, runs: pd.DataFrame, curves: pd.DataFrame, colours: dict, x: str) -> plt.Figure:
    """One group's figure: ``key`` is ``(suite, task, nodes, procs_per_node)``, ``runs`` and ``curves``
    its finished runs and their evaluations. Against bytes the axis is logarithmic from the smallest
    positive count: an evaluation before the first message (0 MB) has no place on it. Of more than
    ``plotting.MANY`` algorithms the best few (:func:`ranking`) keep their colours, the rest are grey."""
    suite, task, nodes, procs_per_node = key
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    smallest = math.inf
    shared = runs[CONDITION].drop_duplicates()  # one condition: said once, in the title
    common = plotting.condition(*shared.iloc[0]) if len(shared) == 1 else ""
    ranked = ranking(runs)
    shown, grey = plotting.coloured(ranked), plotting.others(ranked)
    lines = sorted(curves.groupby(["algorithm", *CONDITION], sort=True), key=lambda item: ranked.index(item[0][0]))
    for (algorithm, straggler, clock, model), alg_curves in lines:
        alg_runs = runs[
            (runs["algorithm"] == algorithm)
            & (runs["straggler"] == straggler)
            & (runs["clock"] == clock)
            & (runs["time_model"] == model)
        ]
        label = f"{algorithm} ({int(converged(alg_runs).sum())}/{len(alg_runs)})"
        own = plotting.condition(straggler, clock, model)
        label += f" [{own}]" if own and not common else ""
        grid, median, low, high = median_band(alg_curves, x)
        if x == "sent_mb":
            shown = grid > 0
            grid, median, low, high = grid[shown], median[shown], low[shown], high[shown]
            smallest = min(smallest, grid.min(initial=math.inf))
        style = "-" if straggler == "none" else "--"
        if algorithm not in shown:  # one legend entry for every grey line, no band
            ax.step(
                grid, median, where="post", color=plotting.OTHERS, linewidth=0.8, linestyle=style, label=grey, zorder=1
            )
            grey = "_nolegend_"
            continue
        colour = colours.get(algorithm)
        ax.step(grid, median, where="post", color=colour, label=label, linestyle=style)
        ax.fill_between(grid, low, high, step="post", color=colour, alpha=0.2, linewidth=0)
    if curves.empty:
        ax.text(
            0.5,
            0.5,
            "no evaluation was recorded (every run failed before one)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="#555555",
        )
    target = _first(runs["target"])
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}")
    if x == "sent_mb":
        ax.set_xlabel("MB sent by a rank (mean over ranks), log scale")
        if math.isfinite(smallest):
            ax.set_xscale("log")
            ax.set_xlim(left=smallest)
            plotting.plain_log_ticks(ax.xaxis)
    else:
        ax.set_xlabel(plotting.time_label(runs["clock"].dropna()))
    ax.set_ylabel(f"validation {_first(runs['metric']) or 'metric'}")
    best = f" (the best {len(shown)} of {len(ranked)} in colour)" if len(shown) < len(ranked) else ""
    ax.set_title(plotting.title(f"{suite}: {task}, {nodes}×{procs_per_node} workers{best}", common), fontsize="medium")
    ax.grid(alpha=0.3)
    plotting.legend_outside(ax, title="algorithm (converged/runs)", title_fontsize="small")
    fig.tight_layout()
    return fig


def write(files: dict) -> list[Path]:
    """Draw every figure of :data:`analysis.artefacts.FIGURES`, in its order, from the tables in
    ``files`` into ``files["figures"]``; each table is read once, by its entry's reader."""
    runs = read_runs(files["runs"])
    colours = plotting.colours(runs["algorithm"].dropna())  # one colour per algorithm in every figure
    tables = {"runs": runs}
    for name in artefacts.figure_reads():
        if name not in tables:
            tables[name] = artefacts.load(artefacts.BY_TABLE[name].read)(files[name])
    out, paths = Path(files["figures"]), []
    for entry in artefacts.FIGURES:
        paths += artefacts.load(entry.make)(*(tables[name] for name in entry.reads), out, colours)
    return paths


def main(argv: list[str] | None = None) -> None:
    """Command line: write the figures and print their paths."""
    for path in write(cli.parse("Draw every figure of the report (PNG and SVG).", FILES, argv)):
        print(path)


if __name__ == "__main__":
    main()
