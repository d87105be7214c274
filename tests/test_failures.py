"""A failing rank ends the whole run as ``failed``, quickly, with no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
    port = 29000 + os.getpid() % 1000
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
