"""The benchmark workflow: one job per run, then aggregate, tables, figures and the report.

    snakemake --cores all                                  # the embedded default (config/config.yaml)
    snakemake --cores all --configfile config/<paper>.yaml # another matrix
    snakemake -n                                           # dry run: lists every run

A run that fails still writes its summary.json (status failed), so it never stops the others and the
report shows it. The matrix is checked against config/schema.yaml, and every run's configuration is
resolved once here, so a bad name or --set key stops the workflow before any process starts.
"""

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
SUITE = config["suite"]
PPN = config["procs_per_node"]
OVERRIDES = [f"{k}={run_config.yaml_value(v)}" for k, v in config.get("set", {}).items()]
RUN = "results/runs/{suite}/{task}__{algorithm}__n{nodes}x{ppn}__s{seed}"
ALGORITHMS = run_config.available_algorithms(config["algorithms"])  # says in one line what it skips
RUNS = expand(RUN + "/summary.json", suite=SUITE, task=config["tasks"], algorithm=ALGORITHMS,
              nodes=config["nodes"], ppn=PPN, seed=config["seeds"])
FIGURES = expand("results/figures/{suite}__{task}__n{nodes}x{ppn}__metric_vs_time.{ext}", suite=SUITE,
                 task=config["tasks"], nodes=config["nodes"], ppn=PPN, ext=["png", "svg"])

run_config.check_matrix(ALGORITHMS, config["tasks"], config["nodes"], PPN, OVERRIDES)


def sets(wildcards):
    """The run's --set options: the suite, and the matrix's overrides this algorithm and task know."""
    items = [f"suite={SUITE}", *run_config.overrides_for(wildcards.algorithm, wildcards.task, OVERRIDES)]
    return " ".join(f"--set '{item}'" for item in items)

wildcard_constraints:
    suite="[a-z0-9_-]+",
    task="[a-z0-9_]+",
    algorithm="[a-z0-9_]+",
    nodes=r"\d+",
    ppn=r"\d+",
    seed=r"\d+",


rule all:
    default_target: True
    input:
        "results/report.html",


rule run:
    output:
        RUN + "/summary.json",
    log:
        "results/logs/{suite}/{task}__{algorithm}__n{nodes}x{ppn}__s{seed}.log",
    threads: lambda wc: int(wc.nodes) * int(wc.ppn)
    params:
        sets=sets,
    shell:
        "{PY} -m benchmarks.run --algorithm {wildcards.algorithm} --task {wildcards.task}"
        " --nodes {wildcards.nodes} --procs-per-node {wildcards.ppn} --seed {wildcards.seed}"
        " --out $(dirname {output}) {params.sets} > {log} 2>&1 || test -f {output}"


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


rule tables:
    input:
        rules.aggregate.output.runs,
    output:
        "results/tables/time_to_target.csv",
        "results/tables/time_to_target.md",
    log:
        "results/logs/tables.log",
    shell:
        "{PY} -m analysis.tables --results results > {log} 2>&1"


rule figures:
    input:
        rules.aggregate.output,
    output:
        FIGURES,
    log:
        "results/logs/figures.log",
    shell:
        "{PY} -m analysis.figures --results results > {log} 2>&1"


rule report:
    input:
        rules.tables.output,
        FIGURES,
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    shell:
        "{PY} -m analysis.report --results results > {log} 2>&1"
