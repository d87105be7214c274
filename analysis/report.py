"""The self-contained HTML comparison report, rendered over the tables and figures the earlier steps made.

``report.html`` is one file with inline CSS, the PNG figures embedded as base64 ``data:`` URIs, no
scripts and no links out, so it opens offline and can be mailed or archived as is. It answers at a
glance, then in detail:

1. The first screen: the papers' claims, one line each with its verdict as a coloured badge and the
   measured value beside the paper's (the interval, the conditions and why one click away), and the
   figure of who leads each workload by what its suite measures (:mod:`analysis.leaders`: the time
   to target, or what the claims read of a suite without a target: seconds a step, total time,
   final metric).
2. Summary: per suite, task, node count and condition, the leader by that measure, and for the time
   to target its speed-up over DDP.
3. One folded section per suite: its table, best first by its measure (k/n converged, min–max,
   speed-up, final metric, throughput, communication share), scaling across node counts where the
   suite ran more than one, throughput with and without stragglers where it ran both, DASO's global
   synchronisations, and the figures, or a sentence where one would be empty by design.
4. The performance profile over the workloads measured by their time to target (AlgoPerf-style);
   then a section for each table of the registry that names one (:mod:`analysis.artefacts`), with
   its caption and the figures that read it.
5. Paper vs this suite, one folded subsection per paper; DANA's tables in the paper's units.
6. The runs that did not converge, failed or are unfinished (the completed runs of a suite without
   a target are none of these); the run metadata.

The page is the Jinja2 template ``analysis/templates/report.html`` (autoescaped). This module only
reads the earlier steps' files, by column name, and renders them for people; what the page states
from them (the summary, a suite's table, the runs that failed, the metadata, the validation's errors,
the workflow's minutes) :mod:`analysis.overview` calculates. Neither recomputes the tables (DASO's global synchronisations and DANA's comparison included, which the tables step writes
as ``global_syncs.csv`` and ``dana.csv``). Simulated times carry "(simulated)" wherever they are
shown and are never divided by wall-clock times.

``python -m analysis.report --results DIR`` rebuilds everything from ``DIR/runs/`` alone, for a user
who calls it by hand: the earlier steps (aggregate, tables, figures) in the Snakefile's order, then
the report; it prints the report's path. With ``--render-only`` it renders from the files named on
its command line and nothing else, as the Snakefile's report rule does.

About 600 lines, past the house's 500: one short function per section of the page, the page's
order; what the sections state is calculated in :mod:`analysis.overview`, and splitting the
rendering further would spread one page over several modules.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import jinja2
import pandas as pd

from analysis import (
    aggregate,
    artefacts,
    claims,
    cli,
    dana,
    figures,
    leaders,
    overview,
    papers,
    profile,
    scaling,
    stragglers,
    tables,
)
from analysis.aggregate import INCOMPLETE
from benchmarks import validation_cases

# What the report reads: the registry's tables it shows, the papers' descriptions, the PNG figures, the
# files the measuring commands and the workflow write (each shown where present); and what it writes.
FILES = {
    **artefacts.files([*artefacts.report_reads(), "papers_yaml"]),
    "figures": f"{artefacts.FIGURES_DIR}/*.png",
    **artefacts.files(artefacts.EXTERNAL),
    "report": "report.html",
}
SECTIONS = [
    "Claims",
    "Summary",
    "Performance profile",
    "Virtual cluster against measurements",
    "Virtual cluster against this machine",
    "Paper vs this suite",
    "Runs that did not converge or failed",
    "Run metadata",
]
TEMPLATES = Path(__file__).resolve().parent / "templates"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def cells(frame: pd.DataFrame, classes: dict[str, str] | None = None) -> dict:
    """A frame as the template's table: header, one CSS class per column (or ""), rows of text.

    A missing number is an empty cell; everything else is its ``str``. The template escapes it.
    """

    def text(value: object) -> str:
        return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)

    return {
        "columns": [str(c) for c in frame.columns],
        "classes": [(classes or {}).get(c, "") for c in frame.columns],
        "rows": [[text(v) for v in row] for row in frame.itertuples(index=False)],
    }


def first_caption(suites: list[str], measures: dict[str, str]) -> str:
    """The opening figure's caption: what each suite is measured by, then how to read the bars."""
    said = "; ".join(f"{suite}: {measures.get(suite, leaders.TIME_TO_TARGET)}" for suite in suites)
    return (
        f"Each suite by what it measures ({said}). A time is drawn over the workload's fastest, so a "
        "bar's number is the leader's speed-up over it; a metric as it is. Line: the 95 % interval of "
        "the median; colour: the bar's place (legend)."
    )


