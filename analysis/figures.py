"""Validation metric against wall time, one figure per suite, task and node count.

Each algorithm is drawn as the median over its seeds with a shaded min–max band. A seed's curve is
a step function: the metric is known only at evaluations, so between two evaluations it keeps the
last value (which is also how time to target is measured), before its first evaluation it has none,
and past its last evaluation it keeps its last value. The common grid is the union of all the
seeds' evaluation times, so the median step curve is exact, not resampled. Failed and non-converged
runs are drawn like the others (never dropped); unfinished runs are left out, since their curves
would stop early and pull the median down. The target is a dashed horizontal line. Simulated times
are labelled as such on the x axis.

Run as ``python -m analysis.figures --results DIR`` to write
``DIR/figures/<suite>__<task>__n<N>x<G>__metric_vs_time.{png,svg}``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.aggregate import INCOMPLETE, load_curves, load_runs, parse_results  # noqa: E402
from analysis.tables import GROUP, converged  # noqa: E402

FORMATS = ("png", "svg")


def figure_stem(suite: str, task: str, nodes: int, procs_per_node: int) -> str:
    """File name (without extension) of the metric-vs-time figure of one group."""
    stem = f"{suite}__{task}__n{nodes}x{procs_per_node}__metric_vs_time"
    return stem.replace("/", "_").replace("\\", "_")


def step_values(wall: np.ndarray, value: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Sample a step curve at ``grid``: the last value at or before each time, NaN before any."""
    wall, value = np.asarray(wall, dtype=float), np.asarray(value, dtype=float)
    order = np.argsort(wall, kind="stable")
    wall, value = wall[order], value[order]
    index = np.searchsorted(wall, grid, side="right") - 1
    return np.where(index >= 0, value[np.clip(index, 0, None)], np.nan)


def median_band(curves: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median, min and max over seeds of the ``val_metric`` step curves of one algorithm.

    Args:
        curves: ``metrics.csv`` rows of one algorithm in one group, with ``run_id``, ``wall_s``
            and ``val_metric``.

    Returns:
        ``(grid, median, low, high)`` on the union of the seeds' evaluation times.
    """
    grid = np.unique(curves["wall_s"].to_numpy(dtype=float))
    stack = np.vstack([
        step_values(seed["wall_s"].to_numpy(dtype=float), seed["val_metric"].to_numpy(dtype=float),
                    grid)
        for _, seed in curves.groupby("run_id", sort=True)
    ])
    with warnings.catch_warnings():  # a grid point before every seed's first evaluation is NaN
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return grid, np.nanmedian(stack, axis=0), np.nanmin(stack, axis=0), np.nanmax(stack, axis=0)


def _first(values: pd.Series) -> object:
    """First non-null value, or None."""
    values = values.dropna()
    return values.iloc[0] if len(values) else None


def plot_metric_vs_time(runs: pd.DataFrame, curves: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Draw and save one metric-vs-time figure per suite, task, nodes and processes per node.

    Args:
        runs: One row per run (:func:`analysis.aggregate.load_runs`), for targets and k/n.
        curves: Evaluations (:func:`analysis.aggregate.load_curves`).
        out_dir: Directory for the figures; created if needed.

    Returns:
        The paths written, PNG then SVG for each group.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = curves[curves["status"] != INCOMPLETE].dropna(subset=["wall_s", "val_metric"])
    finished = runs[runs["status"] != INCOMPLETE]
    # One colour per algorithm across every figure, so the figures read side by side.
    palette = plt.get_cmap("tab10")
    algorithms = sorted(runs["algorithm"].dropna().unique())
    colours = {a: palette(i % 10) for i, a in enumerate(algorithms)}
    paths = []
    for key, group in curves.groupby(GROUP, sort=True):
        suite, task, nodes, procs_per_node = key
        group_runs = finished[(finished[GROUP] == pd.Series(dict(zip(GROUP, key)))).all(axis=1)]
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for algorithm, alg_curves in group.groupby("algorithm", sort=True):
            alg_runs = group_runs[group_runs["algorithm"] == algorithm]
            label = f"{algorithm} ({int(converged(alg_runs).sum())}/{len(alg_runs)} converged)"
            grid, median, low, high = median_band(alg_curves)
            colour = colours.get(algorithm)
            ax.step(grid, median, where="post", color=colour, label=label)
            ax.fill_between(grid, low, high, step="post", color=colour, alpha=0.2, linewidth=0)
        target = _first(group_runs["target"])
        if target is not None:
            ax.axhline(target, color="black", linestyle="--", linewidth=1,
                       label=f"target {target:g}")
        simulated = "simulated" in set(group_runs["clock"].dropna())
        ax.set_xlabel("simulated wall time (s)" if simulated else "wall time (s)")
        ax.set_ylabel(f"validation {_first(group_runs['metric']) or 'metric'}")
        ax.set_title(f"{suite}: {task}, {nodes}×{procs_per_node} workers"
                     " — median, min–max over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        stem = figure_stem(suite, task, nodes, procs_per_node)
        for ext in FORMATS:
            path = out_dir / f"{stem}.{ext}"
            # No date in the metadata: the same results give byte-identical files.
            metadata = {"Date": None} if ext == "svg" else None
            fig.savefig(path, dpi=120, metadata=metadata)
            paths.append(path)
        plt.close(fig)
    return paths


def write_figures(results: Path, runs: pd.DataFrame | None = None,
                  curves: pd.DataFrame | None = None) -> list[Path]:
    """Load what is missing from ``results`` and write its figures to ``results/figures``."""
    runs = load_runs(results) if runs is None else runs
    curves = load_curves(results, runs) if curves is None else curves
    return plot_metric_vs_time(runs, curves, Path(results) / "figures")


def main(argv: list[str] | None = None) -> None:
    """Command line: write the figures and print their paths."""
    results = parse_results("Draw validation metric against wall time per group.", argv)
    for path in write_figures(results):
        print(path)


if __name__ == "__main__":
    main()
