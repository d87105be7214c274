"""The workflow and the clocks' own settings: a matrix-wide default that a matrix's clock ignores is left
out of that matrix's runs, and a matrix's own key that its clock ignores stops the workflow before any job."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path: Path, matrix: dict) -> subprocess.CompletedProcess:
    """``snakemake -n -p`` on ``matrix``, in a copy of the workflow's sources under ``tmp_path``."""
    tmp_path.mkdir(parents=True)
    for name in ("Snakefile", "rules", "algorithms", "benchmarks", "analysis", "config"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    command = [sys.executable, "-m", "snakemake", "--configfile", "matrix.yaml", "-n", "-p"]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)


def _matrix(wall_set: dict[str, object]) -> dict[str, object]:
    """A wall-clock matrix and a simulated one under a top-level ``set`` with a key of each clock."""
    return {
        "suite": "t",
        "algorithms": ["allreduce"],
        "tasks": ["digits"],
        "nodes": [1],
        "procs_per_node": 2,
        "seeds": [0],
        "set": {"collective_timeout_s": 120, "sim_step_ms": 5, "epochs": 2},
        "matrices": [{"suite": "t-wall", "set": wall_set}, {"suite": "t-sim", "set": {"clock": "simulated"}}],
    }


def test_the_workflow_passes_each_run_the_defaults_its_clock_reads_and_refuses_a_matrix_key_it_ignores(tmp_path):
    planned = _dry_run(tmp_path / "ok", _matrix({}))
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    commands = {
        suite: next(
            line for line in planned.stdout.splitlines() if "-m benchmarks" in line and f"suite={suite}" in line
        )
        for suite in ("t-wall", "t-sim")
    }
    wall, sim = (set(re.findall(r"--set (\S+)", commands[s])) for s in ("t-wall", "t-sim"))
    assert {"collective_timeout_s=120", "epochs=2"} <= wall and not any(k.startswith("sim_") for k in wall)
    assert {"sim_step_ms=5", "epochs=2", "clock=simulated"} <= sim and not any("collective" in k for k in sim)

    refused = _dry_run(tmp_path / "bad", _matrix({"sim_network": "piz_daint"}))
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "--set sim_network: applies only to clock=simulated" in said
    assert "results/runs" not in refused.stdout  # stopped while planning: no job listed