class Figures:
    """The PNG figures the report may embed, found by their names among the files it was given."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = {Path(p).name: Path(p) for p in paths}

    def get(self, caption: str, kind: str, *key: object) -> dict | None:
        """The figure of ``kind`` for ``key`` as a caption and base64 PNG, or None if it was not drawn."""
        path = self.paths.get(f"{artefacts.figure_stem(kind, *key)}.png")
        if path is None or not path.is_file():
            return None
        return {"caption": caption, "data": base64.b64encode(path.read_bytes()).decode("ascii")}

    def of_kind(self, caption: str, kind: str) -> list[dict]:
        """Every figure of ``kind`` drawn, in the order of their names, each with ``caption``."""
        names = sorted(n for n in self.paths if n == f"{kind}.png" or n.endswith(f"__{kind}.png"))
        return [
            {"caption": caption, "data": base64.b64encode(self.paths[n].read_bytes()).decode("ascii")} for n in names
        ]


def caption_text(entry: artefacts.Artefact) -> str:
    """An artefact's caption file as one paragraph ("" where it has none)."""
    path = Path(__file__).resolve().parent.parent / entry.caption_path() if entry.caption else None
    return " ".join(path.read_text(encoding="utf-8").split()) if path and path.is_file() else ""


def own_sections(files: dict, shown: Figures) -> list[dict]:
    """The sections of the registry's tables that name one (``section``): the table as its file
    holds it, its caption, and the figures that read it, each with its own caption."""
    sections = []
    for entry in artefacts.TABLES:
        if not entry.section:
            continue
        frame = artefacts.load(entry.read)(files[entry.name])
        drawn = [f for f in artefacts.FIGURES if entry.name in f.reads]
        sections.append(
            {
                "title": entry.section,
                "caption": caption_text(entry),
                "table": cells(frame),
                "figures": [picture for f in drawn for picture in shown.of_kind(caption_text(f), f.name)],
            }
        )
    return sections


def _syncs(syncs: pd.DataFrame) -> dict:
    """DASO's global synchronisations beside DDP's one per step, formatted."""
    shown = (
        syncs.drop(columns=["suite"])
        .assign(
            **{
                "syncs": syncs["syncs"].map("{:.0f}".format),
                "steps (DDP syncs)": syncs["steps"].map("{:.0f}".format),
                "MB over inter-node links": (syncs["sync_bytes"] / 1e6).map("{:.1f}".format),
                "saved vs DDP": syncs["saved vs DDP"].map("{:.0%}".format),
            }
        )
        .drop(columns=["steps", "sync_bytes"])
    )
    return cells(shown)


def _figure_or_why(shown: Figures, caption: str, kind: str, key: tuple, why: str) -> dict | None:
    """The figure of ``kind`` for ``key``, or where ``why`` says it would be empty by design, that
    sentence in its place (the figure file exists for the workflow, and is not shown)."""
    return {"caption": why, "data": None} if why else shown.get(caption, kind, *key)


