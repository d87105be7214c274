"""The report opens in headless Chromium: every image loads, the expected sections are there, and
the first screen answers without scrolling.

Run directories are generated here (converged, non-converged, failed without metrics, unfinished,
a suite with and without stragglers, two node counts, an algorithm with its own columns, and two
suites without a target as the default's claims run them: WAGMA's of one-epoch runs read for their
seconds a step, DANA's read for their final accuracy), the report is rendered with
``python -m analysis.report`` as a user would, and the page is opened from disk with the network cut,
so an external asset would fail to load. The claims table names those two suites, as the tables step
writes it where their runs meet a claim's conditions, and the figures and the report are made again
from it. On a 1400x900 window every claim's verdict and the opening figure, which shows every suite by
its measure, must be in view before any scrolling; in the full page no figure may be empty by design.
A full-page screenshot, every fold open, is saved in the test's directory and copied to
``results/screenshots/report_browser.png`` to be looked at.

The browser is Debian's ``chromium`` driven by Playwright (``envs/install.sh`` installs both; no
browser is downloaded at test time). ``CHROMIUM`` overrides the executable's path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import sync_playwright

from analysis import claims
from tests.analysis.test_analysis import write_run

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "results" / "screenshots" / "report_browser.png"
EXPECTED_SECTIONS = [
    "Claims",
    "Summary",
    "Suite: dana-claims-16",
    "Suite: local",
    "Suite: local-stragglers",
    "Suite: wagma-claims-64",
    "Performance profile",
    "Virtual cluster against measurements",
    "Virtual cluster against this machine",
    "Paper vs this suite",
    "Runs that did not converge or failed",
    "Run metadata",
]


# Each claim's verdict badge, then the opening figure: its text and whether it lies whole inside the
# window as it opens.
FIRST_SCREEN = """
Array.from(document.querySelectorAll('details.claim .badge, section.first img')).map(b => {
  const r = b.getBoundingClientRect();
  return {text: b.textContent || b.alt, inView: r.width > 0 && r.top >= 0 && r.left >= 0
          && r.bottom <= window.innerHeight && r.right <= window.innerWidth};
})
"""
EMPTY_FIGURE_PX = 200  # plotting.empty_figure is 1.6 inches high at 110 dpi, 176 pixels; every drawn figure is taller


def _chromium() -> str:
    """Path of the Chromium executable: ``CHROMIUM``, else the first one on PATH."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "No Chromium found: run envs/install.sh (it installs Debian's chromium) or set "
            "CHROMIUM to the browser's path."
        )
    return path


