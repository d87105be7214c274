"""What every run writes, and when it stops: the one recorder of the real loop and the simulator.

Each evaluation hands the recorder one row (epoch, step, clock, losses, metric, and the algorithm's
own columns). The recorder keeps the best metric and the first time the task's target was reached,
writes the row to ``metrics.csv`` at once, prints a progress line, and says whether the run stops
there: ``"diverged"`` (a non-finite training loss), ``"target"`` (the target reached, with
``stop_at_target``), or ``None``. At the end it writes ``summary.json`` from what it kept. Every rank
of a real run holds one and takes the same decision from the same job-wide numbers; only rank 0's
writes (``writes=True``). The run's wandb record is made from these files once it has ended
(``benchmarks/wandb_records.py``), so nothing of wandb runs on the clock.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

from tqdm import tqdm

from algorithms import comm
from benchmarks import naming, rundir, tasks
from benchmarks.config import RunConfig

logger = logging.getLogger("benchmarks.run")


def setup_logging(path: Path) -> None:
    """The run's log: ``log.txt`` in the run directory, and stderr."""
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    for handler in (logging.FileHandler(path), logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def evaluation_due(epoch: int, hparams: dict[str, object], train_loss: float) -> bool:
    """Whether the run evaluates after (0-based) ``epoch``: every ``eval_every`` epochs, after the
    last, and at once when the training loss is no longer finite (the run then ends as diverged)."""
    return (epoch + 1) % hparams["eval_every"] == 0 or epoch + 1 == hparams["epochs"] or not math.isfinite(train_loss)


class Recorder:
    """The run's rows, its best metric and time to target, and the decision to stop.

    Args:
        cfg: the resolved run.
        task: the run's task (its metric and target), the one the runner built the run from.
        columns: the algorithm's own metrics.csv columns, after the common ones.
        writes: whether this process writes the run directory (rank 0, or the simulator).
        clock: ``"wall"`` or ``"simulated"``: the clock that ``wall_s`` reads, written to the summary.
        resume: a checkpoint's commit record: metrics.csv is kept up to its ``metrics_bytes`` and a
            restarts at the end of the last row checkpointed.
    """

    def __init__(
        self,
        cfg: RunConfig,
        task: tasks.Task,
        columns: list[str],
        *,
        writes: bool,
        clock: str = "wall",
        resume: dict[str, object] | None = None,
    ) -> None:
        self.cfg, self.task, self.clock, self.writes = cfg, task, clock, writes
        self.metric, self.target = task.metric, task.target
        self.best, self.time_to_target_s, self.epochs_to_target, self.sent_mb_to_target = -math.inf, None, None, None
        self.target_step_s = None  # how finely the time to target is resolved: its evaluation's distance to the last
        self.row: dict[str, object] = {}
        self.eval_s = 0.0  # this rank's seconds of evaluation so far (the runner adds each evaluation's)
        self.columns = [*rundir.METRIC_COLUMNS, *columns]
        self.csv = None
        if writes:
            self.csv = rundir.MetricsWriter(
                cfg.out / naming.METRICS, columns, resume["metrics_bytes"] if resume else None
            )

    def record(self, row: dict[str, object]) -> str | None:
        """Keep and write one evaluation's ``row``; return why the run stops here, or ``None``."""
        undeclared = set(row) - set(self.columns)
        if undeclared:
            raise ValueError(
                f"metrics {sorted(undeclared)} are not metrics.csv columns: declare them in the algorithm's ``columns``"
            )
        previous, self.row = self.row.get("wall_s", 0.0), row
        metric, train_loss = row["val_metric"], row["train_loss"]
        if math.isfinite(metric):
            self.best = max(self.best, metric)
        if self.time_to_target_s is None and metric >= self.target:
            self.time_to_target_s, self.epochs_to_target = row["wall_s"], row["epoch"]
            self.sent_mb_to_target, self.target_step_s = row.get("sent_mb"), row["wall_s"] - previous
        if self.writes:
            self.csv.write(row)
            clock = "simulated" if self.clock == "simulated" else "wall"
            tqdm.write(
                f"epoch {row['epoch']:>3}/{self.cfg.hparams['epochs']}  train_loss {train_loss:.4f}  "
                f"val_{self.metric} {metric:.4f}  {clock} {row['wall_s']:.1f}s",
                file=sys.stderr,
            )
        if not math.isfinite(train_loss):
            return "diverged"
        if self.time_to_target_s is not None and self.cfg.settings.stop_at_target:
            return "target"
        return None

    def metrics_bytes(self) -> int | None:
        """Bytes of metrics.csv written so far (what a checkpoint records to resume at)."""
        return self.csv.tell() if self.csv is not None else None

    def fields(self, epochs: int, steps: int, samples: int, wall: float) -> dict[str, object]:
        """summary.json's measurements: the last row's, the best, the time to target."""
        row = self.row
        return {
            "time_to_target_s": self.time_to_target_s,
            "epochs_to_target": self.epochs_to_target,
            "final_metric": row.get("val_metric"),
            "best_metric": self.best if math.isfinite(self.best) else None,
            "final_train_loss": row.get("train_loss"),
            "epochs": epochs,
            "steps": steps,
            "samples": samples,
            "wall_s": wall,
            "step_s": (wall - (row.get("eval_s") or 0.0)) / steps if steps else None,
            "throughput": samples / wall if wall else None,
            "comm_share": (row["comm_s"] / wall) if row.get("comm_s") is not None and wall else None,
            "sent_mb": row.get("sent_mb"),
            "sent_mb_to_target": self.sent_mb_to_target,
            "target_step_s": self.target_step_s,
        }

    def finish(self, status: str, fields: dict[str, object]) -> None:
        """Close metrics.csv, then write the summary (last: it marks the run done)."""
        self.close()
        if self.writes:
            summary = rundir.write_summary(self.cfg, status, clock=self.clock, task=self.task, **fields)
            logger.info(
                "%s%s: %s",
                status,
                " (simulated)" if self.clock == "simulated" else "",
                {k: summary[k] for k in ("time_to_target_s", "best_metric", "wall_s")},
            )

    def close(self) -> None:
        if self.csv is not None:
            self.csv.close()
            self.csv = None

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint keeps of the record, with this rank's count of bytes sent."""
        return {
            "best": self.best,
            "time_to_target_s": self.time_to_target_s,
            "epochs_to_target": self.epochs_to_target,
            "sent_mb_to_target": self.sent_mb_to_target,
            "target_step_s": self.target_step_s,
            "row": dict(self.row),
            "eval_s": self.eval_s,
            "sent_bytes": comm.sent_bytes(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.best, self.row = state["best"], dict(state["row"])
        self.eval_s = state.get("eval_s", 0.0)
        self.time_to_target_s, self.epochs_to_target = state["time_to_target_s"], state["epochs_to_target"]
        self.sent_mb_to_target, self.target_step_s = state["sent_mb_to_target"], state.get("target_step_s")
        comm.set_sent_bytes(state["sent_bytes"])