def _suite(
    suite: str,
    table: pd.DataFrame,
    scale: pd.DataFrame,
    straggling: pd.DataFrame,
    syncs: pd.DataFrame,
    shown: Figures,
    summary: pd.DataFrame,
    measure: str = leaders.TIME_TO_TARGET,
) -> dict:
    """One suite's section from its own rows only: ``table`` of the time-to-target table, ``scale`` of
    the scaling table, ``straggling`` of the straggler table, ``summary`` of :func:`analysis.overview.summary_table`,
    ``measure`` what the suite is measured by (:func:`analysis.leaders.suite_measures`). A figure
    that would be empty by design (one evaluation a run: points, no curve; no column of an
    algorithm's own: no trace) is a sentence instead."""
    finished = table[table["n"] > 0]
    layouts = [key for key, _ in finished.groupby(["task", "nodes", "procs_per_node"], sort=True)]
    tasks = sorted(finished["task"].unique())
    several_nodes = finished["nodes"].nunique() > 1  # one node count scales nothing: a sentence instead
    compared = stragglers.display(straggling)
    own_syncs = syncs[syncs["suite"] == suite]
    by_measure, left_out = overview.suite_table(table, measure)
    narrow, same = overview.narrowed(by_measure)

    def rows(t: str, n: int, g: int) -> pd.DataFrame:
        return finished[(finished["task"] == t) & (finished["nodes"] == n) & (finished["procs_per_node"] == g)]

    def once(t: str, n: int, g: int) -> str:  # every run evaluated once: a point each, no curve
        if rows(t, n, g)["evaluations"].max() >= 2:
            return ""
        return (
            f"{t} on {n}×{g}: every run was evaluated once, so its metric is a point and has no curve "
            f"to draw; this suite is measured by its {measure}, in the table above."
        )

    def untraced(t: str, n: int, g: int) -> str:
        if rows(t, n, g)["traced"].sum() > 0:
            return ""
        return f"{t} on {n}×{g}: no algorithm here logs a column of its own in metrics.csv over two epochs or more."

    return {
        "name": suite,
        "brief": _brief(finished, summary),
        "measure": measure,
        "table": cells(narrow),
        "same": " ".join(x for x in (left_out, same) if x),
        "metric_figures": [
            _figure_or_why(
                shown,
                f"{suite}: {t} on {n}×{g} workers, median and min–max over seeds; dashed: target",
                "metric_vs_time",
                (suite, t, n, g),
                once(t, n, g),
            )
            for t, n, g in layouts
        ],
        "bytes_figures": [
            _figure_or_why(
                shown,
                f"{suite}: {t} on {n}×{g} workers, against the megabytes a rank sent (log scale); dashed: target",
                "metric_vs_bytes",
                (suite, t, n, g),
                once(t, n, g),
            )
            for t, n, g in layouts
        ],
        "scaling": cells(scaling.display(scale)) if several_nodes else None,
        "node_counts": sorted(int(n) for n in finished["nodes"].unique()),
        "scaling_figures": [
            shown.get(
                f"{suite}: {t}, median time to target against node count (log–log, "
                "min–max bars, dotted: ideal scaling)",
                "scaling",
                suite,
                t,
            )
            for t in tasks
        ]
        if several_nodes
        else [],
        "stragglers": cells(compared) if not compared.empty else None,
        "no_stragglers": stragglers.nothing_to_compare(straggling["straggler"]) if compared.empty else "",
        "straggler_figures": [
            shown.get(f"{suite}: {t}, median throughput with and without stragglers", "stragglers", suite, t)
            for t in tasks
        ]
        if not compared.empty
        else [],
        "syncs": _syncs(own_syncs) if not own_syncs.empty else None,
        "trace_figures": [
            _figure_or_why(
                shown,
                f"{suite}: {t} on {n}×{g}: every extra numeric column of metrics.csv per algorithm, by epoch",
                "traces",
                (suite, t, n, g),
                untraced(t, n, g),
            )
            for t, n, g in layouts
        ],
    }


def _brief(finished: pd.DataFrame, summary: pd.DataFrame) -> str:
    """A suite in one line, beside its folded heading: its size and who is fastest where."""
    size = f"{finished['algorithm'].nunique()} algorithms, {int(finished['n'].sum())} finished runs"
    leading = sorted({f"{r['leader']} ({r['measure']})" for _, r in summary.iterrows() if r["leader"]})
    return size + ("; leads: " + ", ".join(leading) if leading else "")


def _paper(key: str, meta: dict[str, str], compared: pd.DataFrame, hardware: str) -> dict:
    """One paper's subsection: its description, then its numbers beside the suite's."""
    shown = papers.display(compared)
    measured = compared["deviation"].notna()
    here = sorted({m for m in compared["measured_on"] if m})
    ref = re.sub(r"^https?://", "", meta.get("url", ""))  # as text: the report links nowhere
    return {
        "key": key,
        "title": meta["title"],
        "rows": [
            ("Paper", f"{meta['title']}. {meta['authors']}. {meta['venue']}." + (f" {ref}" if ref else "")),
            ("Hardware", f"paper: {meta['hardware']}; here: {hardware}"),
            ("Scale", f"paper: {meta['scale']}; here: " + (", ".join(here) if here else "no matching runs yet")),
            ("Software", meta["software"]),
            ("Measure", meta["measure"]),
            ("Differences", meta["differences"]),
            ("Matrix", meta.get("matrix") or "none in config/ yet"),
        ],
        "count": len(compared),
        "measured_count": int(measured.sum()),
        "measured": cells(shown[measured]),
        "all": cells(shown),
    }


