"""The self-contained HTML comparison report, regenerated from ``results/`` alone.

:func:`render` rebuilds every product of the analysis (``tables/runs.csv``, ``tables/curves.csv``,
``tables/time_to_target.csv|md``, ``figures/*.png|svg``) and then writes ``report.html``: one file
with inline CSS, the PNG figures embedded as base64 ``data:`` URIs and no scripts, so it can be
mailed or archived as is. It opens with a summary naming, per suite, task and node count, the
algorithm with the smallest median time to target and its speed-up over DDP; then one section per
suite (table and figures), the runs that did not converge, failed or are unfinished, and the run
metadata (versions, hosts, commit, backend, launcher), deduplicated.

Run as ``python -m analysis.report --results DIR``; it prints the report's path.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from analysis import aggregate, figures, tables
from analysis.aggregate import INCOMPLETE, parse_results

METADATA_FIELDS = ["python", "torch", "hosts", "git_commit", "backend", "launcher",
                   "slurm_job_id", "clock"]
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2em; border-bottom: 1px solid #aaa; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } tr:nth-child(even) td { background: #fafafa; }
td.error { white-space: pre-wrap; font-family: monospace; font-size: 0.85em; max-width: 60em; }
figure { margin: 1em 0; } img { max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
.note { color: #555; }
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


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per suite, task and node count: the fastest algorithm to target and its speed-up over DDP."""
    rows = []
    for (suite, task, nodes, procs), group in table.groupby(tables.GROUP, sort=True):
        reached = group[group["k"] > 0]
        row = {"suite": suite, "task": task, "nodes×procs": f"{nodes}×{procs}"}
        if reached.empty:
            row.update({"fastest to target": "none reached the target", "median time (s)": "—",
                        "converged (k/n)": "—", "speed-up vs DDP": "—"})
        else:
            best = reached.loc[reached["tta_median_s"].idxmin()]
            clock = " (simulated)" if "simulated" in best["clock"] else ""
            speedup = best["speedup_vs_ddp"]
            row.update({
                "fastest to target": best["algorithm"],
                "median time (s)": f"{best['tta_median_s']:.1f}{clock}",
                "converged (k/n)": best["k/n"],
                "speed-up vs DDP": "— (no DDP time)" if pd.isna(speedup) else f"{speedup:.2f}×",
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
    """Each environment field with its distinct values over all runs."""
    rows = []
    for field in METADATA_FIELDS:
        values = runs[field].dropna().astype(str)
        if field == "hosts":  # union of the hosts, not of the host lists
            values = pd.Series([h for v in values for h in v.split(",") if h])
        distinct = sorted(set(values))
        rows.append({"field": field, "values": ", ".join(distinct) if distinct else "—"})
    return pd.DataFrame(rows)


def _figure(path: Path, caption: str) -> str:
    """An ``<img>`` embedding ``path`` as a base64 data URI."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _syncs_section(syncs: pd.DataFrame) -> str:
    """DASO's global synchronisations beside DDP's one per step."""
    shown = syncs.drop(columns=["suite"]).assign(**{
        "syncs": syncs["syncs"].map("{:.0f}".format), "steps (DDP syncs)": syncs["steps"].map("{:.0f}".format),
        "MB over inter-node links": (syncs["sync_bytes"] / 1e6).map("{:.1f}".format),
        "saved vs DDP": syncs["saved vs DDP"].map("{:.0%}".format)}).drop(columns=["steps", "sync_bytes"])
    return ("<h3>Global synchronisations</h3><p class=\"note\">Median over seeds of the run's global "
            "(cross-node) synchronisations; DDP makes one per step.</p>" + html_table(shown))


def _suite_section(suite: str, table: pd.DataFrame, figure_dir: Path, syncs: pd.DataFrame | None = None) -> str:
    """One suite's heading, time-to-target table, global syncs (if any) and figures."""
    shown = tables.display_table(table).drop(columns=["suite"])
    parts = [f"<h2>Suite: {html.escape(suite)}</h2>", "<h3>Time to target</h3>", html_table(shown)]
    if syncs is not None and not syncs.empty and (syncs["suite"] == suite).any():
        parts.append(_syncs_section(syncs[syncs["suite"] == suite]))
    parts.append("<h3>Validation metric against wall time</h3>")
    for (task, nodes, procs), _ in table.groupby(["task", "nodes", "procs_per_node"], sort=True):
        png = figure_dir / f"{figures.figure_stem(suite, task, nodes, procs)}.png"
        if png.is_file():
            parts.append(_figure(png, f"{suite}: {task} on {nodes}×{procs} workers"))
    return "\n".join(parts)


def render_html(runs: pd.DataFrame, table: pd.DataFrame, figure_dir: Path,
                syncs: pd.DataFrame | None = None) -> str:
    """The whole report as one HTML string."""
    finished = int((runs["status"] != INCOMPLETE).sum())
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>Time-to-accuracy report</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>Time-to-accuracy report</h1>",
        f'<p class="note">{len(runs)} runs: {finished} finished, {len(runs) - finished} running or '
        "incomplete. Times are medians over the seeds that reached the target (min–max beside), "
        "k/n counts converged over finished seeds, and speed-ups are against DDP on the same task "
        "and node count. Runs that did not converge are never dropped.</p>",
        "<h2>Summary</h2>",
    ]
    summary = summary_table(table)
    parts.append(html_table(summary) if not summary.empty else "<p>No runs found.</p>")
    for suite, suite_table in table.groupby("suite", sort=True):
        parts.append(_suite_section(str(suite), suite_table, figure_dir, syncs))
    parts.append("<h2>Runs that did not converge or failed</h2>")
    problems = problem_runs(runs)
    parts.append(html_table(problems, {"error": "error"}) if not problems.empty
                 else "<p>Every run reached the target.</p>")
    parts.append("<h2>Run metadata</h2>")
    parts.append(html_table(metadata_table(runs)))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


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
    path.write_text(render_html(runs, table, results / "figures", syncs), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    """Command line: regenerate everything and print the report's path."""
    print(render(parse_results("Regenerate tables, figures and the HTML report.", argv)))


if __name__ == "__main__":
    main()
