"""The self-contained HTML comparison report, regenerated from ``results/`` alone.

:func:`render` rebuilds every product of the analysis (``tables/*.csv|md``, ``figures/*.png|svg``)
and then writes ``report.html``: one file with inline CSS, the PNG figures embedded as base64
``data:`` URIs, no scripts and no links out, so it opens offline and can be mailed or archived as
is. Its order is the order a reader asks in:

1. Summary: per suite, task, node count and condition, the algorithm with the smallest median time
   to target and its speed-up over DDP.
2. One section per suite: the time-to-target table (k/n converged, min–max, speed-up, final and
   best metric, throughput, communication share), scaling across node counts, throughput with and
   without stragglers, DASO's global synchronisations, and the figures.
3. The performance profile over all workloads (AlgoPerf-style).
4. Paper vs this suite, one subsection per paper.
5. The runs that did not converge, failed or are unfinished; the run metadata.

Simulated times carry "(simulated)" wherever they are shown and are never divided by wall-clock
times. Run as ``python -m analysis.report --results DIR``; it prints the report's path.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from analysis import aggregate, dana, figures, papers, profile, scaling, stragglers, tables, traces
from analysis.aggregate import CONDITION, INCOMPLETE, parse_results

METADATA_FIELDS = ["python", "torch", "torchvision", "numpy", "wandb", "mpi4py", "horovod",
                   "git_commit", "git_dirty", "hosts", "backend", "launcher", "slurm_job_id",
                   "device", "cuda", "nccl", "platform", "clock"]
SECTIONS = ["Summary", "Performance profile", "Paper vs this suite",
            "Runs that did not converge or failed", "Run metadata"]
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222;
       padding: 0 1em; line-height: 1.4; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2.2em; border-bottom: 1px solid #aaa; }
h3 { margin-top: 1.6em; } nav ul { columns: 2; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #eef1f5; position: sticky; top: 0; } tr:nth-child(even) td { background: #fafafa; }
td.error { white-space: pre-wrap; font-family: monospace; font-size: 0.85em; max-width: 60em; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; } .note { color: #555; font-size: 0.95em; }
.winner { font-weight: 600; } details { margin: 0.8em 0; } summary { cursor: pointer; color: #245; }
dl.paper dt { font-weight: 600; float: left; clear: left; width: 9em; } dl.paper dd { margin-left: 10em; }
"""