def _rows_of(compared: pd.DataFrame, key: str) -> pd.DataFrame:
    """One paper's rows of ``papers.csv``, as :func:`analysis.papers.compare` returned them."""
    return compared[compared["paper"] == key].drop(columns="paper").reset_index(drop=True)


def dana_columns(column: str) -> str:
    """A column of DANA's table as the report heads it: accuracies in percent, as the paper's beside
    them; the paper's "gap" (parameters) as a distance, since "gap" in the claims is a metric's."""
    if column.endswith(" acc"):
        return f"{column[: -len(' acc')]} accuracy (%)"
    if column.startswith("paper "):
        return f"{column} (%)"
    if column.endswith(" gap"):
        return f"{column[: -len(' gap')]} parameter distance"
    return column


def dana_section(dana_tables: list[tuple[str, pd.DataFrame]]) -> dict | None:
    """DANA's tables in the paper's units (accuracies in percent to 1 decimal beside the paper's to 2;
    the parameter distance in scientific notation), with the verdict."""
    if not dana_tables:
        return None
    formatted = []
    for title, frame in dana_tables:
        shown = frame.copy()
        for column in shown.columns:
            if column.endswith(" gap"):
                shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v:.2e}")
            elif column.endswith(" acc"):  # a fraction here, percent in the paper
                shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{100 * v:.1f}")
            elif column.startswith("paper "):
                shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
        formatted.append({"title": title, "table": cells(shown.rename(columns=dana_columns))})
    return {"verdict": dana.verdict(dana_tables), "tables": formatted}


def model_error(
    network: str,
    errors: dict[str, tuple[float, int]],
    pair: tuple[str, str] = ("", ""),
    ratios: pd.DataFrame | None = None,
) -> str:
    """What a simulated claim's verdict rests on: the out-of-sample error of the speed-up it reads,
    its own (algorithm, baseline) pair on its network (``validation_ratios.csv``), then its network's
    geomean |relative error| of times. A verdict is a ratio: the two algorithms' errors add there, where
    a geomean of times lets them cancel; a pair with no test ratio has a baseline nothing validates."""
    if not network:
        return ""
    if not errors:
        return f"{network}: not validated here yet (python -m tools.validate scores it)"
    times = (
        f"{network}'s times: {errors[network][0]:.1%} geomean |error| over {errors[network][1]} test rows"
        if network in errors
        else f"{network}: no test rows in the validation"
    )
    algorithm, baseline = pair
    if ratios is None or not algorithm:
        return times
    mine = ratios[
        (ratios["network"] == network) & (ratios["algorithm"] == algorithm) & (ratios["baseline"] == baseline)
    ]
    tested = mine[mine["role"] == "test"]
    if tested.empty:
        fitted = f" (fit only: {', '.join(mine['ratio'])})" if not mine.empty else ""
        return f"{algorithm} over {baseline}: no test ratio on {network}{fitted}, the verdict's pair is not validated; {times}"
    each = ", ".join(f"{r.relative_error:+.1%} ({r.ratio})" for r in tested.itertuples())
    return f"{algorithm} over {baseline} on {network}: {each}; {times}"


def claim_lines(
    verdicts: pd.DataFrame, errors: dict[str, tuple[float, int]] | None = None, ratios: pd.DataFrame | None = None
) -> list[dict]:
    """The claims as the report's first screen: per claim one line (its paper, the claim, the verdict
    and a CSS class for its badge, this suite's value beside the paper's) and the details a click
    away (the interval and its coverage, why, the verdict with the inter-node link at half and twice
    its speed, the conditions, the source and the suite that holds the evidence)."""

    def value(row: pd.Series, interval: bool) -> str:
        if pd.isna(row["value"]):
            return "—"
        ratio = row["quantity"] in claims.RATIOS  # else an ordering: the metric's difference, a fraction
        # an ordering in percentage points, as the papers give accuracies in percent
        number = (lambda x: f"{x:.2f}×") if ratio else (lambda x: f"{100 * x:+.1f} pp")
        if not interval:
            return number(row["value"])
        if pd.isna(row["coverage"]):  # every seed gave the same value: no interval to show
            return f"{number(row['value'])} ({row['seeds']} seeds, every one the same: deterministic)"
        coverage = f", covers {row['coverage']:.1%}"
        return f"{number(row['value'])} [{number(row['low'])}, {number(row['high'])}] ({row['seeds']} seeds{coverage})"

    def where(row: pd.Series) -> str:
        clock = "simulated" if row["clock"] == "simulated" else "real" if row["clock"] else ""
        return "; ".join(x for x in (clock, row["conditions"], row["setting"]) if x)

    lines = []
    for _, row in verdicts.iterrows():  # text columns are "" where empty (claims.read)
        details = [
            ("claim", f"{row['claim']} ({row['source']})"),
            ("this suite [interval]", value(row, interval=True)),
            ("verdict", f"{row['verdict']} ({row['why']})" if row["why"] else row["verdict"]),
            ("inter-node link ½× and 2×", row["network"]),
            (
                "the model's error out of sample",
                model_error(
                    row.get("sim_network", ""),
                    errors or {},
                    (row.get("algorithm", ""), row.get("baseline", "")),
                    ratios,
                ),
            ),
            ("conditions", where(row)),
            ("assumed (the paper does not state it)", row.get("assumed", "")),
        ]
        lines.append(
            {
                "paper": row["paper"],
                "claim": row["claim"],
                "verdict": row["verdict"],
                "badge": _anchor(row["verdict"]),
                "measured": value(row, interval=False),
                "paper_value": row["paper_value"],
                "details": [(name, text) for name, text in details if text],
                "evidence": f"Suite: {row['suite'].split(', ')[0]}" if row["suite"] else "",
            }
        )
    return lines


