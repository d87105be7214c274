"""The registry of tables and figures (analysis/artefacts.py): every entry loads and has its caption,
each reads only what is made before it, the Snakefile's analysis rules spell no file of their own, and
a table with a section of its own is shown in the report with the figures that read it."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis import artefacts, report

ROOT = Path(__file__).resolve().parents[2]


def test_every_entry_loads_and_its_caption_file_exists():
    for entry in [*artefacts.AGGREGATES, *artefacts.TABLES, *artefacts.FIGURES]:
        assert callable(artefacts.load(entry.make)), entry.name
        if entry.kind == artefacts.TABLE:
            assert callable(artefacts.load(entry.read)), entry.name
            assert entry.file.startswith("tables/"), entry.name
        if entry.caption or entry.kind == artefacts.FIGURE:  # Snakemake's report needs one for each figure
            assert (ROOT / entry.caption_path()).is_file(), entry.caption_path()
    captions = {p.name for p in (ROOT / artefacts.CAPTIONS).glob("*.rst")}
    named = {e.caption for e in [*artefacts.TABLES, *artefacts.FIGURES] if e.caption}
    assert captions - named == {"workflow.rst"}  # the workflow's own; no caption left without its entry


def test_each_entry_reads_only_what_is_made_before_it():
    made = {"runs", "curves", *artefacts.SOURCES}
    for entry in artefacts.TABLES:
        assert set(entry.reads) <= made, f"{entry.name} reads {set(entry.reads) - made}, made later or never"
        assert entry.name not in made, f"{entry.name} is made twice"
        made.add(entry.name)
    for entry in artefacts.FIGURES:
        assert set(entry.reads) <= made - set(artefacts.SOURCES), entry.name
    assert len({f.name for f in artefacts.FIGURES}) == len(artefacts.FIGURES)


def test_the_analysis_rules_spell_no_table_figure_or_caption_of_their_own():
    """Every file the Snakefile's analysis rules declare comes from the registry: their text names none
    (tests/workflow/test_workflow.py checks the commands the dry run prints against the registry)."""
    rules = (ROOT / "rules/analysis.smk").read_text()
    code = "\n".join(line.split("#")[0] for line in rules.splitlines())
    assert not re.search(r"tables/|\w+\.csv\"|figures/|captions/(?!workflow\.rst)", code), "a file spelt in the rules"
    for entry in [*artefacts.TABLES, *artefacts.FIGURES]:
        assert not re.search(rf"[\"']{entry.name}[\"']|\b{entry.name}=", code), entry.name


def test_a_table_with_a_section_of_its_own_is_shown_with_its_figures(tmp_path, monkeypatch):
    """A new pair needs no change to the report: its table, caption and figures come from the registry."""
    pd.DataFrame({"suite": ["s"], "share": [0.25]}).to_csv(tmp_path / "new.csv", index=False)
    figure = tmp_path / "s__digits__n1x2__metric_vs_time.png"
    figure.write_bytes(b"\x89PNG")
    entry = artefacts.table("new", "analysis.tables:global_syncs", ("curves",), section="Something new")
    monkeypatch.setattr(artefacts, "TABLES", [*artefacts.TABLES, entry])
    drawn = artefacts.Artefact(**{**vars(artefacts.BY_FIGURE["metric_vs_time"]), "reads": ("new",)})
    monkeypatch.setattr(artefacts, "FIGURES", [drawn])
    (section,) = report.own_sections({"new": tmp_path / "new.csv"}, report.Figures([figure]))
    assert section["title"] == "Something new" and section["table"]["rows"] == [["s", "0.25"]]
    assert section["caption"] == "" and [f["caption"] for f in section["figures"]] == [report.caption_text(drawn)]
    assert section["figures"][0]["caption"].startswith("Validation")  # the figure's caption file, as one paragraph
