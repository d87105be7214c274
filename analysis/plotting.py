"""What every figure of the report shares: the backend, one colour per algorithm, saving.

One colour per algorithm across all figures, so that a reader matches lines between figures without
reading legends twice: the names come from the runs themselves (the analysis never imports the
registry, which would import torch), DDP first since every speed-up is against it, then the others
alphabetically. Every figure is saved as PNG (embedded in the HTML report) and SVG (for papers),
named by :mod:`benchmarks.naming`, without a date in the metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: the report is rendered on clusters and in CI
matplotlib.rcParams["svg.hashsalt"] = "dp-bench"  # SVG ids from a fixed salt, not at random
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402

from analysis.aggregate import BASELINE  # noqa: E402
from benchmarks import naming  # noqa: E402


def colours(algorithms: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per algorithm name, DDP first, then alphabetically: the dict's order is that order.

    ``tab10`` for up to 10 names, else ``tab20`` (20 distinguishable colours). Give every figure
    the same dict, made from all the runs, so that a name keeps its colour where another figure
    lacks some algorithm.
    """
    names = sorted(set(algorithms), key=lambda a: (a != BASELINE, a))
    palette = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    return {name: palette(i % palette.N) for i, name in enumerate(names)}


def save(fig: plt.Figure, out_dir: Path, stem: str) -> list[Path]:
    """Save ``fig`` as ``out_dir/stem.png`` and ``.svg``, close it, and return both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in naming.FIGURE_FORMATS:
        path = out_dir / f"{stem}.{ext}"
        # No date in the metadata: the same results give byte-identical files.
        fig.savefig(path, dpi=110, metadata={"Date": None} if ext == "svg" else None)
        paths.append(path)
    plt.close(fig)
    return paths


def empty_figure(message: str, title: str) -> plt.Figure:
    """A small figure that says why there is nothing to draw (the file must still exist)."""
    fig, ax = plt.subplots(figsize=(7.5, 1.6))
    ax.axis("off")
    ax.set_title(title, fontsize="medium")
    ax.text(0.5, 0.4, message, ha="center", va="center", wrap=True, color="#555555")
    return fig


def plain_log_ticks(axis: matplotlib.axis.Axis) -> None:
    """Label a log axis with plain numbers (2, 4, 8) instead of powers of ten (2×10⁰)."""
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: ""))


def time_label(clocks: Iterable[str], what: str = "wall time (s)") -> str:
    """Axis label of a time, marked as simulated where any of ``clocks`` is."""
    return f"simulated {what}" if "simulated" in set(clocks) else what
