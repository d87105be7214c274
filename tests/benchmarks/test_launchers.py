"""The runner joins jobs started by torchrun, mpirun and srun, and gets the same result from each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUN = [
    "-m",
    "benchmarks.run",
    "--algorithm",
    "ddp",
    "--task",
    "digits",
    "--nodes",
    "1",
    "--procs-per-node",
    "2",
    "--seed",
    "1",
    "--set",
    "wandb=false",
    "--set",
    "epochs=2",
]


def _result(out: Path) -> tuple[str, dict]:
    env = json.loads((out / "env.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    return env["launcher"], summary


def _local(tmp_path: Path) -> dict:
    out = tmp_path / "local"
    subprocess.run([sys.executable, *RUN, "--out", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    return _result(out)[1]


def test_torchrun(tmp_path):
    out = tmp_path / "torchrun"
    subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *RUN, "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    launcher, summary = _result(out)
    assert launcher == "torchrun"
    assert summary["final_metric"] == _local(tmp_path)["final_metric"]


@pytest.mark.skipif(shutil.which("mpirun", path=str(BIN)) is None, reason="no mpirun in the environment")
def test_mpirun(tmp_path):
    out = tmp_path / "mpirun"
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    subprocess.run(
        [str(BIN / "mpirun"), "-n", "2", sys.executable, *RUN, "--out", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    launcher, summary = _result(out)
    assert launcher == "mpirun"
    assert summary["final_metric"] == _local(tmp_path)["final_metric"]


# Two MPI ranks end through ``launcher.exit_process``; rank 0 is still at work a second after
# MPI_Finalize (as a rank writing its files would be) when rank 1 has ended.
_SLOW_TEARDOWN = """
import sys, time
from pathlib import Path
from mpi4py import MPI
from benchmarks import launcher
rank = MPI.COMM_WORLD.Get_rank()
MPI.COMM_WORLD.Barrier()
MPI.Finalize()
if rank == 0:
    time.sleep(1.0)
    Path(sys.argv[1]).write_text("done")
launcher.exit_process(0)
"""


@pytest.mark.skipif(shutil.which("mpirun", path=str(BIN)) is None, reason="no mpirun in the environment")
def test_a_rank_still_at_work_when_another_has_ended_is_not_killed_by_mpirun(tmp_path):
    """MPICH ends a rank's process-manager connection in a C exit handler. A rank that skipped it
    looked crashed to hydra, which SIGKILLed every rank still running: here rank 0, before it wrote
    its file (hydra then reported 0 for it), and in the Horovod test a rank in its own exit, about
    once in 100 runs (exit code 9 for a finished job). ``exit_process`` runs the C library's exit
    handlers in a process that used MPI."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [str(BIN / "mpirun"), "-n", "2", sys.executable, "-c", _SLOW_TEARDOWN, str(tmp_path / "rank0")],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "rank0").read_text() == "done", "rank 0 was killed at work"


def test_srun_environment(tmp_path):
    """Two ranks with the variables srun sets inside a job step (as on a Slurm cluster)."""
    out = tmp_path / "srun"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "OMPI_", "PMI_"))}
    port = free_port()  # a port the OS gives: one derived from the pid collides between suites
    procs = [
        subprocess.Popen(
            [sys.executable, *RUN, "--out", str(out)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(
                base,
                SLURM_PROCID=str(r),
                SLURM_NTASKS="2",
                SLURM_LOCALID=str(r),
                SLURM_STEP_ID="0",
                SLURM_JOB_ID="4242",
                SLURM_JOB_NODELIST="localhost",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            ),
        )
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    launcher, _ = _result(out)
    env = json.loads((out / "env.json").read_text())
    assert launcher == "srun" and env["slurm_job_id"] == "4242"


def test_nan_loss_ends_the_run_as_diverged(tmp_path):
    out = tmp_path / "nan"
    result = subprocess.run(
        [sys.executable, *RUN[:-2], "--set", "epochs=5", "--set", "lr=1e6", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["epochs"] < 5 and summary["time_to_target_s"] is None


def test_default_config_runs_every_registered_algorithm():
    import yaml

    import algorithms

    matrix = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert sorted(matrix["algorithms"]) == sorted(algorithms.names())
