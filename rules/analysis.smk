# The analysis: aggregate the runs, then tables, figures and the report, each a step that reads the
# files its rule declares and writes those it declares, named on its command line.


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
