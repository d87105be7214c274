"""tools/compare_results.py: the same tables are no difference; a changed cell, row or table is one."""

from __future__ import annotations

from pathlib import Path

from tools import compare_results


def _folder(root: Path, tables: dict[str, str]) -> Path:
    (root / "tables").mkdir(parents=True)
    for name, text in tables.items():
        (root / "tables" / name).write_text(text)
    return root


def test_the_same_tables_are_no_difference_and_a_changed_cell_is_one(tmp_path, capsys):
    same = {"a.csv": "x,y\n1,0.5\n2,0.25\n", "validation.csv": "case,error\nc,0.1\n"}
    first, second = _folder(tmp_path / "a", same), _folder(tmp_path / "b", same)
    assert compare_results.main([str(first), str(second)]) == 0
    assert "0 differences over 2 tables" in capsys.readouterr().out
    (second / "tables" / "a.csv").write_text("x,y\n1,0.5\n2,0.250001\n3,1\n")
    (second / "tables" / "validation.csv").unlink()
    assert compare_results.compare(first, second) == [
        f"validation.csv: only in {first}",
        "a.csv: 2 rows against 3",
        "a.csv: row 2, column 'y': '0.25' against '0.250001'",
    ]
    assert compare_results.main([str(first), str(second)]) == 1