def validation_section(path: Path) -> dict | None:
    """The virtual cluster against measurements it was not fitted to (``tools/validate.py``'s
    tables): the speed-ups' errors per network and family first (what a verdict reads), then per
    network the geomean |error| of the test rows' times, then every ratio and every row; None where
    not run."""
    path = Path(path)
    if not path.is_file():
        return None
    rows = pd.read_csv(path)
    errors = overview.validation_errors(rows)
    shown = rows[["case", "source", "network", "role", "measured", "predicted", "relative_error"]].copy()
    shown["relative_error"] = shown["relative_error"].map(lambda e: None if pd.isna(e) else f"{e:+.1%}")
    for column in ("measured", "predicted"):
        shown[column] = shown[column].map(lambda v: None if pd.isna(v) else f"{v:.4g}")
    if "unit" in rows:
        shown.insert(6, "unit", rows["unit"])
    summary = "; ".join(f"{net} {e:.1%} over {n} test rows" for net, (e, n) in sorted(errors.items()))
    spoiled = int((rows["role"] == "apparatus").sum())
    if spoiled:  # scored and listed, but this machine spoils them: out of the summaries, with the reason
        summary += f"; {spoiled} rows the measuring machine spoils (role apparatus, the case file says how) left out"
    section = {"summary": summary or "no test rows", "table": cells(shown), "ratio_summary": None, "ratios": None}
    if artefacts.validation_ratios(path).is_file():
        ratios = pd.read_csv(artefacts.validation_ratios(path))
        summary = validation_cases.ratio_summary(ratios.to_dict("records"))
        shown_summary = pd.DataFrame(
            summary, columns=["network", "family", "test_ratios", "geomean_abs_error", "largest_abs_error", "largest"]
        )
        for column in ("geomean_abs_error", "largest_abs_error"):
            shown_summary[column] = shown_summary[column].map(lambda e: f"{e:.1%}")
        section["ratio_summary"] = cells(shown_summary)
        listed = ratios[["ratio", "network", "family", "role", "measured", "predicted", "relative_error"]].copy()
        listed["relative_error"] = listed["relative_error"].map(lambda e: f"{e:+.1%}")
        for column in ("measured", "predicted"):
            listed[column] = listed[column].map(lambda v: f"{v:.3f}×")
        section["ratios"] = cells(listed)
    return section


def calibration_section(path: Path) -> dict | None:
    """The report's calibration section: the virtual cluster's predictions beside the measured times
    (``tools/calibrate.py``'s files) as a table and its figure, or None where the calibration
    was not run."""
    path = Path(path)
    if not path.is_file():
        return None
    shown = overview.calibration_summary(pd.read_csv(path))
    shown["error"] = shown["error"].map(lambda e: None if pd.isna(e) else f"{e:+.0%}")
    for column in ("measured_s", "predicted_s"):
        shown[column] = shown[column].map(lambda v: None if pd.isna(v) else f"{v:.2f}")
    shown["seeds"] = shown["seeds"].fillna(0).astype(int)
    shown.columns = ["algorithm", "measured (s, wall clock)", "predicted (s, simulated)", "error", "seeds"]
    figure = artefacts.calibration_figure(path)
    data = base64.b64encode(figure.read_bytes()).decode("ascii") if figure.is_file() else None
    caption = "Predicted against measured time to target, one point per seed; the band is ±25 %"
    return {"table": cells(shown), "figure": {"caption": caption, "data": data} if data else None}


