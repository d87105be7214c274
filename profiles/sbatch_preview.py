"""Print the sbatch command a Slurm profile submits for each run of a matrix, without a cluster.

    python profiles/sbatch_preview.py --profile profiles/juwels --configfile config/daso.yaml
    python profiles/sbatch_preview.py --profile slurm --configfile config/wagma.yaml --run n16x4

Snakemake's dry run (``-n``) lists each job's resources but not the sbatch line: the Slurm plugin
builds that only when it submits. This script runs the dry run with the profile, reads each run's
resources from it, and hands them to the plugin's own ``get_submit_command`` and
``set_gres_string``, so the line printed is the one the plugin would submit (job name, log file
and account check aside: those need the cluster). Run it from the repository root.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string

JOB = re.compile(r"^rule run:\n(?P<body>(?:    .*\n)+)", re.M)


class _Resources(dict):
    """The plugin reads resources both as ``job.resources.get(k)`` and ``job.resources.k``."""

    def __getattr__(self, name: str) -> object:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _Job:
    def __init__(self, name: str, resources: dict[str, object]) -> None:
        self.name = name
        self.resources = _Resources(resources)
        self.threads = int(resources.get("_cores", 1))


def _value(text: str) -> object:
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def parse_dry_run(stdout: str) -> dict[str, dict[str, object]]:
    """Map each run's id (the run directory's name) to its resources, from ``snakemake -n`` output."""
    runs = {}
    for match in JOB.finditer(stdout):
        fields = dict(line.strip().split(": ", 1) for line in match["body"].splitlines() if ": " in line)
        run_id = Path(fields["output"]).parent.name
        pairs = re.split(r", (?=\w+=)", fields["resources"])
        runs[run_id] = {k: _value(v) for k, v in (pair.split("=", 1) for pair in pairs)}
    return runs


def sbatch_command(run_id: str, resources: dict[str, object]) -> str:
    """The plugin's sbatch line for one run (the account and partition as the profile gives them)."""
    account = resources.get("slurm_account")
    partition = resources.get("slurm_partition")
    params = {
        "run_uuid": "<run-uuid>",
        "slurm_logfile": f".snakemake/slurm_logs/rule_run/{run_id}/%j.log",
        "comment_str": f"rule_run_wildcards_{run_id}",
        "account": f"-A {account}" if account else "",
        "partition": f"-p {partition}" if partition else "",
        "workdir": "",
    }
    job = _Job("run", resources)
    return get_submit_command(job, params) + set_gres_string(job)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True, help="profile folder or name, as for snakemake")
    p.add_argument("--configfile", required=True, help="the matrix, e.g. config/daso.yaml")
    p.add_argument("--run", default="", help="show only runs whose id contains this text")
    args = p.parse_args(argv)
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", args.profile, "--configfile", args.configfile],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        print(result.stdout[-3000:] + result.stderr[-3000:], file=sys.stderr)
        print(f"error: the dry run with --profile {args.profile} failed (above)", file=sys.stderr)
        return 1
    runs = {k: v for k, v in sorted(parse_dry_run(result.stdout).items()) if args.run in k}
    if not runs:
        print(f"error: no run to submit matches {args.run!r} (already done, or a typo)", file=sys.stderr)
        return 1
    for run_id, resources in runs.items():
        print(
            f"{run_id}: nodes={resources.get('nodes')} tasks_per_node={resources.get('tasks_per_node')} "
            f"runtime={resources.get('runtime')} min\n  {sbatch_command(run_id, resources)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
