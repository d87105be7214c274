"""The benchmark workflow: one job per run, then aggregate, tables, figures and the report.

    snakemake --cores all                                  # the embedded default (config/config.yaml)
    snakemake --cores all --configfile config/<paper>.yaml # another matrix
    snakemake -n                                           # dry run: lists every run

A run that fails still writes its summary.json (status failed), so it never stops the others and the
report shows it. The matrix is checked against config/schema.yaml, and every run's configuration is
resolved once here, so a bad name or --set key stops the workflow before any process starts.

Each analysis step reads the files its rule declares as inputs and writes those it declares as
outputs, each named on its command line: aggregate reads this workflow's runs, tables the aggregates,
figures both, and the report renders the tables and figures, recomputing nothing. Run ids and figure
names come from benchmarks/naming.py, as in the runner and the analysis.
"""

import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, workflow.basedir)
from benchmarks import EXIT_TIMEOUT, controller, naming  # noqa: E402
from benchmarks import config as run_config  # noqa: E402

STARTED = "results/logs/started.txt"  # written when an invocation starts (onstart)
FINISHED = "results/logs/finished.txt"  # written when it ends without error (onsuccess)
CALIBRATION = "results/calibration/calibration.csv"  # by hand (python -m benchmarks.virtual.calibrate), beside its .png
VALIDATION = "results/tables/validation.csv"  # by hand (python -m benchmarks.validate)

# One controller per directory; a restart after a killed one continues (benchmarks/controller.py).
# Not in the job steps a cluster executor starts: those read this file too.
CONTROLLER = controller.take_over(Path.cwd(), sys.argv[1:]) if workflow.is_main_process else None

if not config:  # a --configfile replaces the default matrix instead of being merged into it
    config.update(yaml.safe_load(open(Path(workflow.basedir) / "config/config.yaml")))

PY = sys.executable  # the interpreter running snakemake: the suite's environment, activated or not
RUN_ID = naming.run_id("{task}", "{algorithm}", "{nodes}", "{ppn}", "{seed}")  # with wildcards for fields
RUN = "results/runs/{suite}/" + RUN_ID
try:  # the matrix file and every run it makes, before any job: a mistake is one line, as on the command line
    run_config.check_matrix_file(config)
    MATRICES = run_config.matrices(config)  # one, or several under `matrices:` (one suite each)
    for m in MATRICES:
        simulated = m["set"].get("clock") == "simulated"  # on the virtual cluster, every simulated algorithm runs
        m["algorithms"] = run_config.available_algorithms(m["algorithms"], simulated)  # one line for each it skips
        run_config.check_matrix(m["algorithms"], m["tasks"], m["nodes"], m["procs_per_node"], m["overrides"])
except run_config.ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
BY_SUITE = {m["suite"]: m for m in MATRICES}
RUNS, LAYOUTS = [], set()  # LAYOUTS: (suite, task, nodes, procs per node) that have runs, for the figures
for m in MATRICES:
    RUNS += expand(RUN + "/summary.json", suite=m["suite"], task=m["tasks"], algorithm=m["algorithms"],
                   nodes=m["nodes"], ppn=m["procs_per_node"], seed=m["seeds"])
    if m["algorithms"] and m["seeds"]:
        LAYOUTS |= {(m["suite"], t, n, m["procs_per_node"]) for t in m["tasks"] for n in m["nodes"]}
# Runs under results/runs that this matrix does not make (an earlier --configfile's suite, a run
# started by hand): the report has always shown every run there, so the aggregate reads them too, as
# declared inputs, and the finished ones get their figures.
MADE = {str(Path(path).parent) for path in RUNS}
EARLIER = sorted(str(d) for d in Path("results/runs").glob("*/*") if d.is_dir() and str(d) not in MADE)
for run_dir in map(Path, EARLIER):
    fields = naming.parse_run_id(run_dir.name)
    if fields and (run_dir / "summary.json").is_file():
        nodes, ppn = int(fields["nodes"]), int(fields["procs_per_node"])
        LAYOUTS.add((run_dir.parent.name, fields["task"], nodes, ppn))


def sets(wildcards):
    """The run's --set options: the suite, and its matrix's overrides this algorithm and task know."""
    overrides = BY_SUITE[wildcards.suite]["overrides"]
    items = [f"suite={wildcards.suite}", *run_config.overrides_for(wildcards.algorithm, wildcards.task, overrides)]
    return " ".join(f"--set {shlex.quote(item)}" for item in items)  # a source's text may hold any character


wildcard_constraints:
    suite="[a-z0-9_-]+",
    task="[a-z0-9_]+",
    algorithm="[a-z0-9_]+",
    nodes=r"\d+",
    ppn=r"\d+",
    seed=r"\d+",


# The analysis is seconds of pandas and matplotlib: on the submitting host, never a cluster job.
localrules: all, aggregate, tables, figures, report, wandb


