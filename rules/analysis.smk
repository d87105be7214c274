# The analysis: aggregate the runs, then tables, figures and the report, each a step that reads the
# files its rule declares and writes those it declares, named on its command line.


def table_path(name):
    """Where a table of the registry (analysis/artefacts.py), or a paper's file, lies."""
    path = artefacts.files([name])[name]
    # a source is relative to the repository its package lies in (the workflow's folder may link to it)
    root = artefacts.PAPERS_DIR.parents[1]
    return str(Path(path).relative_to(root)) if Path(path).is_absolute() else f"results/{path}"


rule aggregate:
    input:
        RUNS,
        EARLIER,
    output:
        runs=table_path("runs"),
        curves=table_path("curves"),
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
    return [f"results/{artefacts.FIGURES_DIR}/{name}" for name in artefacts.figure_files(kind, LAYOUTS, ext)]


def table_output(entry):
    """A table rule's output: in Snakemake's report, with its caption, where the registry gives one."""
    path = table_path(entry.name)
    return report(path, caption=entry.caption_path(), category="Tables") if entry.caption else path


def options(names, section):
    """The step's command line for ``names``: ``--name {section.name}`` each, as the registry's
    steps read them (analysis/cli.py)."""
    return " ".join(f"{artefacts.option(name)} {{{section}.{name}}}" for name in names)


# The CSVs of published numbers that papers.yaml names: the papers table reads them all.
PAPER_NUMBERS = [f"analysis/papers/{entry['data']}" for entry in
                 yaml.safe_load(open(artefacts.SOURCES["papers_yaml"])).values()]
TABLE_READS = ["runs", "curves", *artefacts.SOURCES]


# Every table of the registry, in one step that reads the aggregates and the papers' files.
rule tables:
    input:
        **{name: table_path(name) for name in TABLE_READS},
        paper_numbers=PAPER_NUMBERS,
    output:
        **{entry.name: table_output(entry) for entry in artefacts.TABLES},
    log:
        "results/logs/tables.log",
    shell:
        "{PY} -m analysis.tables " + options(TABLE_READS, "input") + " "
        + options([entry.name for entry in artefacts.TABLES], "output") + " > {log} 2>&1"


# Every figure of the registry, from the tables they read; each kind with its caption and category.
rule figures:
    input:
        **{name: table_path(name) for name in ["runs", *artefacts.figure_reads()]},
    output:
        png=[report(figure_paths(f.name), caption=f.caption_path(), category=f.title) for f in artefacts.FIGURES],
        svg=[path for f in artefacts.FIGURES for path in figure_paths(f.name, "svg")],
    params:
        figures=f"results/{artefacts.FIGURES_DIR}",  # the files are output.png and output.svg, named by the registry
    log:
        "results/logs/figures.log",
    shell:
        "{PY} -m analysis.figures " + options(list(dict.fromkeys(["runs", *artefacts.figure_reads()])), "input")
        + " --figures {params.figures} > {log} 2>&1"


def present(*paths):
    """An input function: those of ``paths`` that exist when the workflow is planned, for files a rule
    reads where present and no rule makes. The report's started.txt is written by onstart, after the
    planning: an invocation declares the one its predecessor wrote, and reads its own."""
    return lambda wildcards: [path for path in paths if Path(path).is_file()]


rule report:
    input:
        **{name: table_path(name) for name in [*artefacts.report_reads(), "papers_yaml"]},
        figures=rules.figures.output.png,
        calibration=present(CALIBRATION, str(artefacts.calibration_figure(CALIBRATION))),
        validation=present(VALIDATION, str(artefacts.validation_ratios(VALIDATION))),
        started=present(STARTED),
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    shell:
        "{PY} -m analysis.report --render-only " + options([*artefacts.report_reads(), "papers_yaml"], "input")
        + " --figures {input.figures} --report {output}"
        " --calibration {CALIBRATION} --validation {VALIDATION} --started {STARTED} > {log} 2>&1"  # each where present