def html_table(frame: pd.DataFrame, classes: dict[str, str] | None = None) -> str:
    """Render a frame as an escaped HTML table; ``classes`` maps a column to a cell class."""
    classes = classes or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row):
            text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else value
            css = f' class="{classes[column]}"' if column in classes else ""
            cells.append(f"<td{css}>{html.escape(str(text))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _h2(title: str) -> str:
    return f'<h2 id="{_anchor(title)}">{html.escape(title)}</h2>'


def _layout(nodes: object, procs: object) -> str:
    return f"{nodes}×{procs}"


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per suite, task, node count and condition: the fastest algorithm to target, its speed-up."""
    rows = []
    for key, group in table.groupby(tables.GROUP + CONDITION, sort=True):
        suite, task, nodes, procs, straggler, clock = key
        reached = group[group["k"] > 0]
        simulated = " (simulated)" if clock == "simulated" else ""
        row = {"suite": suite, "task": task, "nodes×procs": _layout(nodes, procs),
               "stragglers": straggler}
        if reached.empty:
            row.update({"fastest to target": "none reached the target", "median time (s)": "—",
                        "converged (k/n)": "—", "speed-up vs DDP": "—"})
        else:
            best = reached.loc[reached["tta_median_s"].idxmin()]
            speedup = best["speedup_vs_ddp"]
            row.update({
                "fastest to target": best["algorithm"],
                "median time (s)": f"{best['tta_median_s']:.1f}{simulated}",
                "converged (k/n)": best["k/n"],
                "speed-up vs DDP": ("— (no DDP time)" if pd.isna(speedup)
                                    else f"{speedup:.2f}×{simulated}"),
            })
        rows.append(row)
    return pd.DataFrame(rows)


def problem_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs that failed, did not reach the target, or are unfinished: run_id, status, error."""
    bad = runs[~tables.converged(runs)].sort_values(["suite", "run_id"])
    status = [
        "completed (target not reached)" if s == "completed" else str(s) for s in bad["status"]
    ]
    return pd.DataFrame({"suite": bad["suite"].astype(str), "run_id": bad["run_id"].astype(str),
                         "status": status, "error": bad["error"].fillna("").astype(str)})


def metadata_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Each environment field with its distinct values over all runs (fields no run has are left out)."""
    rows = []
    for field in METADATA_FIELDS:
        values = runs[field].dropna().astype(str)
        if field == "hosts":  # union of the hosts, not of the host lists
            values = pd.Series([h for v in values for h in v.split(",") if h])
        distinct = sorted(set(values))
        if distinct:
            rows.append({"field": field, "values": ", ".join(distinct)})
    return pd.DataFrame(rows, columns=["field", "values"])


def _figure(path: Path, caption: str) -> str:
    """An ``<img>`` embedding ``path`` as a base64 data URI, or nothing if it was not drawn."""
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _syncs_section(syncs: pd.DataFrame) -> str:
    """DASO's global synchronisations beside DDP's one per step."""
    shown = syncs.drop(columns=["suite"]).assign(**{
        "syncs": syncs["syncs"].map("{:.0f}".format),
        "steps (DDP syncs)": syncs["steps"].map("{:.0f}".format),
        "MB over inter-node links": (syncs["sync_bytes"] / 1e6).map("{:.1f}".format),
        "saved vs DDP": syncs["saved vs DDP"].map("{:.0%}".format)}).drop(
            columns=["steps", "sync_bytes"])
    return ("<h3>Global synchronisations</h3><p class=\"note\">Median over seeds of the run's global "
            "(cross-node) synchronisations; DDP makes one per step.</p>" + html_table(shown))


def _suite_section(suite: str, table: pd.DataFrame, figure_dir: Path,
                   syncs: pd.DataFrame | None, all_suites: pd.DataFrame) -> str:
    """One suite's heading, tables and figures; ``all_suites`` supplies the straggler pairs."""
    shown = tables.display_table(table).drop(columns=["suite"])
    parts = [_h2(f"Suite: {suite}"), "<h3>Time to target</h3>",
             '<p class="note">Median over the seeds that reached the target, min–max beside; '
             "k/n converged over finished seeds; speed-up = DDP's median time / the algorithm's, "
             "same task, layout and conditions. Final and best metric, throughput and "
             "communication share are medians over finished runs.</p>", html_table(shown)]
    finished = table[table["n"] > 0]
    parts.append("<h3>Validation metric against wall time</h3>")
    for (task, nodes, procs), _ in finished.groupby(["task", "nodes", "procs_per_node"], sort=True):
        parts.append(_figure(figure_dir / f"{figures.figure_stem(suite, task, nodes, procs)}.png",
                             f"{suite}: {task} on {nodes}×{procs} workers, median and min–max "
                             "over seeds; dashed: target"))
    scale = scaling.scaling(finished)
    parts.append("<h3>Scaling across node counts</h3>")
    if finished["nodes"].nunique() > 1:
        parts.append('<p class="note">Against each algorithm\'s smallest node count: speed-up and '
                     "parallel efficiency (speed-up over the ideal ratio of workers), from time to "
                     "target and from throughput.</p>" + html_table(scaling.display(scale)))
    else:
        parts.append('<p class="note">One node count in this suite: add node counts to the '
                     "matrix to see speed-up and parallel efficiency.</p>")
    for task in sorted(finished["task"].unique()):
        parts.append(_figure(figure_dir / f"{scaling.figure_stem(suite, task)}.png",
                             f"{suite}: {task}, median time to target against node count "
                             "(log–log, min–max bars, dotted: ideal scaling)"))
    parts.append("<h3>Throughput with and without stragglers</h3>")
    pooled = stragglers.straggler_throughput(all_suites)
    layouts = set(zip(finished["task"], finished["nodes"], finished["procs_per_node"]))
    pooled = pooled[[k in layouts for k in zip(pooled["task"], pooled["nodes"],
                                               pooled["procs_per_node"])]]
    straggling = stragglers.display(pooled)
    if not straggling.empty:
        parts.append(html_table(straggling))
    else:
        parts.append('<p class="note">No runs with stragglers for these tasks yet: run a matrix '
                     "with <code>set: {straggler: fixed}</code> (or gamma) beside this one.</p>")
    for task in sorted(finished["task"].unique()):
        parts.append(_figure(figure_dir / f"{stragglers.figure_stem(suite, task)}.png",
                             f"{suite}: {task}, median throughput per straggler condition"))
    if syncs is not None and not syncs.empty and (syncs["suite"] == suite).any():
        parts.append(_syncs_section(syncs[syncs["suite"] == suite]))
    parts.append("<h3>The algorithms' own traces</h3>")
    for (task, nodes, procs), _ in finished.groupby(["task", "nodes", "procs_per_node"], sort=True):
        parts.append(_figure(figure_dir / f"{traces.figure_stem(suite, task, nodes, procs)}.png",
                             f"{suite}: {task} on {nodes}×{procs}: every extra numeric column of "
                             "metrics.csv per algorithm, by epoch"))
    return "\n".join(parts)


def _profile_section(table: pd.DataFrame, figure_dir: Path) -> str:
    ratios = profile.ratios(table[table["n"] > 0])
    parts = [_h2("Performance profile"),
             '<p class="note">AlgoPerf-style: a workload is one suite, task, layout and straggler '
             "condition; ρ(τ) is the share of workloads on which an algorithm's median time to "
             "target is within τ× the fastest algorithm's there. Not converged, or not run, "
             "counts as infinitely slow. Score: area under ρ over τ in [1, 4], normalised. "
             "Simulated and wall-clock times are profiled apart.</p>"]
    if ratios.empty:
        return "\n".join(parts + ["<p>No finished runs.</p>"])
    parts.append(html_table(profile.display(profile.profile(ratios))))
    parts.append(_figure(figure_dir / f"{profile.FIGURE_STEM}.png",
                         "Performance profile: share of workloads within τ× the fastest"))
    return "\n".join(parts)


def hardware_here(runs: pd.DataFrame) -> str:
    """The suite's hardware in one line: devices, host count and backends over the runs."""
    def distinct(column: str) -> str:
        return "/".join(sorted(set(runs[column].dropna().astype(str)))) or "unknown"

    hosts = {h for v in runs["hosts"].dropna().astype(str) for h in v.split(",") if h}
    if runs["world_size"].dropna().empty:
        return "no runs yet"
    return (f"{distinct('device')} on {len(hosts)} host{'s' if len(hosts) != 1 else ''}, "
            f"{distinct('backend')} backend, largest job {int(runs['world_size'].max())} processes")


def _paper_section(paper: papers.Paper, table: pd.DataFrame, hardware: str) -> str:
    meta = paper.meta
    compared = papers.compare(paper, table)
    shown = papers.display(compared)
    measured = compared["deviation"].notna()
    here = sorted({m for m in compared["measured_on"] if m})
    ref = re.sub(r"^https?://", "", meta.get("url", ""))  # as text: the report links nowhere
    rows = [("Paper", f"{meta['title']}. {meta['authors']}. {meta['venue']}." + (f" {ref}" if ref else "")),
            ("Hardware", f"paper: {meta['hardware']}; here: {hardware}"),
            ("Scale", f"paper: {meta['scale']}; here: {', '.join(here) if here else 'no matching runs yet'}"),
            ("Software", meta["software"]),
            ("Measure", meta["measure"]),
            ("Differences", meta["differences"]),
            ("Matrix", meta.get("matrix") or "none in config/ yet")]
    parts = [f'<h3 id="paper-{paper.key}">{html.escape(meta["title"])}</h3>', '<dl class="paper">']
    parts += [f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows]
    parts.append("</dl>")
    if measured.any():
        parts.append(f"<p>{int(measured.sum())} of the paper's {len(compared)} numbers measured "
                     "here (deviation: ratios relative, percentages in points):</p>")
        parts.append(html_table(shown[measured]))
    else:
        parts.append(f"<p>None of the paper's {len(compared)} numbers is measured by the runs "
                     "in results/ yet.</p>")
    parts.append(f"<details><summary>All {len(compared)} published numbers, with their source"
                 f"</summary>{html_table(shown)}</details>")
    return "\n".join(parts)


def render_html(runs: pd.DataFrame, table: pd.DataFrame, figure_dir: Path,
                syncs: pd.DataFrame | None = None,
                paper_list: list[papers.Paper] | None = None,
                dana_tables: list[tuple[str, pd.DataFrame]] | None = None) -> str:
    """The whole report as one HTML string."""
    finished = int((runs["status"] != INCOMPLETE).sum())
    simulated = bool((runs["clock"] == "simulated").any())
    suites = sorted(table["suite"].unique())
    contents = ["Summary", *[f"Suite: {s}" for s in suites], *SECTIONS[1:]]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Data-parallel training: time-to-accuracy report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Data-parallel training: time-to-accuracy report</h1>",
        f'<p class="note">{len(runs)} runs in {len(suites)} suite(s): {finished} finished, '
        f"{len(runs) - finished} running or incomplete. Runs that did not converge are never "
        "dropped: they count in k/n and as infinitely slow in the profile."
        + (" Times on the simulator's virtual clock are marked (simulated) and never divided by "
           "wall-clock times." if simulated else "") + "</p>",
        "<nav><ul>" + "".join(f'<li><a href="#{_anchor(t)}">{html.escape(t)}</a></li>'
                              for t in contents) + "</ul></nav>",
        _h2("Summary"),
    ]
    summary = summary_table(table)
    if summary.empty:
        parts.append("<p>No runs found.</p>")
    else:
        lines = []
        for row in summary.itertuples(index=False):
            fastest = row[4]
            if row[5] == "—":
                lines.append(f"<li>{html.escape(row[1])} ({html.escape(row[0])}, "
                             f"{html.escape(row[2])}): no algorithm reached the target.</li>")
            else:
                lines.append(f"<li>{html.escape(row[1])} ({html.escape(row[0])}, {html.escape(row[2])}"
                             + ("" if row[3] == "none" else f", stragglers {html.escape(row[3])}")
                             + f'): <span class="winner">{html.escape(fastest)}</span> is fastest '
                             f"to target, in {html.escape(row[5])} s; speed-up over DDP "
                             f"{html.escape(row[7])}.</li>")
        parts.append("<ul>" + "".join(lines) + "</ul>")
        parts.append(html_table(summary))
    for suite in suites:
        parts.append(_suite_section(str(suite), table[table["suite"] == suite], figure_dir, syncs,
                                    table))
    parts.append(_profile_section(table, figure_dir))
    parts.append(_h2("Paper vs this suite"))
    parts.append('<p class="note">The papers\' published numbers (analysis/papers/, each with its '
                 "source) beside the same quantity measured here: on the paper's workload where "
                 "the suite ran it, otherwise on a substitute, where only ratios (speed-ups, time "
                 "reductions) compare. Papers measure total time for a fixed epoch budget; so do "
                 "these ratios (median run wall time).</p>")
    for paper in paper_list if paper_list is not None else papers.load_papers():
        parts.append(_paper_section(paper, table, hardware_here(runs)))
    if dana_tables:
        parts.append(_dana_section(dana_tables))
    parts.append(_h2("Runs that did not converge or failed"))
    problems = problem_runs(runs)
    parts.append(html_table(problems, {"error": "error"}) if not problems.empty
                 else "<p>Every run reached the target.</p>")
    parts.append(_h2("Run metadata"))
    parts.append(html_table(metadata_table(runs)))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _dana_section(dana_tables: list[tuple[str, pd.DataFrame]]) -> str:
    """DANA's table: final accuracy and gap per algorithm and worker count beside the paper's."""
    parts = ["<h3>DANA: final accuracy and gap per worker count, beside the paper</h3>",
             f"<p>{html.escape(dana.verdict(dana_tables))} Accuracies are medians over seeds (fractions "
             "here, percent in the paper's columns); the gap is the run's mean RMS distance between the "
             "master's vector and the vector each gradient was computed on. On an embedded task the "
             "paper's CIFAR-10 ResNet-20 numbers stand beside it for the shape of the trend only.</p>"]
    for title, frame in dana_tables:
        shown = frame.copy()
        for column in shown.columns:
            if column.endswith(" gap"):
                shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v:.2e}")
            elif column.endswith(" acc"):
                shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
        parts.append(f"<p><b>{html.escape(title)}</b></p>" + html_table(shown))
    return "\n".join(parts)


def render(results: Path) -> Path:
    """Regenerate the tables, figures and ``report.html`` from ``results`` alone.

    Args:
        results: The results directory (the one holding ``runs/``).

    Returns:
        The path of the written ``report.html``.
    """
    results = Path(results)
    runs, curves = aggregate.write_tables(results)
    table = tables.write_tables(results, runs)
    figures.write_figures(results, runs, curves)
    path = results / "report.html"
    syncs = tables.global_syncs(curves)
    dana_tables = dana.comparison(runs, curves)
    if dana_tables:
        pd.concat([t.assign(setting=title) for title, t in dana_tables]).to_csv(
            results / "tables" / "dana.csv", index=False)
    path.write_text(render_html(runs, table, results / "figures", syncs, dana_tables=dana_tables),
                    encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    """Command line: regenerate everything and print the report's path."""
    print(render(parse_results("Regenerate tables, figures and the HTML report.", argv)))


if __name__ == "__main__":
    main()
