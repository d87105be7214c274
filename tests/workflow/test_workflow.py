"""The Snakefile: the dry run lists every run, a bad matrix stops before any job, a tiny sweep reports."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _workdir(tmp_path: Path, matrix: dict) -> Path:
    """A copy of the workflow's sources in ``tmp_path`` so the test's results stay out of the repo."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "rules", "algorithms", "benchmarks", "analysis", "config"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    return tmp_path


def _snakemake(workdir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SNAKEMAKE, "--configfile", "matrix.yaml", *args], cwd=workdir, capture_output=True, text=True, timeout=timeout
    )


def test_default_dry_run_lists_every_run(tmp_path):
    matrix = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    result = _snakemake(_workdir(tmp_path, matrix), "-n")
    assert result.returncode == 0, result.stderr
    expected = {
        f"results/runs/{matrix['suite']}/{t}__{a}__n{n}x{matrix['procs_per_node']}__s{s}/summary.json"
        for t in matrix["tasks"]
        for a in matrix["algorithms"]
        for n in matrix["nodes"]
        for s in matrix["seeds"]
    }
    listed = set(re.findall(r"results/runs/\S+/summary\.json", result.stdout))
    assert expected <= listed
    claims = sum(  # and the claims' sub-matrices
        len(m["algorithms"]) * len(m["nodes"]) * len(m["seeds"]) for m in matrix["matrices"] if "algorithms" in m
    )
    assert re.search(rf"^run\s+{len(expected) + claims}$", result.stdout, re.M)


def test_analysis_rules_name_their_files_and_the_report_only_renders(tmp_path):
    matrix = {
        "suite": "t",
        "algorithms": ["ddp", "allreduce"],
        "tasks": ["digits"],
        "nodes": [1, 2],
        "procs_per_node": 2,
        "seeds": [0],
    }
    result = _snakemake(_workdir(tmp_path, matrix), "-n", "-p")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    commands = {
        rule: next(line for line in result.stdout.splitlines() if f"-m analysis.{rule} " in line)
        for rule in ("tables", "figures", "report")
    }
    assert all("--results" not in command for command in commands.values())
    assert "--runs results/tables/runs.csv" in commands["tables"]
    assert (
        "--render-only" in commands["report"]
        and "--time-to-target results/tables/time_to_target.csv" in commands["report"]
    )
    from analysis import artefacts

    for entry in artefacts.TABLES:  # every table of the registry, made by the tables rule where the registry says
        assert f"{artefacts.option(entry.name)} results/{entry.file}" in commands["tables"], entry.name
    for name in artefacts.report_reads():
        assert f"{artefacts.option(name)} results/{artefacts.BY_TABLE[name].file}" in commands["report"], name
    layouts = [("t", "digits", n, 2) for n in (1, 2)]
    expected = {
        f"results/figures/{name}"
        for kind in artefacts.BY_FIGURE
        for name in artefacts.figure_files(kind, layouts, "png")
    }
    assert set(re.findall(r"results/figures/\S+\.png", commands["report"])) == expected


def test_bad_matrix_stops_before_any_job(tmp_path):
    matrix = {
        "suite": "t",
        "algorithms": ["ddp", "nope"],
        "tasks": ["digits"],
        "nodes": [1],
        "procs_per_node": 2,
        "seeds": [0],
    }
    result = _snakemake(_workdir(tmp_path, matrix), "-n")
    assert result.returncode != 0 and "unknown algorithm 'nope'" in result.stdout + result.stderr
    extra = dict(matrix, algorithms=["ddp"], colour="red")
    result = _snakemake(_workdir(tmp_path / "b", extra), "-n")
    assert result.returncode != 0 and "colour" in result.stdout + result.stderr
    # a misspelt key or a misspelt setting: one line with the fix, no schema dump, no traceback
    typo = {k: v for k, v in matrix.items() if k != "seeds"} | {"algorithms": ["ddp"], "seed": [0]}
    setting = dict(matrix, algorithms=["ddp"], set={"clock": "simulated", "sim_netwrok": "piz_daint"})
    for name, bad, expected in (("c", typo, "did you mean 'seeds'?"), ("d", setting, "did you mean 'sim_network'?")):
        result = _snakemake(_workdir(tmp_path / name, bad), "-n")
        output = result.stdout + result.stderr
        assert result.returncode != 0 and expected in output, output[-2000:]
        assert "Traceback" not in output and "properties" not in output and "File " not in output, output[-2000:]