def render(files: dict) -> Path:
    """Render ``files["report"]`` from the tables and figures named in ``files``; return its path."""
    runs = aggregate.read_runs(files["runs"])
    table = tables.read_table(files["time_to_target"])
    scale = tables.read_table(files["scaling"])
    prof = tables.read_table(files["performance_profile"])
    profiled = prof[prof["workloads"] >= profile.MIN_WORKLOADS]  # a clock of one workload has no profile
    compared = papers.read_compared(files["papers"])
    verdicts = claims.read(files["claims"])
    shown = Figures(files["figures"])
    finished = int((runs["status"] != INCOMPLETE).sum())
    straggling = tables.read_table(files["stragglers"])
    suites = sorted(table["suite"].unique())
    syncs = tables.read_table(files["global_syncs"])
    hardware = overview.hardware_here(runs)
    measures = leaders.suite_measures(verdicts)
    problems = overview.problem_runs(runs, measures)
    summary = overview.summary_table(table, measures)
    validated = Path(files["validation"]).is_file()
    sections = own_sections(files, shown)
    own = [section["title"] for section in sections]
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["anchor"] = _anchor
    page = environment.get_template("report.html").render(
        runs=len(runs),
        finished=finished,
        suite_count=len(suites),
        simulated=bool((runs["clock"] == "simulated").any()),
        contents=[*SECTIONS[:2], *[f"Suite: {s}" for s in suites], SECTIONS[2], *own, *SECTIONS[3:]],
        own_sections=sections,
        claims=claim_lines(
            verdicts,
            overview.validation_errors(pd.read_csv(files["validation"])) if validated else {},
            pd.read_csv(artefacts.validation_ratios(files["validation"]))
            if artefacts.validation_ratios(files["validation"]).is_file()
            else None,
        ),
        first_figure=shown.get(first_caption(suites, measures), "first_to_target"),
        claim_counts=verdicts["verdict"].value_counts().to_dict(),
        claim_rule=claims.RULE,
        summary=summary.to_dict("records"),
        summary_table=cells(summary),
        suites=[
            _suite(
                str(s),
                table[table["suite"] == s],
                scale[scale["suite"] == s],
                straggling[straggling["suite"] == s],
                syncs,
                shown,
                summary[summary["suite"] == s],
                measures.get(s, leaders.TIME_TO_TARGET),
            )
            for s in suites
        ],
        profile=cells(profile.display(profiled)) if not profiled.empty else None,
        no_profile=profile.nothing_to_profile(prof.groupby("clock")["workloads"].max().to_dict()),
        profile_figure=shown.get(
            "Performance profile: share of workloads within τ× the fastest", "performance_profile"
        ),
        papers=[
            _paper(key, meta, _rows_of(compared, key), hardware)
            for key, meta in papers.load_meta(files["papers_yaml"]).items()
        ],
        dana=dana_section(dana.read(files["dana"])),
        validation=validation_section(files["validation"]),
        calibration=calibration_section(files["calibration"]),
        minutes=overview.workflow_minutes(files["started"]),
        problems=cells(problems, {"error": "error"}) if not problems.empty else None,
        problem_counts=overview.problem_counts(problems),
        by_design=overview.by_design(runs, measures),
        metadata=cells(overview.metadata_table(runs)),
    )
    path = Path(files["report"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def build(results: Path) -> None:
    """The steps before the report, in the Snakefile's order, each with its files under ``results``."""
    for step in (aggregate, tables, figures):
        step.write(cli.defaults(step.FILES, results))


def main(argv: list[str] | None = None) -> None:
    """Command line: by hand, rebuild everything and render; ``--render-only`` renders; prints the path."""
    parser = cli.parser(
        "Render the HTML report. By hand (without --render-only) aggregate, tables and "
        "figures run first, each with its files under --results.",
        FILES,
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="render from the files named here and recompute nothing (the report rule)",
    )
    args = parser.parse_args(argv)
    if not args.render_only:
        named = [name for name in FILES if getattr(args, name) is not None]
        if named:
            parser.error(
                f"--{named[0].replace('_', '-')} goes with --render-only; without it every file "
                "is where --results puts it"
            )
        build(args.results)
    print(render(cli.resolve(args, FILES)))


if __name__ == "__main__":
    main()
