"""The README stays short and dated-measurement free; the reference documentation builds strictly.

The README answers a newcomer's first questions in at most 200 lines; measurements with their
command, date and machine live on one page of the documentation (``docs/measurements.md``), since
numbers that change from machine to machine are printed by the commands that measure them. The
documentation is built with ``mkdocs build --strict``: a broken link or anchor, a page missing from
the nav, or a generated table whose code moved fails it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 200
FIRST_COMMANDS = (
    "./envs/install.sh && .venv/bin/snakemake --cores all",
    "./envs/install.sh && .venv/bin/python -m pytest -q",
)

# A dated measurement: a calendar date, a duration in minutes and seconds, or a measurement said to
# be taken here, on a day, on a machine or on a fresh clone.
DATED = [
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    re.compile(r"\b\d+(\.\d+)? ?min(utes?)? \d+ ?s\b"),
    re.compile(r"\bmeasured\b.{0,80}\b(here|today|on (a|an|the|this)\b|day|machine|clone)", re.IGNORECASE),
    re.compile(r"\b(this|an earlier|another|a faster|a slower) (day|day's|machine|machine's)\b", re.IGNORECASE),
]


def dated_lines(text: str) -> list[str]:
    """The lines of ``text`` that hold a dated or machine-bound measurement."""
    return [line for line in text.splitlines() if any(p.search(line) for p in DATED)]


def test_readme_is_at_most_200_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_holds_no_dated_measurement() -> None:
    found = dated_lines(README.read_text())
    assert not found, "dated measurements belong in docs/measurements.md:\n" + "\n".join(found)


def test_the_rule_catches_a_dated_measurement() -> None:
    assert dated_lines("verdict: measured here on a fresh clone, 6 min 18 s on 2 cores")
    assert dated_lines("at 16 x 4, 3 rounds, 2026-11-26): allreduce 1.19x")
    assert dated_lines("An earlier day's machine took 8 min 8 s for the first 93 runs")
    assert not dated_lines("Each run is one sbatch job; 10 minutes before its time limit it checkpoints.")


def test_readme_starts_with_the_two_commands() -> None:
    """CI runs the README's second command; both stay the first lines of its first code block."""
    text = README.read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert block and text.index(block.group(0)) < text.index("\n## ")
    commands = [line.partition("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands[:2] == list(FIRST_COMMANDS)


def test_readme_links_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for page in ("index.html", "algorithms/wagma/index.html", "measurements/index.html"):
        assert (tmp_path / "site" / page).is_file()
    knobs = (tmp_path / "site" / "algorithms" / "wagma" / "index.html").read_text()
    assert "global_period" in knobs and "<!-- gen:" not in knobs  # the hook filled the knob table
