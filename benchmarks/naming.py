"""The names the suite gives a run and a figure, written once.

A run's directory and log are named by its run id,
``<task>__<algorithm>__n<nodes>x<procs_per_node>__s<seed>``; the analysis reads a run's identity
back from that name when the run's own files do not say, and names the report's figures after the
same fields. The Snakefile lists these names as its outputs before anything runs,
``benchmarks/config.py`` names a run with them and ``analysis/`` reads and writes them, so this
module imports nothing heavy (no torch): the Snakefile and the analysis import it cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_RUN_ID = re.compile(r"^(?P<task>.+)__(?P<algorithm>.+)__n(?P<nodes>\d+)x(?P<procs_per_node>\d+)__s(?P<seed>\d+)$")

# Every figure of the report, with what it shows (the Snakemake report's category). Captions are
# analysis/captions/<kind>.rst.
FIGURE_KINDS = {
    "first_to_target": "Who reaches the target first",
    "metric_vs_time": "Validation metric against wall time",
    "metric_vs_bytes": "Validation metric against bytes sent",
    "scaling": "Scaling across node counts",
    "stragglers": "Throughput with and without stragglers",
    "traces": "The algorithms' own traces",
    "performance_profile": "Performance profile",
}
PER_LAYOUT = (
    "metric_vs_time",
    "metric_vs_bytes",
    "traces",
)  # one figure per suite, task, node count and processes per node
PER_TASK = ("scaling", "stragglers")  # one per suite and task; the others: one over every workload
FIGURE_FORMATS = ("png", "svg")  # PNG for the HTML report, SVG for papers


def run_id(task: object, algorithm: object, nodes: object, procs_per_node: object, seed: object) -> str:
    """The run id; any field may be a Snakemake wildcard such as ``"{task}"``."""
    return f"{task}__{algorithm}__n{nodes}x{procs_per_node}__s{seed}"


def parse_run_id(name: str) -> dict[str, str] | None:
    """The fields of a run id (``task``, ``algorithm``, ``nodes``, ``procs_per_node``, ``seed``, as
    strings), or None where ``name`` is not one (a run started by hand into a directory of its own)."""
    match = _RUN_ID.match(name)
    return match.groupdict() if match else None


def figure_stem(
    kind: str, suite: object = None, task: object = None, nodes: object = None, procs_per_node: object = None
) -> str:
    """File name, without extension, of one figure of ``kind``; only the fields the kind is drawn per.

    Path separators and spaces become ``_``, so that any suite or task name gives one file.
    """
    if kind in PER_LAYOUT:
        stem = f"{suite}__{task}__n{nodes}x{procs_per_node}__{kind}"
    elif kind in PER_TASK:
        stem = f"{suite}__{task}__{kind}"
    elif kind in FIGURE_KINDS:
        stem = kind
    else:
        raise ValueError(f"unknown figure kind {kind!r}; known: {', '.join(FIGURE_KINDS)}")
    return stem.replace("/", "_").replace("\\", "_").replace(" ", "_")


def figure_files(kind: str, layouts: Iterable[tuple], ext: str) -> list[str]:
    """The file names of every figure of ``kind`` over ``layouts``, ``(suite, task, nodes,
    procs_per_node)`` tuples: one per layout, per suite and task, or one in all. Scaling is drawn
    only for a suite and task with two node counts or more: one point scales nothing."""
    layouts = set(layouts)
    if kind in PER_LAYOUT:
        keys = sorted(layouts)
    elif kind == "scaling":
        nodes: dict[tuple, set] = {}
        for suite, task, count, *_ in layouts:
            nodes.setdefault((suite, task), set()).add(count)
        keys = sorted(key for key, counts in nodes.items() if len(counts) > 1)
    elif kind in PER_TASK:
        keys = sorted({(suite, task) for suite, task, *_ in layouts})
    else:
        keys = [()]
    return [f"{figure_stem(kind, *key)}.{ext}" for key in keys]


# metrics.csv's common columns, in its order (``benchmarks/rundir.py`` writes them, ``analysis/`` reads
# them); an algorithm's own follow. sent_mb: the megabytes a rank sent since the start, the mean over
# ranks (algorithms/comm.py counts them).
METRIC_COLUMNS = (
    "epoch",
    "step",
    "samples",
    "wall_s",
    "eval_s",  # of wall_s, the seconds spent evaluating (wall_s less the slowest rank's training)
    "train_loss",
    "val_loss",
    "val_metric",
    "lr",
    "comm_s",
    "sent_mb",
)

# summary.json's measurements, in its order (``benchmarks/rundir.py`` writes them, ``analysis/`` reads them)
MEASUREMENTS = (
    "time_to_target_s",
    "epochs_to_target",
    "final_metric",
    "best_metric",
    "final_train_loss",
    "epochs",
    "steps",
    "samples",
    "wall_s",
    "step_s",  # seconds a training step: wall_s less the evaluations, over the steps
    "throughput",
    "comm_share",
    "sent_mb",
    "sent_mb_to_target",
    "target_step_s",  # the time between the evaluation that reached the target and the one before it
)
