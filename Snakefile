"""The benchmark workflow: one job per run, then aggregate, tables, figures and the report.

    snakemake --cores all                                  # the embedded default (config/config.yaml)
    snakemake --cores all --configfile config/<paper>.yaml # another matrix
    snakemake -n                                           # dry run: lists every run

A run that fails still writes its summary.json (status failed), so it never stops the others and the
report shows it. The matrix is checked against config/schema.yaml, and every run's configuration is
resolved once here, so a bad name or --set key stops the workflow before any process starts.

Each analysis step reads the files its rule declares as inputs and writes those it declares as
outputs, each named on its command line: aggregate reads this workflow's runs, tables the aggregates,
figures both, and the report renders the tables and figures, recomputing nothing. Run ids come from
benchmarks/naming.py, as in the runner and the analysis; the tables and figures, their files and
captions from the analysis's registry, analysis/artefacts.py.
"""


include: "rules/common.smk"


# Every run of the matrix, not only the report: without Snakemake's metadata (.snakemake/ removed,
# results copied from another checkout) an up-to-date report would not make its missing inputs.
rule all:
    default_target: True
    input:
        RUNS,
        "results/report.html",
        "results/logs/wandb.txt",


include: "rules/runs.smk"
include: "rules/analysis.smk"
