# The workflow's matrix and what every rule reads: the runs it makes (RUNS), the earlier runs the
# report still shows (EARLIER), their layouts, the controller, and the start and end of an invocation.

import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, workflow.basedir)
from analysis import artefacts  # noqa: E402  (the registry of tables and figures: no pandas, no matplotlib)
from benchmarks import EXIT_TIMEOUT, controller, naming  # noqa: E402
from benchmarks import config as run_config  # noqa: E402
from benchmarks import matrix as run_matrix  # noqa: E402

STARTED = "results/" + artefacts.EXTERNAL["started"]  # written when an invocation starts (onstart)
FINISHED = str(Path(STARTED).with_name("finished.txt"))  # written when it ends without error (onsuccess)
CALIBRATION = "results/" + artefacts.EXTERNAL["calibration"]  # by hand (python -m tools.calibrate), beside its .png
VALIDATION = "results/" + artefacts.EXTERNAL["validation"]  # by hand (python -m tools.validate)

# One controller per directory; a restart after a killed one continues (benchmarks/controller.py).
# Not in the job steps a cluster executor starts: those read this file too.
CONTROLLER = controller.take_over(Path.cwd(), sys.argv[1:]) if workflow.is_main_process else None

if not config:  # a --configfile replaces the default matrix instead of being merged into it
    config.update(yaml.safe_load(open(Path(workflow.basedir) / "config/config.yaml")))

PY = sys.executable  # the interpreter running snakemake: the suite's environment, activated or not
RUN_ID = naming.run_id("{task}", "{algorithm}", "{nodes}", "{ppn}", "{seed}")  # with wildcards for fields
RUN = "results/runs/{suite}/" + RUN_ID
try:  # the matrix file and every run it makes, before any job: a mistake is one line, as on the command line
    run_matrix.check_matrix_file(config)
    MATRICES = run_matrix.matrices(config)  # one, or several under `matrices:` (one suite each)
    for m in MATRICES:
        simulated = m["set"].get("clock") == "simulated"  # on the virtual cluster, every simulated algorithm runs
        m["algorithms"] = run_matrix.available_algorithms(m["algorithms"], simulated)  # one line for each it skips
        run_matrix.check_matrix(m["algorithms"], m["tasks"], m["nodes"], m["procs_per_node"], m["overrides"])
except run_config.ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
BY_SUITE = {m["suite"]: m for m in MATRICES}
RUNS, LAYOUTS = [], set()  # LAYOUTS: (suite, task, nodes, procs per node) that have runs, for the figures
for m in MATRICES:
    RUNS += expand(f"{RUN}/{naming.SUMMARY}", suite=m["suite"], task=m["tasks"], algorithm=m["algorithms"],
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
    if fields and (run_dir / naming.SUMMARY).is_file():
        nodes, ppn = int(fields["nodes"]), int(fields["procs_per_node"])
        LAYOUTS.add((run_dir.parent.name, fields["task"], nodes, ppn))


def sets(wildcards):
    """The run's --set options: the suite, and its matrix's overrides this algorithm and task know."""
    overrides = BY_SUITE[wildcards.suite]["overrides"]
    items = [f"suite={wildcards.suite}", *run_matrix.overrides_for(wildcards.algorithm, wildcards.task, overrides)]
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