# The runs started on this machine go through one warm process that imported torch once and forks
# each run (benchmarks/forkserver.py): 3-5 s less a run. A job without it runs the same way, cold.
FORKSERVER = ".snakemake/forkserver.sock"  # relative: under AF_UNIX's 108-byte path limit wherever the clone is
SERVER = []


onstart:  # when this invocation began: the report says how long the workflow took (not on a dry run)
    Path(STARTED).parent.mkdir(parents=True, exist_ok=True)
    Path(STARTED).write_text(f"{time.time():.3f}\n")
    if workflow.local_exec:
        SERVER.append(subprocess.Popen([PY, "-m", "benchmarks.forkserver", "serve", FORKSERVER]))


def stop_forkserver(log):
    for server in SERVER:
        server.terminate()
        server.wait()


onsuccess:  # when it ended: a report rebuilt by hand later still says how long the workflow took
    stop_forkserver(log)
    Path(FINISHED).write_text(f"{time.time():.3f}\n")


onerror: stop_forkserver(log)


# Every run of the matrix, not only the report: without Snakemake's metadata (.snakemake/ removed,
# results copied from another checkout) an up-to-date report would not make its missing inputs.
rule all:
    default_target: True
    input:
        RUNS,
        "results/report.html",
        "results/logs/wandb.txt",


def simulated(wildcards) -> bool:
    """A run of a matrix with ``set: {clock: simulated}``: P logical workers in one process."""
    return BY_SUITE[wildcards.suite]["set"].get("clock") == "simulated"


def ranks(wildcards) -> int:
    """Processes a run starts: N x G, or one for a simulated run."""
    return 1 if simulated(wildcards) else int(wildcards.nodes) * int(wildcards.ppn)


def launcher(wildcards, resources) -> str:
    """The command that starts a run, up to its arguments: on this machine (``launcher=local``) the
    forkserver's client, and the runner spawns its N x G processes itself; with ``launcher=srun``
    (the Slurm profiles) srun with the job's geometry. The geometry is spelled out because the Slurm
    plugin clears the job's SLURM_* task variables before the command runs, and srun no longer
    inherits --cpus-per-task from sbatch."""
    if resources.launcher == "local":
        return f"{PY} -m benchmarks.forkserver run {FORKSERVER}"
    if resources.launcher != "srun":
        raise ValueError(f"resource ``launcher`` must be local or srun, got {resources.launcher!r}; "
                         "set it in the profile (set-resources: run: launcher: srun)")
    if ranks(wildcards) == 1:
        return f"{PY} -m benchmarks.run"
    cpus = resources.get("cpus_per_task")
    return (f"srun --nodes={wildcards.nodes} --ntasks={ranks(wildcards)} --ntasks-per-node={wildcards.ppn}"
            + (f" --cpus-per-task={cpus}" if cpus else "") + f" {PY} -m benchmarks.run")


rule run:
    output:
        RUN + "/summary.json",  # only the summary: Snakemake deletes a failed job's outputs, and the
        # checkpoint beside it in the run directory must survive a time limit
    log:
        "results/logs/{suite}/" + RUN_ID + ".log",
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
        "code=0; {params.launcher} --algorithm {wildcards.algorithm}"
        " --task {wildcards.task} --nodes {wildcards.nodes} --procs-per-node {wildcards.ppn}"
        " --seed {wildcards.seed} --out $(dirname {output}) {params.sets} --defer-wandb --keep-finished"
        " >> {log} 2>&1 || code=$?;"
        " if [ $code -eq {EXIT_TIMEOUT} ]; then echo 'stopped at the time limit with a checkpoint;"
        " run snakemake again to resume' >> {log}; exit $code; fi;"
        " [ $code -eq 0 ] || test -f {output}"


rule aggregate:
    input:
        RUNS,
        EARLIER,
    output:
        runs="results/tables/runs.csv",
        curves="results/tables/curves.csv",
    log:
        "results/logs/aggregate.log",
    run:
        # The runs go by a file (one path a line): a paper's thousand runs outgrow one shell command.
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as summaries:
            summaries.write("".join(f"{path}\n" for path in input))
            summaries.flush()
            shell("{PY} -m analysis.aggregate --summaries @{summaries.name} --runs {output.runs}"
                  " --curves {output.curves} > {log} 2>&1")


# The runs' wandb records (offline unless a run's wandb_mode says online), written from their files
# in one process once they have ended: 0.1 s a run instead of wandb's 1.2 s start in every run, and
# from the submitting host, which can reach wandb's server where compute nodes often cannot.
rule wandb:
    input:
        RUNS,
    output:
        "results/logs/wandb.txt",
    log:
        "results/logs/wandb.log",
    run:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as summaries:
            summaries.write("".join(f"{path}\n" for path in input))
            summaries.flush()
            shell("{PY} -m benchmarks.wandb_records --runs-file {summaries.name} --done {output} > {log} 2>&1")


