"""The benchmark workflow: one job per run, then aggregate, tables, figures and the report.

    snakemake --cores all                                  # the embedded default (config/config.yaml)
    snakemake --cores all --configfile config/<paper>.yaml # another matrix
    snakemake -n                                           # dry run: lists every run

A run that fails still writes its summary.json (status failed), so it never stops the others and the
report shows it. The matrix is checked against config/schema.yaml, and every run's configuration is
resolved once here, so a bad name or --set key stops the workflow before any process starts.
"""

import re
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

sys.path.insert(0, workflow.basedir)
from benchmarks import config as run_config  # noqa: E402

if not config:  # a --configfile replaces the default matrix instead of being merged into it
    config.update(yaml.safe_load(open(Path(workflow.basedir) / "config/config.yaml")))
validate(config, schema="config/schema.yaml")

PY = sys.executable  # the interpreter running snakemake: the suite's environment, activated or not
MATRICES = run_config.matrices(config)  # one, or several under `matrices:` (one suite each)
BY_SUITE = {m["suite"]: m for m in MATRICES}
RUN = "results/runs/{suite}/{task}__{algorithm}__n{nodes}x{ppn}__s{seed}"
RUNS, FIGURES = [], []
for m in MATRICES:
    m["algorithms"] = run_config.available_algorithms(m["algorithms"])  # says in one line what it skips
    run_config.check_matrix(m["algorithms"], m["tasks"], m["nodes"], m["procs_per_node"], m["overrides"])
    RUNS += expand(RUN + "/summary.json", suite=m["suite"], task=m["tasks"], algorithm=m["algorithms"],
                   nodes=m["nodes"], ppn=m["procs_per_node"], seed=m["seeds"])
    FIGURES += expand("results/figures/{suite}__{task}__n{nodes}x{ppn}__metric_vs_time.{ext}", suite=m["suite"],
                      task=m["tasks"], nodes=m["nodes"], ppn=m["procs_per_node"], ext=["png", "svg"])


def sets(wildcards):
    """The run's --set options: the suite, and its matrix's overrides this algorithm and task know."""
    overrides = BY_SUITE[wildcards.suite]["overrides"]
    items = [f"suite={wildcards.suite}", *run_config.overrides_for(wildcards.algorithm, wildcards.task, overrides)]
    return " ".join(f"--set '{item}'" for item in items)


wildcard_constraints:
    suite="[a-z0-9_-]+",
    task="[a-z0-9_]+",
    algorithm="[a-z0-9_]+",
    nodes=r"\d+",
    ppn=r"\d+",
    seed=r"\d+",


# The analysis is seconds of pandas and matplotlib: on the submitting host, never a cluster job.
localrules: all, aggregate, tables, figures, report


rule all:
    default_target: True
    input:
        "results/report.html",


def simulated(wildcards) -> bool:
    """A run of a matrix with ``set: {clock: simulated}``: P logical workers in one process."""
    return BY_SUITE[wildcards.suite]["set"].get("clock") == "simulated"


EXIT_TIMEOUT = 75  # the runner stopped at a time limit and saved a checkpoint (benchmarks/dist.py)


def ranks(wildcards) -> int:
    """Processes a run starts: N x G, or one for a simulated run."""
    return 1 if simulated(wildcards) else int(wildcards.nodes) * int(wildcards.ppn)


def launcher(wildcards, resources) -> str:
    """The command prefix that starts a run's ranks: none (``launcher=local``: the runner spawns its
    N x G processes itself) or ``srun`` with the job's geometry (``launcher=srun``, the Slurm
    profiles). The geometry is spelled out because the Slurm plugin clears the job's SLURM_* task
    variables before the command runs, and srun no longer inherits --cpus-per-task from sbatch."""
    if resources.launcher == "local" or ranks(wildcards) == 1:
        return ""
    if resources.launcher != "srun":
        raise ValueError(f"resource ``launcher`` must be local or srun, got {resources.launcher!r}; "
                         "set it in the profile (set-resources: run: launcher: srun)")
    cpus = resources.get("cpus_per_task")
    return (f"srun --nodes={wildcards.nodes} --ntasks={ranks(wildcards)} --ntasks-per-node={wildcards.ppn}"
            + (f" --cpus-per-task={cpus}" if cpus else "") + " ")


