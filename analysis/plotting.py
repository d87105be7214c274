"""What every figure of the report shares: the backend, one colour per algorithm, saving.

One colour per algorithm across all figures, so that a reader matches lines between figures without
reading legends twice: the names come from the runs themselves (the analysis never imports the
registry, which would import torch), DDP first since every speed-up is against it, then the others
alphabetically. Every figure is saved as PNG (embedded in the HTML report) and SVG (for papers),
named by :func:`analysis.artefacts.figure_stem`, without a date in the metadata. The PNG is indexed colour: a
figure of flat colours and antialiased lines loses nothing visible in 256 colours, and the file is a
third of matplotlib's RGBA one, which keeps the report light. Legends stand to the right of the
axes, outside the data, however many algorithms there are. Where more than ``MANY`` lines share one
axes (the default's 21 algorithms), the best ``TOP_LINES`` keep their colours and the others are
drawn thin and grey under one legend entry: 21 coloured lines hide each other and none is read.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image

matplotlib.use("Agg")  # no display: the report is rendered on clusters and in CI
matplotlib.rcParams["svg.hashsalt"] = "dp-bench"  # SVG ids from a fixed salt, not at random
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402

from analysis import artefacts  # noqa: E402
from analysis.aggregate import BASELINE  # noqa: E402

DPI = 110  # the PNG's: 7.5 inches is 825 pixels, the report's figure at its natural size
MANY = 8  # lines one axes holds in colour and stays readable
TOP_LINES = 6  # of more, the best drawn in colour
OTHERS = "#b5b5b5"  # the rest, thin


def colours(algorithms: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per algorithm name, DDP first, then alphabetically: the dict's order is that order.

    ``tab10`` for up to 10 names, else ``tab20`` then ``tab20b`` (the default matrix has 21
    algorithms: with ``tab20`` alone the 21st had DDP's colour). Give every figure
    the same dict, made from all the runs, so that a name keeps its colour where another figure
    lacks some algorithm.
    """
    names = sorted(set(algorithms), key=lambda a: (a != BASELINE, a))
    palette = [*plt.get_cmap("tab20").colors, *plt.get_cmap("tab20b").colors]  # 40 before one repeats
    if len(names) <= 10:
        palette = list(plt.get_cmap("tab10").colors)
    return {name: (*palette[i % len(palette)], 1.0) for i, name in enumerate(names)}


def coloured(ranked: list[str]) -> list[str]:
    """Of ``ranked`` (best first), those a figure draws in their colours: all up to ``MANY``, else the
    first ``TOP_LINES``; the rest go grey (:func:`others`)."""
    return list(ranked) if len(ranked) <= MANY else list(ranked[:TOP_LINES])


def others(ranked: list[str]) -> str:
    """The one legend entry of the grey lines, or "" where every line has its colour."""
    rest = len(ranked) - len(coloured(ranked))
    return f"the other {rest}, in grey" if rest else ""


def save(fig: plt.Figure, out_dir: Path, stem: str) -> list[Path]:
    """Save ``fig`` as ``out_dir/stem.png`` and ``.svg``, close it, and return both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in artefacts.FIGURE_FORMATS:
        path = out_dir / f"{stem}.{ext}"
        if ext == "png":
            _save_png(fig, path)
        else:  # no date in the metadata: the same results give byte-identical files
            fig.savefig(path, dpi=DPI, metadata={"Date": None})
        paths.append(path)
    plt.close(fig)
    return paths


def _save_png(fig: plt.Figure, path: Path) -> None:
    """Render ``fig`` once at ``DPI`` and write it as a 256-colour PNG: the octree quantiser and zlib's
    default level cost what matplotlib's own RGBA writer does, for a file a third of its size."""
    dpi = fig.dpi
    fig.set_dpi(DPI)
    try:
        fig.canvas.draw()
        pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3]
        image = Image.fromarray(np.ascontiguousarray(pixels), "RGB")
    finally:
        fig.set_dpi(dpi)
    image.quantize(256, Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(path, compress_level=6)


def legend_outside(ax: matplotlib.axes.Axes, **kwargs: object) -> None:
    """The legend to the right of ``ax``, out of the data; one column up to 16 entries, then two."""
    entries = len(ax.get_legend_handles_labels()[0])
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize="small",
        ncol=1 if entries <= 16 else 2,
        **kwargs,
    )


def empty_figure(message: str, title: str) -> plt.Figure:
    """A small figure that says why there is nothing to draw (the file must still exist)."""
    fig, ax = plt.subplots(figsize=(7.5, 1.6))
    ax.axis("off")
    ax.set_title(title, fontsize="medium")
    ax.text(0.5, 0.4, message, ha="center", va="center", wrap=True, color="#555555")
    fig.tight_layout()  # the title inside the frame
    return fig


def plain_log_ticks(axis: matplotlib.axis.Axis) -> None:
    """Label a log axis with plain numbers (2, 4, 8) instead of powers of ten (2×10⁰). Where it spans
    under two decades, which leaves one or two powers of ten to read, the minor ticks at 2 and 5 are
    labelled too."""

    def minor(value: float, _: object) -> str:
        low, high = axis.get_view_interval()
        if value <= 0 or low <= 0 or high / low >= 100:
            return ""
        digit = round(value / 10 ** math.floor(math.log10(value)), 6)
        return f"{value:g}" if digit in (2, 5) else ""

    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))


def condition(straggler: str, clock: str, model: str) -> str:
    """A run condition in words: its stragglers and, on the simulated clock, its time model; "" for
    none on the wall clock. A figure whose lines share one says it once, under its title."""
    parts = [] if straggler == "none" else [f"stragglers {straggler}"]
    return ", ".join(parts + ([f"simulated: {model}"] if clock == "simulated" else []))


def title(text: str, common: str = "") -> str:
    """A figure's title, with the condition its lines share on a second line, wrapped to stay inside
    the frame."""
    return text + ("\n" + textwrap.fill(common, 90) if common else "")


def time_label(clocks: Iterable[str], what: str = "wall time (s)") -> str:
    """Axis label of a time, marked as simulated where any of ``clocks`` is."""
    return f"simulated {what}" if "simulated" in set(clocks) else what