def test_tiny_sweep_ends_in_a_report_with_a_failed_run(tmp_path):
    matrix = {
        "suite": "tiny",
        "algorithms": ["ddp", "allreduce"],
        "tasks": ["digits"],
        "nodes": [1],
        "procs_per_node": 2,
        "seeds": [0],
        "set": {"epochs": 3, "wandb": False},
    }
    work = _workdir(tmp_path, matrix)
    # A run directory that crashed before: its rank died, the launcher recorded the failure.
    failed = work / "results/runs/tiny/digits__allreduce__n1x2__s0"
    failed.mkdir(parents=True)
    (failed / "summary.json").write_text(
        json.dumps(
            {
                "status": "failed",
                "suite": "tiny",
                "run_id": failed.name,
                "algorithm": "allreduce",
                "task": "digits",
                "nodes": 1,
                "procs_per_node": 2,
                "world_size": 2,
                "seed": 0,
                "time_to_target_s": None,
                "error": "rank 1 ended with signal SIGKILL",
                "metric": "accuracy",
                "target": 0.95,
            }
        )
    )
    result = _snakemake(work, "--cores", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ddp = json.loads((work / "results/runs/tiny/digits__ddp__n1x2__s0/summary.json").read_text())
    assert ddp["status"] == "completed"
    html = (work / "results/report.html").read_text()
    assert "digits__allreduce__n1x2__s0" in html and "SIGKILL" in html
    assert re.search(r"The workflow's last invocation took \d+\.\d minutes to this report", html)
    assert (work / "results/tables/time_to_target.md").exists()
    assert (work / "results/figures/tiny__digits__n1x2__metric_vs_time.png").stat().st_size > 1000
    # Results carried to another checkout: no .snakemake/, the report rebuilt by hand. Another matrix's
    # dry run still lists each of its missing runs, and the rebuilt report keeps the workflow's duration.
    took = float(re.search(r"last invocation took (\d+\.\d) minutes", html).group(1))
    shutil.rmtree(work / ".snakemake")
    rebuilt = subprocess.run([sys.executable, "-m", "analysis.report"], cwd=work, capture_output=True, text=True)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    again = float(re.search(r"last invocation took (\d+\.\d) minutes", (work / "results/report.html").read_text())[1])
    assert abs(again - took) <= 0.2  # to the workflow's end, not to the rebuild
    (work / "other.yaml").write_text(yaml.safe_dump(dict(matrix, suite="other", algorithms=["ddp"])))
    planned = subprocess.run(
        [*SNAKEMAKE, "-n", "--configfile", "other.yaml"], cwd=work, capture_output=True, text=True, timeout=600
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "results/runs/other/digits__ddp__n1x2__s0/summary.json" in planned.stdout, planned.stdout[-3000:]


def test_daso_paper_matrix_dry_run_lists_every_run(tmp_path):
    matrix = yaml.safe_load((ROOT / "config/daso.yaml").read_text())
    result = _snakemake(_workdir(tmp_path, matrix), "-n", "-p")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    listed = set(re.findall(r"results/runs/daso-imagenet/(\S+)/summary\.json", result.stdout))
    import algorithms

    runnable = [a for a in matrix["algorithms"] if algorithms.get(a).unavailable() is None]
    expected = {f"imagenet_resnet50__{a}__n{n}x4__s0" for a in runnable for n in matrix["nodes"]}
    assert listed == expected
    # DASO's knobs go to the DASO runs only, Horovod's to Horovod's.
    assert "max_global_skips" not in _run_command(result.stdout, "ddp", "daso-imagenet")
    assert "max_global_skips=4" in _run_command(result.stdout, "daso", "daso-imagenet")


def _run_command(dry_run: str, algorithm: str, suite: str) -> str:
    """The dry run's command of a run of ``algorithm`` in ``suite`` (jobs are listed in no fixed order)."""
    return next(
        line for line in dry_run.splitlines() if f"--algorithm {algorithm} " in line and f"--set suite={suite} " in line
    )


def test_wagma_paper_matrix_dry_run_lists_every_run(tmp_path):
    matrix = yaml.safe_load((ROOT / "config/wagma.yaml").read_text())
    result = _snakemake(_workdir(tmp_path, matrix), "-n", "-p")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    listed = set(re.findall(r"results/runs/wagma-imagenet/(\S+)/summary\.json", result.stdout))
    assert listed == {f"imagenet_resnet50__{a}__n{n}x4__s0" for a in matrix["algorithms"] for n in matrix["nodes"]}
    assert "straggler_delay_ms=320" in _run_command(result.stdout, "allreduce", "wagma-imagenet")
    assert "global_period=10" in _run_command(result.stdout, "wagma", "wagma-imagenet")
    assert "period=1" in _run_command(result.stdout, "local_sgd", "wagma-imagenet")
    assert "global_period=8" in _run_command(result.stdout, "wagma", "wagma-rl")


# -- a controller killed, then the same command again -------------------------------------------------

KILLED = {
    "suite": "k", "algorithms": ["ddp", "local_sgd"], "tasks": ["digits"], "nodes": [1], "procs_per_node": 2,
    "seeds": [0, 1], "set": {"epochs": 4, "checkpoint_every": 0, "wandb": False},
}  # fmt: skip


def _start(workdir: Path) -> subprocess.Popen:
    command = [*SNAKEMAKE, "--cores", "1", "--configfile", "matrix.yaml"]
    return subprocess.Popen(command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_killed_controller_is_continued_by_the_same_command_and_no_finished_run_trains_twice(tmp_path):
    """SIGKILL to snakemake once a run has finished and the next is under way; the same command
    again: the stale lock is cleared with a line, the finished run is kept as it was (summary and
    log untouched), the interrupted one ends once, and every run finishes."""
    workdir = _workdir(tmp_path, KILLED)
    runs = workdir / "results/runs/k"
    first = _start(workdir)
    _wait_for(lambda: len(list(runs.glob("*/summary.json"))) >= 1 and len(list(runs.glob("*/log.txt"))) >= 2,
              "one finished run and one under way")  # fmt: skip
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    done = {p.parent: (p.stat().st_mtime_ns, (p.parent / "log.txt").read_text()) for p in runs.glob("*/summary.json")}
    result = _snakemake(workdir, "--cores", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "cleared the lock of a snakemake that no longer runs here" in result.stderr
    for run_dir, (mtime, log) in done.items():
        assert (run_dir / "summary.json").stat().st_mtime_ns == mtime, run_dir
        assert (run_dir / "log.txt").read_text() == log, run_dir
    summaries = sorted(runs.glob("*/summary.json"))
    assert len(summaries) == 4 and all(json.loads(p.read_text())["status"] == "completed" for p in summaries)
    for run_dir in runs.iterdir():  # each log holds one run; an attempt that started again keeps its own
        assert (run_dir / "log.txt").read_text().count(" completed") == 1, run_dir


def test_a_second_controller_on_the_same_directory_refuses_before_writing(tmp_path):
    workdir = _workdir(tmp_path, KILLED)
    first = _start(workdir)
    try:
        _wait_for(lambda: any((workdir / "results/runs/k").glob("*/log.txt")), "the first run to start")
        second = _snakemake(workdir, "--cores", "1", timeout=120)
        said = second.stderr + second.stdout
        assert second.returncode != 0 and "another snakemake is running this workflow" in said
        assert "Building DAG" not in said and "rule run" not in said  # it stopped before planning a job
        assert _snakemake(workdir, "-n").returncode == 0  # a dry run takes nothing over: it still lists
    finally:
        first.terminate()
        first.wait(timeout=120)


def test_a_finished_runs_summary_removed_by_a_restarted_workflow_is_put_back(tmp_path, capsys):
    """A restarted controller reruns a run it found marked incomplete, and Snakemake deletes that job's
    output (summary.json) first, possibly after the run has finished without it: the run's start
    under the workflow (``--keep-finished``) puts the summary back from its own copy and keeps the run."""
    from benchmarks import rundir

    out = tmp_path / "run"
    out.mkdir()
    finished = {"status": "completed", "run_id": "r", "wall_s": 1.5}
    rundir.put_summary(out, finished)
    (out / "log.txt").write_text("12:00:00 completed: {}\n")
    (out / "summary.json").unlink()  # what Snakemake does before the job runs again
    assert rundir.take(out, owner=False, keep_finished=True) is True
    assert json.loads((out / "summary.json").read_text()) == finished
    assert (out / "log.txt").read_text() == "12:00:00 completed: {}\n" and not (out / "log.1.txt").exists()
    assert "put back" in capsys.readouterr().out

    # A run stopped at a time limit has no finished copy: it resumes (here, by hand, it is not refused).
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    rundir.put_summary(stopped, {"status": "timeout"})
    assert not (stopped / rundir.FINISHED_COPY).exists()
    assert rundir.take(stopped, owner=False, keep_finished=True) is False
