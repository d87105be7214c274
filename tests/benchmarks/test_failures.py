"""A failing rank ends the whole run as ``failed``, quickly, with no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
LONG = ["--task", "mnist1d", "--set", "epochs=500", "--set", "wandb=false"]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_for_training(out: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = out / "metrics.csv"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            return
        time.sleep(0.2)
    raise AssertionError("training never started")


def test_killing_one_rank_fails_the_run_and_leaves_no_process(tmp_path):
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--algorithm",
            "ddp",
            *LONG,
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_training(out)
        ranks = _children(launcher.pid)
        assert len(ranks) == 4
        os.kill(ranks[2], signal.SIGKILL)
        start = time.monotonic()
        launcher.wait(timeout=60)
        assert time.monotonic() - start < 60
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "rank 2" in summary["error"] and "SIGKILL" in summary["error"]
    time.sleep(0.5)
    assert not [pid for pid in ranks if _alive(pid)], "a rank outlived the run"


def test_a_hanging_collective_fails_after_the_timeout(tmp_path):
    """Two ranks joined as under torchrun; one freezes, the other gives up after the timeout."""
    out = tmp_path / "run"
    port = free_port()  # a port the OS gives: one derived from the pid collides between suites
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.run",
                    "--algorithm",
                    "allreduce",
                    *LONG,
                    "--nodes",
                    "1",
                    "--procs-per-node",
                    "2",
                    "--out",
                    str(out),
                    "--set",
                    "collective_timeout_s=10",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        _wait_for_training(out)
        os.kill(procs[1].pid, signal.SIGSTOP)  # a rank that hangs without dying
        start = time.monotonic()
        procs[0].wait(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode != 0 and elapsed < 60
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"]


# ---- a finished run stays finished -----------------------------------------------------------------

BIN = Path(sys.executable).parent
SHORT = ["--algorithm", "ddp", "--task", "digits", "--nodes", "1", "--procs-per-node", "2", "--seed", "1"]
SHORT += ["--set", "wandb=false", "--set", "epochs=1"]


@pytest.mark.parametrize(
    "how, crash",
    [
        ("local", "1:abort"),  # SIGABRT, as "terminate called without an active exception"
        ("local", "0:raise"),
        ("torchrun", "1:raise"),  # an exception: the rank still exits 0
        ("torchrun", "0:abort"),  # a signal: torchrun fails, the run's files do not change
    ],
)
def test_a_crash_after_the_summary_leaves_the_run_finished(tmp_path, how, crash):
    out = tmp_path / "run"
    start = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"] if how == "torchrun" else [sys.executable]
    result = subprocess.run(
        [*start, "-m", "benchmarks.run", *SHORT, "--out", str(out)],
        cwd=ROOT,
        env=dict(os.environ, DPB_CRASH_AFTER_SUMMARY=crash),
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_metric"] is not None, summary
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 2 and not (out / "checkpoint").exists()
    log = (out / "log.txt").read_text() + result.stderr
    if crash.endswith("raise"):
        assert result.returncode == 0, result.stderr[-3000:]
        assert "teardown failed after the run ended; the run stands" in log and "crash injected" in log
    elif how == "local":  # the launcher sees the abort, and the summary this launch wrote
        assert result.returncode == 0, result.stderr[-3000:]
        assert "rank 1 ended with signal SIGABRT after the run's summary was written" in log
    else:
        assert result.returncode != 0  # torchrun reports the signal; the Snakefile goes by the summary
    assert json.loads((out / "summary.json").read_text()) == summary
