"""AlgoPerf-style performance profiles: on what share of the workloads is an algorithm near the best?

A workload is one suite, task, node count, processes per node and straggler condition. On each, an
algorithm's ratio is its median time to target over the smallest median of any algorithm there;
an algorithm that never reached the target there, or was not run there, has ratio infinity (as in
AlgoPerf, where a submission must run every workload). A workload where no algorithm reached the
target ranks nothing and is left out: it would only pull every line down to a flat 0. A profile over
fewer than ``MIN_WORKLOADS`` workloads is a ranking of one workload drawn as step lines, so none is
drawn: the report says so in a sentence, and the suite's own table ranks it. The profile ``rho(tau)`` is the share of
workloads with ratio at most ``tau``; ``rho(1)`` is the share it won. The score is the area under
``rho`` from 1 to ``TAU_MAX`` divided by ``TAU_MAX - 1`` (1: fastest everywhere, 0: never within
``TAU_MAX``×). Simulated and wall-clock times are profiled apart and never compared.

Reference: Dahl et al., "Benchmarking Neural Network Training Algorithms" (AlgoPerf), 2023,
Section 4.5 (performance profiles), after Dolan and Moré (2002).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import artefacts, leaders, plotting
from analysis.plotting import plt

WORKLOAD = ["suite", "task", "nodes", "procs_per_node", "straggler", "time_model"]
TAUS = (1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
TAU_MAX = 4.0
MIN_WORKLOADS = 2


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Each algorithm's time-to-target ratio to the fastest on each workload, per clock.

    Args:
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).

    Returns:
        One row per clock, workload where an algorithm reached the target, and algorithm (every
        algorithm of that clock on every such workload of that clock) with ``tta_median_s`` (NaN
        where not converged or not run), ``best_s`` and ``ratio`` (``inf`` where the algorithm has
        no time).
    """
    rows = []
    for clock, runs in table.groupby("clock", sort=True):
        algorithms = sorted(runs["algorithm"].unique())
        for workload, group in runs.groupby(WORKLOAD, sort=True):
            times = group.set_index("algorithm")["tta_median_s"]
            best = times.min()  # NaN-skipping: NaN only where no algorithm reached the target
            if pd.isna(best):
                continue
            for algorithm in algorithms:
                time = times.get(algorithm, math.nan)
                ratio = time / best if pd.notna(time) else math.inf
                rows.append(
                    {
                        "clock": clock,
                        **dict(zip(WORKLOAD, workload)),
                        "algorithm": algorithm,
                        "tta_median_s": time,
                        "best_s": best,
                        "ratio": ratio,
                    }
                )
    return pd.DataFrame(rows, columns=["clock", *WORKLOAD, "algorithm", "tta_median_s", "best_s", "ratio"])


def ratios_table(time_to_target: pd.DataFrame, claims: pd.DataFrame) -> pd.DataFrame:
    """The registry's performance ratios: :func:`ratios` over the finished rows of the suites measured
    by their time to target. A suite the claims read for something else
    (:func:`analysis.leaders.suite_measures`) has no time to target by design."""
    finished = time_to_target[time_to_target["n"] > 0]
    return ratios(finished[~finished["suite"].isin(list(leaders.suite_measures(claims)))])


def rho(ratio: np.ndarray, tau: float) -> float:
    """Share of the workloads on which the ratio is at most ``tau``."""
    ratio = np.asarray(ratio, dtype=float)
    return float((ratio <= tau).mean()) if ratio.size else math.nan


def score(ratio: np.ndarray, tau_max: float = TAU_MAX) -> float:
    """Area under ``rho`` over ``[1, tau_max]``, normalised to [0, 1].

    ``rho`` is a step function, so the area is exact: a workload with ratio ``r`` adds
    ``max(0, tau_max - r)`` (ratios are at least 1), and the sum is divided by the number of
    workloads times ``tau_max - 1``.
    """
    ratio = np.asarray(ratio, dtype=float)
    if not ratio.size:
        return math.nan
    return float(np.clip(tau_max - ratio, 0.0, None).sum() / (ratio.size * (tau_max - 1.0)))