report: "analysis/captions/workflow.rst"


def figure_paths(kind, ext="png"):
    """The figure files of one kind that the figures rule draws for this workflow's runs."""
    return ["results/figures/" + name for name in naming.figure_files(kind, LAYOUTS, ext)]


# The CSVs of published numbers that papers.yaml names: the papers table reads them all.
PAPER_NUMBERS = [f"analysis/papers/{entry['data']}" for entry in
                 yaml.safe_load(open(Path(workflow.basedir) / "analysis/papers/papers.yaml")).values()]


rule tables:
    input:
        runs=rules.aggregate.output.runs,
        curves=rules.aggregate.output.curves,
        papers_yaml="analysis/papers/papers.yaml",
        paper_numbers=PAPER_NUMBERS,
        claims_yaml="analysis/papers/claims.yaml",
    output:
        time_to_target=report("results/tables/time_to_target.csv",
                              caption="analysis/captions/time_to_target.rst", category="Tables"),
        time_to_target_md="results/tables/time_to_target.md",
        scaling="results/tables/scaling.csv",
        performance_ratios="results/tables/performance_ratios.csv",
        performance_profile="results/tables/performance_profile.csv",
        stragglers="results/tables/stragglers.csv",
        papers="results/tables/papers.csv",
        claims="results/tables/claims.csv",
        dana="results/tables/dana.csv",
        global_syncs="results/tables/global_syncs.csv",
    log:
        "results/logs/tables.log",
    shell:
        "{PY} -m analysis.tables --runs {input.runs} --curves {input.curves}"
        " --papers-yaml {input.papers_yaml} --time-to-target {output.time_to_target}"
        " --time-to-target-md {output.time_to_target_md}"
        " --scaling {output.scaling} --performance-ratios {output.performance_ratios}"
        " --performance-profile {output.performance_profile} --stragglers {output.stragglers}"
        " --papers {output.papers} --claims-yaml {input.claims_yaml} --claims {output.claims}"
        " --dana {output.dana} --global-syncs {output.global_syncs} > {log} 2>&1"


rule figures:
    input:
        runs=rules.aggregate.output.runs,
        curves=rules.aggregate.output.curves,
        time_to_target=rules.tables.output.time_to_target,
        performance_ratios=rules.tables.output.performance_ratios,
        stragglers=rules.tables.output.stragglers,
        claims=rules.tables.output.claims,
    output:
        png=[report(figure_paths(kind), caption=f"analysis/captions/{kind}.rst", category=title)
             for kind, title in naming.FIGURE_KINDS.items()],
        svg=[path for kind in naming.FIGURE_KINDS for path in figure_paths(kind, "svg")],
    params:
        figures="results/figures",  # the files are output.png and output.svg, named by benchmarks/naming.py
    log:
        "results/logs/figures.log",
    shell:
        "{PY} -m analysis.figures --runs {input.runs} --curves {input.curves}"
        " --time-to-target {input.time_to_target} --performance-ratios {input.performance_ratios}"
        " --stragglers {input.stragglers} --claims {input.claims} --figures {params.figures} > {log} 2>&1"


def present(*paths):
    """An input function: those of ``paths`` that exist when the workflow is planned, for files a rule
    reads where present and no rule makes. The report's started.txt is written by onstart, after the
    planning: an invocation declares the one its predecessor wrote, and reads its own."""
    return lambda wildcards: [path for path in paths if Path(path).is_file()]


rule report:
    input:
        runs=rules.aggregate.output.runs,
        time_to_target=rules.tables.output.time_to_target,
        scaling=rules.tables.output.scaling,
        stragglers=rules.tables.output.stragglers,
        performance_profile=rules.tables.output.performance_profile,
        papers=rules.tables.output.papers,
        claims=rules.tables.output.claims,
        global_syncs=rules.tables.output.global_syncs,
        dana=rules.tables.output.dana,
        papers_yaml="analysis/papers/papers.yaml",
        figures=rules.figures.output.png,
        calibration=present(CALIBRATION, CALIBRATION.replace(".csv", ".png")),
        validation=present(VALIDATION, VALIDATION.replace(".csv", "_ratios.csv")),
        started=present(STARTED),
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    shell:
        "{PY} -m analysis.report --render-only --runs {input.runs}"
        " --time-to-target {input.time_to_target} --scaling {input.scaling} --stragglers {input.stragglers}"
        " --performance-profile {input.performance_profile} --papers {input.papers} --claims {input.claims}"
        " --global-syncs {input.global_syncs} --dana {input.dana}"
        " --papers-yaml {input.papers_yaml} --figures {input.figures} --report {output}"
        " --calibration {CALIBRATION} --validation {VALIDATION} --started {STARTED} > {log} 2>&1"  # each where present
