"""The cluster path without a cluster: profiles, Slurm resources per run, exit codes, JUWELS rendezvous.

The real submission through sbatch runs in CI (.ci/slurm_sweep.sh); here the dry runs show what each
profile would submit, a stand-in runner drives the rule's exit-code contract, and the bootstrap
reads fake srun environments.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import algorithms
from benchmarks import launcher, matrix

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "profiles"))
import sbatch_preview  # noqa: E402

# Matrices of the virtual cluster beside wagma-sim.yaml, which stands for them here (each resolves in
# tests/benchmarks/test_config.py::test_every_config_resolves_every_run, without Snakemake).
NOT_PAPERS = {
    "config.yaml",
    "mnist1d.yaml",
    "dana-sim.yaml",
    "daso-sim.yaml",
    "claims.yaml",
    "ci-slurm.yaml",
    "schema.yaml",
}
PAPERS = sorted(p.name for p in (ROOT / "config").glob("*.yaml") if p.name not in NOT_PAPERS)


def _workdir(tmp_path: Path) -> Path:
    """A copy of the workflow with its profiles (and the root's ``slurm`` link), results kept out."""
    for name in ("Snakefile", "rules", "algorithms", "benchmarks", "analysis", "config", "profiles", "slurm"):
        src = ROOT / name
        if src.is_symlink():
            (tmp_path / name).symlink_to(src.readlink())
        elif src.is_dir():
            shutil.copytree(src, tmp_path / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, tmp_path / name)
    return tmp_path


def _snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=workdir, capture_output=True, text=True, timeout=300, env=env
    )


def _shell_commands(dry_run: str) -> dict[str, str]:
    """Each run's shell command from ``snakemake -n -p`` output, by run id."""
    found = re.finditer(
        r"^(?:Shell command: )?(code=0; .*--out \$\(dirname results/runs/[^/]+/([^/]+)/summary.*)$", dry_run, re.M
    )
    return {m[2]: m[1] for m in found}


def test_slurm_profile_resolves_from_the_root_and_runs_ranks_with_srun(tmp_path):
    work = _workdir(tmp_path)
    result = _snakemake(work, "-n", "-p", "--profile", "slurm", "--configfile", "config/ci-slurm.yaml")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    ci = yaml.safe_load((ROOT / "config/ci-slurm.yaml").read_text())
    runs = sbatch_preview.parse_dry_run(result.stdout)
    assert set(runs) == {f"digits__{a}__n1x2__s0" for a in ci["algorithms"]}
    for run_id, resources in runs.items():
        assert (resources["nodes"], resources["tasks_per_node"], resources["mpi"], resources["launcher"]) == (
            1,
            2,
            "srun",
            "srun",
        ), run_id
        sbatch = sbatch_preview.sbatch_command(run_id, resources)
        assert "--nodes=1 --ntasks-per-node=2 --cpus-per-task=1" in sbatch and "--signal=USR1@600" in sbatch
    commands = _shell_commands(result.stdout)
    assert set(commands) == set(runs)
    for command in commands.values():
        assert command.startswith("code=0; srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 ")
    # Without a profile the same runs start their ranks themselves.
    local = _snakemake(work, "-n", "-p", "--configfile", "config/ci-slurm.yaml")
    assert local.returncode == 0, local.stderr[-2000:]
    commands = _shell_commands(local.stdout + local.stderr)
    assert len(commands) == 3 and not any("srun" in c for c in commands.values())