def profile(ratios_frame: pd.DataFrame, taus: tuple[float, ...] = TAUS) -> pd.DataFrame:
    """The profile table: per clock and algorithm, ``rho`` at each of ``taus`` and the score.

    Returns:
        Columns ``clock``, ``algorithm``, ``workloads``, ``wins`` (workloads where it is the
        fastest), ``rho(tau)`` for each tau, and ``score``; sorted by clock, then best score first.
    """
    rows = []
    for (clock, algorithm), group in ratios_frame.groupby(["clock", "algorithm"], sort=True):
        r = group["ratio"].to_numpy(dtype=float)
        row = {"clock": clock, "algorithm": algorithm, "workloads": len(r), "wins": int((r == 1.0).sum())}
        row.update({f"rho({tau:g})": rho(r, tau) for tau in taus})
        row["score"] = score(r)
        rows.append(row)
    columns = ["clock", "algorithm", "workloads", "wins", *[f"rho({t:g})" for t in taus], "score"]
    out = pd.DataFrame(rows, columns=columns)
    return out.sort_values(["clock", "score", "algorithm"], ascending=[True, False, True], ignore_index=True)


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The profile table for people: shares as percentages, ρ(τ) headers."""
    out = table.copy()
    for column in out.columns:
        if column.startswith("rho(") or column == "score":
            out[column] = out[column].map(lambda v: "—" if pd.isna(v) else f"{v:.0%}")
    out = out.rename(columns=lambda c: c.replace("rho(", "ρ(τ=") if c.startswith("rho(") else c)
    return out[[c for c in out.columns if c != "clock"] + ["clock"]]


def workloads(ratios_frame: pd.DataFrame) -> dict[str, int]:
    """How many workloads each clock profiles, from :func:`ratios`' rows."""
    return ratios_frame.drop_duplicates(["clock", *WORKLOAD]).groupby("clock").size().to_dict()


def nothing_to_profile(counts: dict[str, int]) -> str:
    """Why no clock has a profile, in a sentence, from the workloads per clock (:func:`workloads`,
    or the profile table's ``workloads``); "" where one has."""
    if any(n >= MIN_WORKLOADS for n in counts.values()):
        return ""
    each = ", ".join(f"{n} on the {clock} clock" for clock, n in counts.items()) or "none"
    return (
        f"No performance profile: it needs {MIN_WORKLOADS} workloads or more on one clock where an "
        f"algorithm reached the target (here: {each}). Each suite's own table ranks its algorithms."
    )


def plot_profile(ratios_frame: pd.DataFrame, out_dir: Path, colours: dict | None = None) -> list[Path]:
    """Draw ``rho(tau)`` for every algorithm, one panel per clock, one above the other, each with its
    legend beside it; returns PNG and SVG paths.

    ``colours``: one colour per algorithm (default: :func:`analysis.plotting.colours` of the ratios).
    """
    title = "Performance profile over workloads"
    stem = artefacts.figure_stem("performance_profile")
    counts = workloads(ratios_frame)
    clocks = sorted(clock for clock, n in counts.items() if n >= MIN_WORKLOADS)
    if not clocks:  # the file exists for the workflow; the report shows the sentence instead
        fig = plotting.empty_figure(nothing_to_profile(counts), title)
        return plotting.save(fig, out_dir, stem)
    colour = colours or plotting.colours(ratios_frame["algorithm"])
    count = ratios_frame["algorithm"].nunique()
    fig, axes = plt.subplots(len(clocks), 1, figsize=(9.5, 4.5 * len(clocks)), squeeze=False)
    for ax, clock in zip(axes[:, 0], clocks):
        frame = ratios_frame[ratios_frame["clock"] == clock]
        n = frame.groupby("algorithm").size().max()
        finite = frame["ratio"][np.isfinite(frame["ratio"])]
        right = max(TAU_MAX, float(finite.max()) * 1.05 if len(finite) else TAU_MAX)
        grid = np.geomspace(1.0, right, 400)
        scores = {a: score(g["ratio"].to_numpy(dtype=float)) for a, g in frame.groupby("algorithm", sort=True)}
        ranked = sorted(scores, key=lambda a: (-scores[a], a))  # best first: the best few in colour
        shown, grey = plotting.coloured(ranked), plotting.others(ranked)
        # Ties are common (all win the same trivial workload): a small offset keeps lines apart.
        for i, algorithm in enumerate(ranked):
            r = frame.loc[frame["algorithm"] == algorithm, "ratio"].to_numpy(dtype=float)
            values = np.asarray([rho(r, tau) for tau in grid]) + (i - count / 2) * 0.002
            if algorithm in shown:
                ax.step(
                    grid,
                    values,
                    where="post",
                    color=colour[algorithm],
                    label=f"{algorithm} (score {scores[algorithm]:.2f})",
                )
            else:
                ax.step(grid, values, where="post", color=plotting.OTHERS, linewidth=0.8, label=grey, zorder=1)
                grey = "_nolegend_"
        ax.set_xscale("log")
        ax.set_xlim(1.0, right)
        ax.set_xticks([t for t in (1, 1.25, 1.5, 2, 3, 4, 8, 16, 32) if t <= right])
        plotting.plain_log_ticks(ax.xaxis)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("τ: time to target within τ × the fastest")
        ax.set_ylabel(f"share of the {n} workload{'s' if n != 1 else ''}")
        ax.set_title(f"{title} ({clock} clock)", fontsize="medium")
        ax.grid(alpha=0.3, which="both")
        plotting.legend_outside(ax)
    fig.tight_layout()
    return plotting.save(fig, out_dir, stem)
