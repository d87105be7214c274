"""The forkserver runs a run exactly as ``python -m benchmarks.run`` would: the same files, the same
output on the client's own streams, the same exit code, and a stop signal reaches the run. Without
a server the client runs the run itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = ["--task", "digits", "--nodes", "1", "--procs-per-node", "2", "--seed", "0", "--defer-wandb"]


def client(socket_path: Path, *args: str, cwd: Path, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmarks.forkserver", "run", str(socket_path), *args]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.fixture
def server(tmp_path: Path, repo_root: Path):
    path = tmp_path / "forkserver.sock"
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.forkserver", "serve", str(path)], cwd=repo_root)
    deadline = time.monotonic() + 30
    while not path.exists():  # bound before its imports: a client from now on waits for them
        assert process.poll() is None and time.monotonic() < deadline, "the forkserver did not start"
        time.sleep(0.05)
    yield path
    process.terminate()
    assert process.wait(timeout=30) == 0
    assert not path.exists(), "the server leaves no socket behind"


def test_a_served_run_is_the_plain_run(server: Path, repo_root: Path, tmp_path: Path):
    bad = client(server, "--algorithm", "nope", *RUN, "--out", str(tmp_path / "bad"), cwd=repo_root)
    _, err = bad.communicate(timeout=120)
    assert bad.returncode == 2, err
    assert "unknown algorithm 'nope'" in err, "the run's stderr is the client's"

    out = tmp_path / "run"
    good = client(server, "--algorithm", "ddp", *RUN, "--set", "epochs=2", "--out", str(out), cwd=repo_root)
    stdout, err = good.communicate(timeout=120)
    assert good.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 2
    assert "completed" in stdout + err, "the run's progress reaches the client's streams"
    assert (out / "config.json").is_file() and (out / "metrics.csv").is_file()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "client-killed"])
def test_a_stop_signal_to_the_client_checkpoints_the_run(server: Path, repo_root: Path, tmp_path: Path, signum):
    """SIGTERM to the client reaches the run; a client that dies takes its run down with SIGTERM."""
    out = tmp_path / "run"
    args = ("--algorithm", "ddp", *RUN, "--set", "epochs=200", "--set", "checkpoint_every=0", "--out", str(out))
    run = client(server, *args, cwd=repo_root)
    deadline = time.monotonic() + 120
    while not (out / "metrics.csv").is_file() or len((out / "metrics.csv").read_text().splitlines()) < 2:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.05)
    run.send_signal(signum)
    _, err = run.communicate(timeout=120)
    if signum == signal.SIGTERM:
        assert run.returncode == 75, err  # EXIT_TIMEOUT: stopped with a checkpoint, as srun's signal would
    deadline = time.monotonic() + 120
    while not (out / "summary.json").is_file():
        assert time.monotonic() < deadline, "the run did not stop"
        time.sleep(0.05)
    assert json.loads((out / "summary.json").read_text())["status"] == "timeout"
    assert any((out / "checkpoint").iterdir()), "the run left its checkpoint, to resume from"


def test_without_a_server_the_client_runs_the_run_itself(repo_root: Path, tmp_path: Path):
    run = client(tmp_path / "absent.sock", "--algorithm", "nope", *RUN, "--out", str(tmp_path / "r"), cwd=repo_root)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2 and "unknown algorithm 'nope'" in err
