"""Check a finished sweep through Slurm: every run went through sbatch and srun, and is reported.

    python .ci/slurm/check_sweep.py --workdir DIR --configfile config/ci-slurm.yaml --since 2026-11-21T23:50:00

For each run of the matrix: its summary says completed; the aggregate table (results/tables/runs.csv)
lists it with launcher ``srun`` and a Slurm job id; in ``sacct`` that job is a Snakemake ``run`` job
(its comment names the rule) with a step of NTasks = nodes x procs_per_node that completed; it was
trained once (its log.txt ends one training, and no earlier attempt's log.N.txt is beside it: the
sweep kills its first controller mid-run and runs the command again); and the report shows the suite and each algorithm. Prints the sacct lines of the sweep. Exits 1 on the first
missing piece, with a line that says which.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ENDED = re.compile(r"^\d\d:\d\d:\d\d (completed|diverged|failed)\b", re.MULTILINE)  # the runner's last line
SACCT_FIELDS = ("JobID", "JobName", "NTasks", "State", "ExitCode", "Elapsed", "Comment")


def expected_runs(matrix: dict) -> dict[str, int]:
    """Each run id of a one-suite matrix, with its rank count."""
    return {
        f"{t}__{a}__n{n}x{matrix['procs_per_node']}__s{s}": n * matrix["procs_per_node"]
        for t in matrix["tasks"]
        for a in matrix["algorithms"]
        for n in matrix["nodes"]
        for s in matrix["seeds"]
    }


def sacct_rows(since: str) -> list[dict[str, str]]:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-S", since, "-o", ",".join(SACCT_FIELDS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [dict(zip(SACCT_FIELDS, line.split("|", len(SACCT_FIELDS) - 1))) for line in out.splitlines() if line]


def check(workdir: Path, matrix: dict, since: str) -> list[str]:
    """The problems found (empty when the sweep is as it should be)."""
    suite, problems = matrix["suite"], []
    rows = sacct_rows(since)
    print("sacct (" + " | ".join(SACCT_FIELDS) + "):")
    for row in rows:
        print("  " + " | ".join(row[f] for f in SACCT_FIELDS))
    jobs = {row["JobID"]: row for row in rows}
    table = workdir / "results/tables/runs.csv"
    listed = {r["run_id"]: r for r in csv.DictReader(table.open()) if r["suite"] == suite} if table.exists() else {}
    for run_id, ranks in expected_runs(matrix).items():
        summary_path = workdir / "results/runs" / suite / run_id / "summary.json"
        if not summary_path.exists():
            problems.append(f"{run_id}: no summary.json")
            continue
        status = json.loads(summary_path.read_text())["status"]
        if status != "completed":
            problems.append(f"{run_id}: status {status}, expected completed")
        run_dir = summary_path.parent
        trainings = len(ENDED.findall((run_dir / "log.txt").read_text())) if (run_dir / "log.txt").exists() else 0
        earlier = sorted(p.name for p in run_dir.glob("log.*.txt"))
        if trainings != 1 or earlier:
            problems.append(f"{run_id}: trained {trainings} times in log.txt, earlier logs {earlier}: expected once")
        row = listed.get(run_id)
        if row is None:
            problems.append(f"{run_id}: missing from {table.relative_to(workdir)}")
            continue
        if row["launcher"] != "srun":
            problems.append(f"{run_id}: launcher {row['launcher']!r}, expected srun")
        job_id = str(row["slurm_job_id"]).removesuffix(".0")
        job = jobs.get(job_id)
        if job is None or not job["Comment"].startswith("rule_run"):
            problems.append(f"{run_id}: Slurm job {job_id!r} is not a Snakemake run job in sacct")
            continue
        steps = [r for r in rows if r["JobID"].startswith(f"{job_id}.") and r["JobName"] not in ("batch", "extern")]
        if not any(r["NTasks"] == str(ranks) and r["State"] == "COMPLETED" for r in steps):
            problems.append(f"{run_id}: job {job_id} has no completed srun step with NTasks={ranks}: {steps}")
    report = workdir / "results/report.html"
    if not report.exists():
        problems.append("results/report.html is missing")
    else:
        text = html.unescape(report.read_text())
        missing = [a for a in matrix["algorithms"] if f"<td>{a}</td>" not in text]
        if suite not in text or missing:
            problems.append(f"the report lacks suite {suite!r} or the rows of {missing}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, required=True, help="where snakemake ran")
    p.add_argument("--configfile", type=Path, required=True, help="the sweep's matrix (one suite)")
    p.add_argument("--since", required=True, help="sacct start time of the sweep, YYYY-MM-DDTHH:MM:SS")
    args = p.parse_args(argv)
    matrix = yaml.safe_load(args.configfile.read_text())
    problems = check(args.workdir, matrix, args.since)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(
            f"ok: {len(expected_runs(matrix))} runs of suite {matrix['suite']} went through sbatch and srun "
            "and are in the report"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