def _make_results(root: Path) -> Path:
    """Run directories covering what the report must show."""
    daso = {"B": [0.0, 2.0, 4.0], "S": [0.0, 1.0, 2.0]}
    for nodes, scale in ((1, 1.0), (2, 0.6)):
        for seed in range(2):
            write_run(
                root,
                "ddp",
                seed,
                status="completed",
                tta=10.0 * scale + seed,
                nodes=nodes,
                walls=[5.0 * scale, 10.0 * scale + seed, 15.0 * scale],
                metrics=[0.6, 0.92, 0.95],
            )
            write_run(
                root,
                "daso",
                seed,
                status="completed",
                tta=8.0 * scale + seed,
                nodes=nodes,
                walls=[4.0 * scale, 8.0 * scale + seed, 12.0 * scale],
                metrics=[0.7, 0.93, 0.96],
                extra=daso,
            )
    write_run(
        root, "local_sgd", 0, status="completed", tta=None, walls=[4.0, 8.0, 12.0], metrics=[0.5, 0.7, 0.8]
    )  # completed without reaching the target
    write_run(
        root,
        "local_sgd",
        1,
        status="failed",
        tta=None,
        walls=[],
        metrics=[],
        error="RuntimeError: Connection closed by peer (rank 3)",
    )
    write_run(root, "local_sgd", 2, status=None, tta=None, walls=[3.0], metrics=[0.4])  # unfinished
    simulated = {"straggler": "fixed", "straggler_ranks": 2, "straggler_delay_ms": 320.0, "clock": "simulated"}
    for algorithm, step in (("wagma", 0.78), ("local_sgd", 0.80), ("allreduce", 1.27)):
        for seed in range(3):  # one epoch, one evaluation at chance: the claims read the seconds a step
            write_run(
                root, algorithm, seed, status="completed", tta=None, suite="wagma-claims-64", nodes=32,
                clock="simulated", settings=simulated, walls=[10.0], metrics=[0.1], step_s=step + 0.01 * seed,
            )  # fmt: skip
    gamma = {"straggler": "gamma", "clock": "simulated"}
    for algorithm, final in (("dana_dc", 0.65), ("nag_asgd", 0.11)):
        for seed in range(3):  # the claims read the final accuracy; the simulator's counter is no trace
            write_run(
                root, algorithm, seed, status="completed", tta=None, suite="dana-claims-16", nodes=8,
                clock="simulated", settings=gamma, walls=[1.0, 2.0], metrics=[0.3, final + 0.01 * seed],
                extra={"gap": [0.01, 0.02], "sim_compute_s": [1.0, 2.0]},
            )  # fmt: skip
    fixed = {"straggler": "fixed", "straggler_ranks": 1, "straggler_delay_ms": 50.0}
    for algorithm, throughput in (("ddp", 60.0), ("daso", 90.0)):  # against 150 without, in the same suite
        for seed, settings, speed in ((0, None, 150.0), (1, fixed, throughput)):
            write_run(
                root,
                algorithm,
                seed,
                status="completed",
                tta=20.0,
                suite="local-stragglers",
                settings=settings,
                throughput=speed,
                walls=[10.0, 20.0],
                metrics=[0.8, 0.95],
            )
    return root