@pytest.mark.parametrize("paper", PAPERS)
def test_paper_matrix_dry_runs_under_the_juwels_profile(tmp_path, paper):
    """Every run of the paper's matrix asks for its node count; GPU runs for 4 GPUs and one task each."""
    work = _workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(SBATCH_ACCOUNT="paperbudget", SBATCH_PARTITION="booster")
    result = _snakemake(work, "-n", "-p", "--profile", "profiles/juwels", "--configfile", f"config/{paper}", env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    runs = sbatch_preview.parse_dry_run(result.stdout)
    commands = _shell_commands(result.stdout)
    assert set(commands) == set(runs)
    expected = {}
    for m in matrix.matrices(yaml.safe_load((ROOT / "config" / paper).read_text())):
        names = [a for a in m["algorithms"] if algorithms.get(a).unavailable() is None]
        simulated = m["set"].get("clock") == "simulated"
        for t in m["tasks"]:
            for a in names:
                for n in m["nodes"]:
                    for s in m["seeds"]:
                        expected[f"{t}__{a}__n{n}x{m['procs_per_node']}__s{s}"] = (n, m["procs_per_node"], simulated)
    assert set(runs) == set(expected)
    for run_id, (n, ppn, simulated) in expected.items():
        sbatch = sbatch_preview.sbatch_command(run_id, runs[run_id])
        assert "-A paperbudget -p booster" in sbatch and "--gres=gpu:4 " in sbatch + " "
        assert "--cpus-per-task=12" in sbatch and "--signal=USR1@600" in sbatch and "--mem" not in sbatch
        if simulated:  # P logical workers in one process: one task, no srun
            assert "--nodes=1 " in sbatch and "--ntasks" not in sbatch, sbatch
            assert "srun" not in commands[run_id]
        else:
            assert f"--nodes={n} --ntasks-per-node={ppn} " in sbatch, sbatch
            assert commands[run_id].startswith(f"code=0; srun --nodes={n} --ntasks={n * ppn} --ntasks-per-node={ppn}")
    largest = max(expected, key=lambda r: expected[r][0])
    print(f"{paper}: {len(expected)} runs; {largest}:\n  {sbatch_preview.sbatch_command(largest, runs[largest])}")


FAKE_RUNNER = '''
"""Stand-in for benchmarks.run: ddp stops at a time limit once, then resumes; allreduce fails."""
import argparse, json, sys
from pathlib import Path

def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--algorithm"); p.add_argument("--out", type=Path)
    args, _ = p.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "summary.json"
    checkpoint = args.out / "checkpoint.pt"
    if args.algorithm == "allreduce":
        summary.write_text(json.dumps({"status": "failed", "error": "rank 1 ended with exit code 1"}))
        return 1
    if checkpoint.exists():
        summary.write_text(json.dumps({"status": "completed", "resumed_from": checkpoint.read_text()}))
        return 0
    checkpoint.write_text("epoch 3")
    summary.write_text(json.dumps({"status": "timeout"}))
    return 75


if __name__ == "__main__":
    sys.exit(main())
'''


def test_time_limit_fails_the_job_keeps_the_checkpoint_and_the_next_invocation_resumes(tmp_path):
    work = _workdir(tmp_path)
    (work / "benchmarks/run.py").write_text(FAKE_RUNNER)
    (work / "matrix.yaml").write_text(
        yaml.safe_dump(
            {
                "suite": "t",
                "algorithms": ["ddp", "allreduce"],
                "tasks": ["digits"],
                "nodes": [1],
                "procs_per_node": 2,
                "seeds": [0],
            }
        )
    )
    runs = work / "results/runs/t"
    targets = [f"results/runs/t/digits__{a}__n1x2__s0/summary.json" for a in ("ddp", "allreduce")]
    first = _snakemake(work, *targets, "--cores", "2", "--profile", "profiles/local", "--configfile", "matrix.yaml")
    assert first.returncode != 0  # the timed-out run fails its job...
    ddp = runs / "digits__ddp__n1x2__s0"
    assert not (ddp / "summary.json").exists()  # ...Snakemake removes its output...
    assert (ddp / "checkpoint.pt").read_text() == "epoch 3"  # ...but not the checkpoint beside it
    assert "stopped at the time limit" in (work / "results/logs/t/digits__ddp__n1x2__s0.log").read_text()
    failed = json.loads((runs / "digits__allreduce__n1x2__s0/summary.json").read_text())
    assert failed["status"] == "failed"  # exit 1 with a summary: done, the report shows it
    second = _snakemake(work, *targets, "--cores", "2", "--profile", "profiles/local", "--configfile", "matrix.yaml")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    resumed = json.loads((ddp / "summary.json").read_text())
    assert resumed == {"status": "completed", "resumed_from": "epoch 3"}


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("jwb[0042-0045,0050]", "jwb0042"),
        ("jwb0042,jwb0043", "jwb0042"),
        ("jwc01n[001-003]", "jwc01n001"),
        ("node[7,9]-ib", "node7-ib"),
        ("localhost", "localhost"),
        ("", ""),
    ],
)
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert launcher.first_host(nodelist) == first


def _srun_env(monkeypatch, nodelist: str, **extra: str) -> None:
    """The variables srun sets in a task of step 0 of job 77 (rank 1 of 8), nothing else of launchers."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "OMPI_", "PMI_", "HOROVOD_", "DPB_")) or key in (
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "SYSTEMNAME",
        ):
            monkeypatch.delenv(key)
    for key, value in dict(
        SLURM_PROCID="1",
        SLURM_NTASKS="8",
        SLURM_STEP_ID="0",
        SLURM_JOB_ID="77",
        SLURM_STEP_NODELIST=nodelist,
        SLURM_JOB_NODELIST=nodelist,
        **extra,
    ).items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize(
    ("nodelist", "extra", "addr"),
    [
        ("jwb[0042-0043]", {}, "jwb0042i"),  # a JUWELS Booster node: its InfiniBand name
        ("node[1-2]", {"SYSTEMNAME": "juwelsbooster"}, "node1i"),  # JSC's system name says JUWELS
        ("jwb[0042-0043]", {"DPB_MASTER_SUFFIX": ""}, "jwb0042"),  # the variable wins, even empty
        ("node[1-2]", {}, "node1"),  # elsewhere the plain first host
        ("node[1-2]", {"DPB_MASTER_SUFFIX": "-ib"}, "node1-ib"),
        ("jwb[0042-0043]", {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}, "10.0.0.5"),
    ],
)
def test_srun_rendezvous_address(monkeypatch, nodelist, extra, addr):
    _srun_env(monkeypatch, nodelist, **extra)
    launch = launcher.detect()
    assert (launch.launcher, launch.rank, launch.world_size, launch.slurm_job_id) == ("srun", 1, 8, "77")
    assert launch.master_addr == addr
    if "MASTER_PORT" not in extra:  # from the job and step ids, the same on every rank of the step
        assert launch.master_port == 20000 + (77 * 16 + 0) % 40000
