"""The names the suite gives a run and its files, written once.

A run's directory and log are named by its run id,
``<task>__<algorithm>__n<nodes>x<procs_per_node>__s<seed>``, and hold its files (``CONFIG``,
``METRICS``, ``SUMMARY``); the analysis reads a run's identity back from that name when the run's
own files do not say. The Snakefile lists these names as its outputs before anything runs,
``benchmarks/config.py`` names a run with them and ``analysis/`` reads and writes them, so this
module imports nothing heavy (no torch): the Snakefile and the analysis import it cheaply.
"""

from __future__ import annotations

import re

_RUN_ID = re.compile(r"^(?P<task>.+)__(?P<algorithm>.+)__n(?P<nodes>\d+)x(?P<procs_per_node>\d+)__s(?P<seed>\d+)$")

# The files of a run directory (format in results/README.md): its resolved configuration, its
# evaluations, and its summary, written last (a directory without it is a run still going or cut off).
CONFIG = "config.json"
METRICS = "metrics.csv"
SUMMARY = "summary.json"


def run_id(task: object, algorithm: object, nodes: object, procs_per_node: object, seed: object) -> str:
    """The run id; any field may be a Snakemake wildcard such as ``"{task}"``."""
    return f"{task}__{algorithm}__n{nodes}x{procs_per_node}__s{seed}"


def parse_run_id(name: str) -> dict[str, str] | None:
    """The fields of a run id (``task``, ``algorithm``, ``nodes``, ``procs_per_node``, ``seed``, as
    strings), or None where ``name`` is not one (a run started by hand into a directory of its own)."""
    match = _RUN_ID.match(name)
    return match.groupdict() if match else None


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
