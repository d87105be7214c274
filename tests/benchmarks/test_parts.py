"""Evaluations within an epoch (``evals_per_epoch``): where they fall, that every family is cut at the
same batches, and that evaluating more often changes nothing of the training itself."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks.parts import EpochBatches, part_ends

RUN = ("--task", "digits", "--seed", "0", "--set", "epochs=2", "--set", "checkpoint_every=0")


def test_part_ends_split_an_epoch_as_evenly_as_whole_batches_allow():
    assert part_ends(22, 1) == [22]
    assert part_ends(22, 4) == [6, 11, 16, 22]  # 5.5 batches a part, rounded: 6, 5, 5, 6
    assert part_ends(10, 3) == [3, 7, 10]
    assert part_ends(3, 8) == [1, 2, 3], "never more parts than batches"


def test_parts_of_one_epoch_read_one_pass_in_order():
    data = EpochBatches(range(10))
    seen = [list(data.part(n)) for n in (3, 4, 3)]
    assert seen == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert len(data.part(4)) == 4


def rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "metrics.csv").open()))


@pytest.mark.parametrize(
    ("algorithm", "layout"),
    [
        ("ddp", ("--nodes", "2", "--procs-per-node", "2")),  # the stepped loop
        ("dana_dc", ("--nodes", "1", "--procs-per-node", "3")),  # a parameter server: the master serves a part
        ("lpp_sgd", ("--nodes", "1", "--procs-per-node", "2", "--set", "updaters=2")),  # updaters run a part's batches
    ],
)
def test_every_family_evaluates_at_the_same_batches(tmp_path, run_benchmark, algorithm, layout):
    out = tmp_path / "run"
    result = run_benchmark("--algorithm", algorithm, *layout, *RUN, "--set", "evals_per_epoch=4", "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    got = rows(out)
    steps = int(got[3]["step"])  # the first epoch's end
    fractions = [round(e / steps, 4) for e in part_ends(steps, 4)]
    assert [float(r["epoch"]) for r in got] == pytest.approx([*fractions[:3], 1, *(1 + f for f in fractions[:3]), 2])
    assert [int(r["step"]) for r in got] == [*part_ends(steps, 4), *(steps + e for e in part_ends(steps, 4))]
    assert all(float(a["wall_s"]) < float(b["wall_s"]) for a, b in zip(got, got[1:]))


def test_evaluating_more_often_leaves_the_training_as_it_was(tmp_path, run_benchmark):
    """DDP is deterministic: its epoch-end rows are the same with 1 and with 4 evaluations an epoch."""
    once, four = tmp_path / "once", tmp_path / "four"
    layout = ("--nodes", "1", "--procs-per-node", "2")
    for out, k in ((once, 1), (four, 4)):
        result = run_benchmark("--algorithm", "ddp", *layout, *RUN, "--set", f"evals_per_epoch={k}", "--out", out)
        assert result.returncode == 0, result.stderr[-3000:]
    got = rows(four)
    reached = next(i for i, r in enumerate(got) if float(r["val_metric"]) >= 0.95)  # digits' target
    summary = json.loads((four / "summary.json").read_text())
    before = float(got[reached - 1]["wall_s"]) if reached else 0.0
    assert summary["target_step_s"] == pytest.approx(float(got[reached]["wall_s"]) - before)
    ends = [r for r in got if float(r["epoch"]).is_integer()]
    for a, b in zip(rows(once), ends, strict=True):
        for column in ("epoch", "step", "samples", "train_loss", "val_loss", "val_metric", "lr", "sent_mb"):
            assert float(a[column]) == float(b[column]), column


def test_the_simulator_evaluates_within_epochs_without_changing_its_course(tmp_path, run_benchmark):
    once, twice = tmp_path / "once", tmp_path / "twice"
    sim = ("--algorithm", "dana_dc", "--nodes", "2", "--procs-per-node", "4", "--set", "clock=simulated")
    for out, k in ((once, 1), (twice, 2)):
        result = run_benchmark(*sim, *RUN, "--set", f"evals_per_epoch={k}", "--out", out)
        assert result.returncode == 0, result.stderr[-3000:]
    updates = int(rows(twice)[1]["step"])  # an epoch's master updates
    half = round(part_ends(updates, 2)[0] / updates, 4)
    assert [float(r["epoch"]) for r in rows(twice)] == pytest.approx([half, 1, 1 + half, 2])
    for a, b in zip(rows(once), rows(twice)[1::2], strict=True):  # gap and lag are since the last row
        for column in ("epoch", "step", "wall_s", "train_loss", "val_loss", "val_metric", "sent_mb"):
            assert float(a[column]) == float(b[column]), column


def test_evaluations_within_skipped_epochs_are_refused(run_benchmark, tmp_path):
    result = run_benchmark(
        "--algorithm", "ddp", *RUN, "--set", "evals_per_epoch=4", "--set", "eval_every=2", "--out", tmp_path / "r"
    )
    assert result.returncode == 2
    assert "set eval_every=1, or evals_per_epoch=1" in result.stderr


def test_a_run_stopped_at_a_part_end_resumes_to_the_uninterrupted_rows(tmp_path, repo_root, run_command):
    """With an evaluation after every batch, a SIGTERM lands at a part's end, before that part's
    evaluation: the resumed run evaluates there first, then goes on, and its rows are the
    uninterrupted run's (DDP on 2 ranks is bit-identical on resume)."""
    import subprocess

    from tests.distributed import stop_after_first_epoch

    args = ["--algorithm", "ddp", "--nodes", "1", "--procs-per-node", "2", *RUN, "--set", "evals_per_epoch=1000"]
    args += ["--set", "threads=1", "--set", "straggler=slow", "--set", "straggler_delay_ms=20"]

    def command(out: Path) -> list[str]:
        return [*run_command, *args, "--out", str(out)]

    def timeless(out: Path) -> list[list[str]]:
        return [[v for k, v in r.items() if k not in ("wall_s", "eval_s", "comm_s")] for r in rows(out)]

    whole = subprocess.run(command(tmp_path / "whole"), cwd=repo_root, capture_output=True, text=True, timeout=240)
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "stopped"
    code, output = stop_after_first_epoch(command(out), out, repo_root, deadline_s=180)
    assert code == 75, output[-3000:]
    assert 0 < json.loads((out / "summary.json").read_text())["steps"] < int(rows(tmp_path / "whole")[-1]["step"])
    resumed = subprocess.run(command(out), cwd=repo_root, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert timeless(out) == timeless(tmp_path / "whole")
