"""``summary.json``'s ``step_s`` (seconds a training step) leaves the evaluations out, on either clock:
``metrics.csv``'s ``eval_s`` holds what they took, checked here against the clocks by hand."""

from __future__ import annotations

import csv
import json
import math

import pytest

from benchmarks import tasks
from benchmarks.virtual.clock import FORWARD_SHARE


def _read(out):
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    return rows, json.loads((out / "summary.json").read_text())


def test_step_s_leaves_out_what_the_virtual_clock_charged_the_evaluations(tmp_path, run_benchmark):
    out = tmp_path / "sim"
    sets = ["clock=simulated", "wandb=false", "epochs=2", "evals_per_epoch=2", "sim_step_ms=50", "batch_size=16"]
    result = run_benchmark(
        "--algorithm", "allreduce", "--task", "digits", "--nodes", "2", "--procs-per-node", "2", "--out", out,
        *[x for s in sets for x in ("--set", s)],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows, summary = _read(out)
    # each evaluation: a forward pass (a third of a batch's 50 ms) per batch of 16 of a rank's share
    _, val_set = tasks.get("digits").make_datasets(None)
    one = FORWARD_SHARE * 0.050 * math.ceil(len(val_set) / 4) / 16
    evals = [float(r["eval_s"]) for r in rows]
    each = [b - a for a, b in zip([0.0, *evals], evals)]  # the same every time: the clock has no noise
    assert each == pytest.approx([each[0]] * len(rows))
    assert one <= each[0] < one + 1e-3  # and the metric's all-reduce over the job, microseconds
    train = float(rows[-1]["wall_s"]) - evals[-1]
    assert summary["step_s"] == pytest.approx(train / summary["steps"])
    assert summary["step_s"] < summary["wall_s"] / summary["steps"]
    assert summary["step_s"] >= 0.050  # a batch's compute, and the all-reduce after it


@pytest.mark.slow  # real processes
def test_step_s_leaves_out_the_evaluations_on_the_wall_clock(tmp_path, run_benchmark):
    out = tmp_path / "wall"
    result = run_benchmark(
        "--algorithm", "dpsgd", "--task", "digits", "--nodes", "1", "--procs-per-node", "2", "--out", out,
        "--set", "wandb=false", "--set", "epochs=2", "--set", "evals_per_epoch=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows, summary = _read(out)
    evals = [float(r["eval_s"]) for r in rows]
    assert 0 < evals[0] and all(b > a for a, b in zip(evals, evals[1:]))  # each evaluation adds its time
    assert all(float(r["eval_s"]) < float(r["wall_s"]) for r in rows)
    last = rows[-1]
    assert summary["step_s"] == pytest.approx((float(last["wall_s"]) - float(last["eval_s"])) / summary["steps"])
