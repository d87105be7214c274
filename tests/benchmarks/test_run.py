"""The run entry point end to end: the four files, the errors that name the fix, --list."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import time
from pathlib import Path

import pytest

from benchmarks.tasks import digits

ROOT = Path(__file__).resolve().parents[2]


def test_ddp_on_digits_writes_the_four_files(tmp_path, run_benchmark):
    out = tmp_path / "run"
    result = run_benchmark(
        "--algorithm",
        "ddp",
        "--task",
        "digits",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--seed",
        "0",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    for name in ("config.json", "env.json", "metrics.csv", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["time_to_target_s"] is not None and summary["time_to_target_s"] <= summary["wall_s"]
    assert summary["best_metric"] >= 0.95 and summary["world_size"] == 4
    env = json.loads((out / "env.json").read_text())
    assert env["backend"] == "gloo" and env["launcher"] == "local" and len(env["hosts_by_rank"]) == 4
    # the installed versions, though the ranks never import wandb or torchvision
    assert env["wandb"] == importlib.metadata.version("wandb")
    assert env["torchvision"] == importlib.metadata.version("torchvision")
    rows = (out / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,step,samples,wall_s,eval_s,train_loss,val_loss,val_metric,lr,comm_s")
    assert len(rows) == 1 + json.loads((out / "config.json").read_text())["hparams"]["epochs"]
    # Bytes sent: rank 0's parameters broadcast to 3 ranks at the start (3/4 of them a rank), then DDP's
    # buckets all-reduced every step (2(p-1)/p = 3/2 of them a rank): per row, at its step count.
    n = sum(p.numel() * 4 for p in digits.make_model().parameters())
    for row in csv.DictReader(rows):
        assert float(row["sent_mb"]) == pytest.approx((0.75 + 1.5 * int(row["step"])) * n / 1e6, rel=1e-9)
    reached = next(r for r in csv.DictReader(rows) if float(r["val_metric"]) >= 0.95)
    assert summary["sent_mb_to_target"] == float(reached["sent_mb"]) and summary["sent_mb"] == float(row["sent_mb"])
    assert list((out / "wandb").glob("offline-run-*")), "wandb should log offline inside the run directory"
    # A finished run directory is never overwritten.
    again = run_benchmark("--algorithm", "ddp", "--task", "digits", "--out", str(out))
    assert again.returncode == 2 and "already holds a finished run" in again.stderr


def test_allreduce_records_communication_time(tmp_path, run_benchmark):
    out = tmp_path / "run"
    result = run_benchmark(
        "--algorithm",
        "allreduce",
        "--task",
        "digits",
        "--nodes",
        "1",
        "--procs-per-node",
        "2",
        "--out",
        str(out),
        "--set",
        "wandb=false",
        "--set",
        "epochs=4",
        "--set",
        "lr=0.1",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["hparams"]["epochs"] == 4 and config["hparams"]["lr"] == 0.1
    assert summary["epochs"] == 4 and 0 < summary["comm_share"] < 1
    assert not (out / "wandb").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--algorithm", "ddpp", "--task", "digits"], "unknown algorithm 'ddpp'. Did you mean 'ddp'?"),
        (["--algorithm", "ddp", "--task", "digit"], "unknown task 'digit'. Did you mean 'digits'?"),
        (["--algorithm", "ddp", "--task", "digits", "--set", "learning_rate=0.1"], "--set learning_rate: unknown key"),
        (["--algorithm", "ddp", "--task", "digits", "--set", "epochs=ten"], "``epochs`` must be int"),
        (["--algorithm", "ddp", "--task", "digits", "--set", "bucket_cap_mb=big"], "``bucket_cap_mb`` must be float"),
        (["--algorithm", "ddp", "--task", "cifar10_resnet20"], "--set data_root=DIR"),
        (
            ["--algorithm", "ddp", "--task", "cifar10_resnet20", "--set", "data_root=/nonexistent"],
            "--set data_root=DIR",
        ),
        (["--algorithm", "ddp", "--task", "digits", "--nodes", "0"], "--nodes must be a positive integer"),
        # a setting the run's clock ignores
        (
            ["--algorithm", "ddp", "--task", "digits", "--nodes", "1", "--procs-per-node", "2", "--seed", "0"]
            + ["--set", "sim_network=juwels_booster"],
            "--set sim_network: applies only to clock=simulated, and this run's clock is wall (the default), "
            "which ignores it; add --set clock=simulated, or leave sim_network out",
        ),
        (
            ["--algorithm", "allreduce", "--task", "digits", "--set", "clock=simulated"]
            + ["--set", "collective_timeout_s=60"],
            "--set collective_timeout_s: applies only to clock=wall",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(tmp_path, args, expected, run_benchmark):
    out = tmp_path / "never"
    start = time.monotonic()
    result = run_benchmark(*args, "--out", str(out), timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0]
    assert not out.exists(), "no run directory (and no process) before the input is valid"
    assert time.monotonic() - start < 30


def test_list_names_every_algorithm_and_task(run_benchmark):
    import algorithms
    from benchmarks import tasks

    result = run_benchmark("--list", timeout=60)
    assert result.returncode == 0
    for name in algorithms.names() + tasks.names():
        assert f"  {name} " in result.stdout
    assert "bucket_cap_mb=25.0" in result.stdout and "batch_size=" in result.stdout