rule run:
    output:
        RUN + "/summary.json",  # only the summary: Snakemake deletes a failed job's outputs, and the
        # checkpoint beside it in the run directory must survive a time limit
    log:
        "results/logs/{suite}/{task}__{algorithm}__n{nodes}x{ppn}__s{seed}.log",
    threads: ranks
    resources:
        # The Slurm allocation follows the run: N nodes x G tasks, or one task for a simulated run.
        # The plugin wants exactly one of tasks_per_node (> 1) and tasks, and `mpi` on multi-rank
        # jobs only, so that it neither wraps the command in `srun -n1` nor asks for one task.
        nodes=lambda wc: 1 if ranks(wc) == 1 else int(wc.nodes),
        tasks_per_node=lambda wc: int(wc.ppn) if ranks(wc) > 1 and int(wc.ppn) > 1 else 0,
        tasks=lambda wc: ranks(wc) if ranks(wc) > 1 and int(wc.ppn) == 1 else 0,
        mpi=lambda wc: "srun" if ranks(wc) > 1 else "",
        launcher="local",  # the Slurm profiles set srun
    params:
        sets=sets,
        launcher=launcher,
    # Exit codes of the runner: 0 done (completed or diverged), 1 failed with a failed summary (the
    # workflow goes on and the report shows it), 75 stopped at a time limit with a checkpoint: the
    # job fails, so that the next invocation re-runs it and the runner resumes.
    shell:
        "code=0; {params.launcher}{PY} -m benchmarks.run --algorithm {wildcards.algorithm}"
        " --task {wildcards.task} --nodes {wildcards.nodes} --procs-per-node {wildcards.ppn}"
        " --seed {wildcards.seed} --out $(dirname {output}) {params.sets} >> {log} 2>&1 || code=$?;"
        " if [ $code -eq {EXIT_TIMEOUT} ]; then echo 'stopped at the time limit with a checkpoint;"
        " run snakemake again to resume' >> {log}; exit $code; fi;"
        " [ $code -eq 0 ] || test -f {output}"


rule aggregate:
    input:
        RUNS,
    output:
        runs="results/tables/runs.csv",
        curves="results/tables/curves.csv",
    log:
        "results/logs/aggregate.log",
    shell:
        "{PY} -m analysis.aggregate --results results > {log} 2>&1"


report: "analysis/captions/workflow.rst"
# The report's groups, read from the runs themselves so they follow whatever matrix made RUNS.
ANALYSIS_GROUPS = sorted({tuple(re.match(r"results/runs/([^/]+)/(.+)__.+__n(\d+)x(\d+)__s\d+/", path).groups())
                          for path in RUNS})
ANALYSIS_TASKS = sorted({(suite, task) for suite, task, _, _ in ANALYSIS_GROUPS})


def figure_paths(kind, ext="png"):
    """The figure files of one kind that the analysis writes for this workflow's runs."""
    if kind in ("metric_vs_time", "traces"):
        return [f"results/figures/{s}__{t}__n{n}x{g}__{kind}.{ext}" for s, t, n, g in ANALYSIS_GROUPS]
    if kind in ("scaling", "stragglers"):
        return [f"results/figures/{s}__{t}__{kind}.{ext}" for s, t in ANALYSIS_TASKS]
    return [f"results/figures/{kind}.{ext}"]


FIGURE_KINDS = {"metric_vs_time": "Validation metric against wall time", "scaling": "Scaling across node counts",
                "stragglers": "Throughput with and without stragglers", "traces": "The algorithms' own traces",
                "performance_profile": "Performance profile"}


rule tables:
    input:
        rules.aggregate.output.runs,
    output:
        report("results/tables/time_to_target.csv", caption="analysis/captions/time_to_target.rst",
               category="Tables"),
        "results/tables/time_to_target.md",
        "results/tables/scaling.csv",
        "results/tables/performance_profile.csv",
        "results/tables/stragglers.csv",
        "results/tables/papers.csv",
    log:
        "results/logs/tables.log",
    shell:
        "{PY} -m analysis.tables --results results > {log} 2>&1"


rule figures:
    input:
        rules.aggregate.output,
    output:
        *[report(figure_paths(kind), caption=f"analysis/captions/{kind}.rst", category=title)
          for kind, title in FIGURE_KINDS.items()],
        *[path for kind in FIGURE_KINDS for path in figure_paths(kind, "svg")],
    log:
        "results/logs/figures.log",
    shell:
        "{PY} -m analysis.figures --results results > {log} 2>&1"


rule report:
    input:
        rules.tables.output,
        rules.figures.output,
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    shell:
        "{PY} -m analysis.report --results results > {log} 2>&1"