def _claimed(claims_csv: Path) -> None:
    """Name the two suites without a target in the claims table, as the tables step does where their
    runs meet a claim's conditions: WAGMA's seconds a step, DANA's final accuracy."""
    verdicts = pd.read_csv(claims_csv, keep_default_na=False)
    for quantity, algorithm, suite in (
        ("throughput_speedup", "wagma", "wagma-claims-64"),
        ("final_metric_above", "dana_dc", "dana-claims-16"),
    ):
        mine = verdicts.index[(verdicts["quantity"] == quantity) & (verdicts["algorithm"] == algorithm)]
        verdicts.loc[mine, "suite"] = suite
    verdicts.to_csv(claims_csv, index=False)


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    results = _make_results(tmp_path / "results")
    done = subprocess.run(
        [sys.executable, "-m", "analysis.report", "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = results / "report.html"
    assert Path(done.stdout.strip()) == report
    _claimed(results / "tables" / "claims.csv")
    for step in (["analysis.figures"], ["analysis.report", "--render-only"]):
        again = subprocess.run(
            [sys.executable, "-m", *step, "--results", str(results)], cwd=ROOT, capture_output=True, text=True
        )
        assert again.returncode == 0, again.stderr[-3000:]

    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.on("request", lambda request: requests.append(request.url))
            page.goto(report.as_uri(), wait_until="load")
            verdicts = page.evaluate(FIRST_SCREEN)
            first = tmp_path / "first-screen.png"
            page.screenshot(path=str(first))
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            images = page.evaluate(
                "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"
            )
            instead = page.evaluate("Array.from(document.querySelectorAll('p.no-figure')).map(p => p.textContent)")
            headings = page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
            summary = page.inner_text("#summary + ul")
            page_text = page.inner_text("body")
            problems = page.evaluate(
                "document.getElementById('runs-that-did-not-converge-or-failed').nextElementSibling.innerText"
            )
            sections = page.evaluate(
                "Object.fromEntries(Array.from(document.querySelectorAll('details.suite'))"
                ".map(d => [d.querySelector('h2').id, d.innerText]))"
            )
            widths = page.evaluate(  # each suite's time-to-target table: its width, and the page's
                "Array.from(document.querySelectorAll('details.suite'))"
                ".map(d => [d.querySelector('h2').id, d.querySelector('h3 + p + div.table, h3 + p + p + div.table')"
                ".scrollWidth, document.body.clientWidth])"
            )
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()

    # Every image is embedded and decodes: 2 layouts x (metric, traces) + scaling and stragglers
    # per suite and task + the profile.
    assert len(images) >= 8, images
    assert all(complete and width > 0 for _, complete, width, _ in images), images
    # No figure empty by design: a sentence in its place (WAGMA's one-evaluation curves, the traces of
    # a suite where no algorithm logs a column of its own), and no empty figure among the images.
    assert all(height > EMPTY_FIGURE_PX for _, _, _, height in images), images
    assert sum("every run was evaluated once" in text for text in instead) == 2, instead  # time and bytes
    assert sum("no algorithm here logs a column of its own" in text for text in instead) == 2, instead
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []
    assert headings == EXPECTED_SECTIONS
    # daso is fastest on every layout: median of 4.8 and 5.8 s against DDP's 6.0 and 7.0 s on two nodes.
    # The median of a resample of two is one of them or their mean: intervals [4.8, 5.8] and, for the
    # ratio, 6.0 / 5.8 to 7.0 / 4.8 (each end with probability 1/16 > 0.025).
    assert "daso is fastest to target, in 5.3 s [4.8, 5.8]; speed-up over DDP 1.23× [1.03, 1.46]" in summary
    assert "digits__local_sgd__n1x2__s1" in problems and "Connection closed by peer" in problems
    assert "completed (target not reached)" in problems and "running/incomplete" in problems
    with_stragglers = sections["suite-local-stragglers"].split("Throughput with and without stragglers")[1]
    assert "40%" in with_stragglers and "60%" in with_stragglers  # ddp keeps 60/150, daso 90/150
    local = sections["suite-local"]
    assert "No run of this suite has stragglers" in local.split("Throughput with and without stragglers")[1]
    assert "nothing to scale" in sections["suite-local-stragglers"]  # one node count: a sentence, no figure
    # A suite's time-to-target table fits the 1400-pixel window: what every row shares is said once.
    assert all(table <= page_width for _, table, page_width in widths), widths
    assert "Every row: task digits" in local
    # Suites without a target by what they measure: in the summary, their tables, out of "did not converge"
    assert "measured by its seconds a step (no target): wagma is fastest, 0.79 s a step" in summary
    assert "measured by its final metric (no target): dana_dc ends highest, at 0.660" in summary
    assert "wagma-claims-64" not in problems and "dana-claims-16" not in problems
    wagma = sections["suite-wagma-claims-64"]
    assert "By its seconds a step: the suite has no target" in wagma and "converged (k/n)" not in wagma
    assert wagma.index("\nwagma\t") < wagma.index("\nlocal_sgd\t") < wagma.index("\nallreduce\t")  # by the measure
    dana_text = page_text.split("DANA: final accuracy")[1]
    assert "dana_dc accuracy (%)" in dana_text and "66.0" in dana_text and "parameter distance" in dana_text
    # The first screen holds every claim's verdict, whole, and the figure of every suite by its measure.
    *verdicts, first_figure = verdicts
    assert len(verdicts) == len(claims.load())
    assert all(box["inView"] and box["text"] == "not measured" for box in verdicts), verdicts
    assert first_figure["inView"], first_figure
    for said in ("dana-claims-16: final metric", "local: time to target", "wagma-claims-64: seconds a step"):
        assert said in first_figure["text"]
    assert first.stat().st_size > 10_000
    assert shot.stat().st_size > 10_000
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENSHOT)
