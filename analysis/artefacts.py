"""Every table and figure the analysis makes, written once: the registry the steps and the Snakefile read.

An :class:`Artefact` names one table (a file under ``results/tables/``) or one kind of figure (files
under ``results/figures/``), the function that makes it and the artefacts it reads. The tables step
calls each table's function in the order of :data:`TABLES`, the figures step each figure's, the
Snakefile declares their files as its rules' outputs and inputs (with their captions), and the report
reads them by name; a table that the report has no section of its own for is shown in a section of
its own heading (``section``). Adding a table and its figure is their module and two entries here
(docs/report.md, "Adding a table and a figure").

The calling convention, so that an entry needs no glue: a table's ``make`` is called with what its
``reads`` name, in that order, and returns a frame (or, for a ``.md`` file, the text); a figure's
with the same, then the figures folder and one colour per algorithm, and returns the paths it wrote.
Runs and curves are the aggregate step's (:mod:`analysis.aggregate`); ``papers_yaml`` and
``claims_yaml`` are the papers' files. This module imports nothing heavy (no pandas, no matplotlib):
the Snakefile imports it while it plans. Functions are named ``"module:function"`` and loaded with
:mod:`importlib` only when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

TABLE, FIGURE = "table", "figure"
# How many files a kind of figure has: one per suite, task, node count and processes per node; one per
# suite and task; one per suite and task that ran two node counts or more (one point scales nothing);
# one over every workload.
PER_LAYOUT, PER_TASK, PER_SCALED_TASK, ONE = "layout", "task", "task with two node counts", "one"
FIGURE_FORMATS = ("png", "svg")  # PNG for the HTML report, SVG for papers
FIGURES_DIR = "figures"  # under the results folder, as every table's file is under "tables/"
CAPTIONS = "analysis/captions"  # relative to the repository, as the Snakefile names files
PAPERS_DIR = Path(__file__).resolve().parent / "papers"
READ_TABLE = "analysis.tables:read_table"


@dataclass(frozen=True)
class Artefact:
    """One table, or one kind of figure, of the analysis.

    Args:
        name: The key everything uses: the step's ``--<name>`` option (``_`` as ``-``), the
            Snakefile's input and output name, the report's; a figure's name is its kind, which
            begins its files' names (:func:`figure_stem`).
        kind: ``"table"`` or ``"figure"``.
        make: ``"module:function"`` that makes it (the calling convention is the module's).
        reads: The names of what ``make`` is given, in its parameters' order: ``runs``, ``curves``,
            ``papers_yaml``, ``claims_yaml`` or an earlier table.
        file: A table's file under the results folder (``tables/<name>.csv``); "" for a figure.
        read: ``"module:function"`` that reads a table's file back (default ``read_table``).
        caption: The ``.rst`` caption under ``analysis/captions/`` (Snakemake's report; the HTML
            report's for a table in its own section); "" for none.
        title: A figure's category in Snakemake's report.
        per: A figure's files: ``PER_LAYOUT``, ``PER_TASK``, ``PER_SCALED_TASK`` or ``ONE``.
        report: Whether the HTML report reads it.
        section: The heading of a section of its own in the HTML report, where the report shows a
            table (as its CSV holds it, with its figures) that it has no section for; "".
    """

    name: str
    kind: str
    make: str
    reads: tuple[str, ...]
    file: str = ""
    read: str = READ_TABLE
    caption: str = ""
    title: str = ""
    per: str = ONE
    report: bool = True
    section: str = ""

    def caption_path(self) -> str:
        """The caption file, relative to the repository ("" for none)."""
        return f"{CAPTIONS}/{self.caption}" if self.caption else ""


def table(name: str, make: str, reads: Iterable[str], **fields: object) -> Artefact:
    """A table entry, its file ``tables/<name>.csv`` unless ``file`` says otherwise."""
    return Artefact(name, TABLE, make, tuple(reads), **{"file": f"tables/{name}.csv", **fields})


def figure(name: str, make: str, reads: Iterable[str], title: str, per: str = ONE) -> Artefact:
    """A figure entry; its caption is ``analysis/captions/<name>.rst``."""
    return Artefact(name, FIGURE, make, tuple(reads), caption=f"{name}.rst", title=title, per=per)


# The aggregate step's tables: one row per run, one per evaluation. Every later step reads them.
AGGREGATES = [
    table("runs", "analysis.aggregate:write", (), read="analysis.aggregate:read_runs"),
    table("curves", "analysis.aggregate:write", (), read="analysis.aggregate:read_curves", report=False),
]
# The papers' files the tables step reads (the papers table also reads the CSVs papers.yaml names).
SOURCES = {"papers_yaml": PAPERS_DIR / "papers.yaml", "claims_yaml": PAPERS_DIR / "claims.yaml"}
# The tables step's tables, in the order it makes them: each reads only those above it.
TABLES = [
    table("time_to_target", "analysis.tables:time_to_target_table", ("runs", "curves"), caption="time_to_target.rst"),
    table(
        "time_to_target_md",
        "analysis.tables:markdown",
        ("time_to_target",),
        file="tables/time_to_target.md",
        report=False,
    ),
    table("scaling", "analysis.scaling:table", ("time_to_target",)),
    table("claims", "analysis.tables:claims_table", ("runs", "claims_yaml"), read="analysis.claims:read"),
    table("performance_ratios", "analysis.profile:ratios_table", ("time_to_target", "claims"), report=False),
    table("performance_profile", "analysis.profile:profile", ("performance_ratios",)),
    table("stragglers", "analysis.stragglers:straggler_throughput", ("time_to_target",)),
    table("papers", "analysis.papers:table", ("papers_yaml", "time_to_target"), read="analysis.papers:read_compared"),
    table("dana", "analysis.dana:table", ("runs", "curves"), read="analysis.dana:read"),
    table("global_syncs", "analysis.tables:global_syncs", ("curves",)),
]
# The figures step's kinds of figure, in the order it draws them.
FIGURES = [
    figure("first_to_target", "analysis.leaders:plot", ("time_to_target", "claims"), "Who reaches the target first"),
    figure(
        "metric_vs_time",
        "analysis.figures:plot_metric_vs_time",
        ("runs", "curves"),
        "Validation metric against wall time",
        PER_LAYOUT,
    ),
    figure(
        "metric_vs_bytes",
        "analysis.figures:plot_metric_vs_bytes",
        ("runs", "curves"),
        "Validation metric against bytes sent",
        PER_LAYOUT,
    ),
    figure("traces", "analysis.traces:plot", ("runs", "curves"), "The algorithms' own traces", PER_LAYOUT),
    figure("scaling", "analysis.scaling:plot", ("time_to_target",), "Scaling across node counts", PER_SCALED_TASK),
    figure(
        "stragglers", "analysis.stragglers:plot", ("stragglers",), "Throughput with and without stragglers", PER_TASK
    ),
    figure("performance_profile", "analysis.profile:plot_profile", ("performance_ratios",), "Performance profile"),
]
# By name: a table and a figure may share one (the scaling table and its figure)
BY_TABLE = {a.name: a for a in [*AGGREGATES, *TABLES]}
BY_FIGURE = {f.name: f for f in FIGURES}
# Files the report shows where present, which no analysis step makes: the measuring commands' and the
# workflow's (its onstart writes when an invocation began).
EXTERNAL = {
    "validation": "tables/validation.csv",  # python -m tools.validate's
    "calibration": "calibration/calibration.csv",  # python -m tools.calibrate's
    "started": "logs/started.txt",
}


def validation_ratios(validation: str | Path) -> Path:
    """The validation's ratio table, beside its table of cases (``python -m tools.validate`` writes both)."""
    validation = Path(validation)
    return validation.with_name(f"{validation.stem}_ratios.csv")


def calibration_figure(calibration: str | Path) -> Path:
    """The calibration's figure, beside its table (``python -m tools.calibrate`` writes both)."""
    return Path(calibration).with_suffix(".png")


def load(reference: str) -> Callable:
    """The function ``"module:function"`` names."""
    module, _, name = reference.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"the registry names {reference!r}, which does not load ({error}); fix analysis/artefacts.py"
        ) from error


def files(names: Iterable[str]) -> dict[str, str | Path]:
    """``{name: file}`` for a step's command line (:mod:`analysis.cli`): a table's path under the
    results folder, a source's absolute path, or an external file's."""
    found: dict[str, str | Path] = {}
    for name in names:
        if name in SOURCES:
            found[name] = SOURCES[name]
        elif name in EXTERNAL:
            found[name] = EXTERNAL[name]
        elif name in BY_TABLE:
            found[name] = BY_TABLE[name].file
        else:
            raise ValueError(f"{name!r} is no table, source or external file of analysis/artefacts.py")
    return found


def figure_reads() -> list[str]:
    """What the figures step reads: every name a figure reads, each once, in the registry's order."""
    return list(dict.fromkeys(name for f in FIGURES for name in f.reads))


def report_reads() -> list[str]:
    """The tables the HTML report reads, in the registry's order."""
    return [a.name for a in [*AGGREGATES, *TABLES] if a.report]


def option(name: str) -> str:
    """A name's command-line option: ``time_to_target`` is ``--time-to-target``."""
    return "--" + name.replace("_", "-")


def figure_stem(
    kind: str, suite: object = None, task: object = None, nodes: object = None, procs_per_node: object = None
) -> str:
    """File name, without extension, of one figure of ``kind``; only the fields the kind is drawn per.

    Path separators and spaces become ``_``, so that any suite or task name gives one file.
    """
    entry = BY_FIGURE.get(kind)
    if entry is None:
        raise ValueError(f"unknown figure kind {kind!r}; known: {', '.join(f.name for f in FIGURES)}")
    if entry.per == PER_LAYOUT:
        stem = f"{suite}__{task}__n{nodes}x{procs_per_node}__{kind}"
    elif entry.per in (PER_TASK, PER_SCALED_TASK):
        stem = f"{suite}__{task}__{kind}"
    else:
        stem = kind
    return stem.replace("/", "_").replace("\\", "_").replace(" ", "_")


def figure_files(kind: str, layouts: Iterable[tuple], ext: str) -> list[str]:
    """The file names of every figure of ``kind`` over ``layouts``, ``(suite, task, nodes,
    procs_per_node)`` tuples, as its entry's ``per`` says."""
    layouts = set(layouts)
    per = BY_FIGURE[kind].per
    if per == PER_LAYOUT:
        keys = sorted(layouts)
    elif per == PER_SCALED_TASK:
        nodes: dict[tuple, set] = {}
        for suite, task, count, *_ in layouts:
            nodes.setdefault((suite, task), set()).add(count)
        keys = sorted(key for key, counts in nodes.items() if len(counts) > 1)
    elif per == PER_TASK:
        keys = sorted({(suite, task) for suite, task, *_ in layouts})
    else:
        keys = [()]
    return [f"{figure_stem(kind, *key)}.{ext}" for key in keys]
