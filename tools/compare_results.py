"""Compare two results folders' tables cell by cell: the check that a change to the analysis changed
no number.

    python -m tools.compare_results results-before results-after

Reads ``tables/*.csv`` of both folders (``validation.csv`` among them where present) as text, so
that ``0.1`` and ``0.10000000000000001`` differ as the files do, and prints every difference: a
table in one folder only, a column in one only, a different row count, and each cell that differs
(table, row, column, both values). Exits 1 when there is any, 0 when every table is the same. A
column's place is not compared, only its name and values: tables are read by column name.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

TABLES = "tables"
SHOWN = 20  # cell differences printed per table; the count says how many more


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def compare_table(name: str, a: Path, b: Path) -> list[str]:
    """The differences between two CSV files, one line each."""
    (columns_a, rows_a), (columns_b, rows_b) = _read(a), _read(b)
    found = [f"{name}: column {c!r} only in the first" for c in columns_a if c not in columns_b]
    found += [f"{name}: column {c!r} only in the second" for c in columns_b if c not in columns_a]
    if len(rows_a) != len(rows_b):
        found.append(f"{name}: {len(rows_a)} rows against {len(rows_b)}")
    common = [c for c in columns_a if c in columns_b]
    cells = [
        f"{name}: row {i + 1}, column {c!r}: {row_a[c]!r} against {row_b[c]!r}"
        for i, (row_a, row_b) in enumerate(zip(rows_a, rows_b))
        for c in common
        if row_a[c] != row_b[c]
    ]
    found += cells[:SHOWN]
    if len(cells) > SHOWN:
        found.append(f"{name}: {len(cells) - SHOWN} more cells differ")
    return found


def compare(first: Path, second: Path) -> list[str]:
    """Every difference between the two folders' ``tables/*.csv``, one line each (none: the same)."""
    names_a = {p.name for p in (Path(first) / TABLES).glob("*.csv")}
    names_b = {p.name for p in (Path(second) / TABLES).glob("*.csv")}
    found = [f"{name}: only in {first}" for name in sorted(names_a - names_b)]
    found += [f"{name}: only in {second}" for name in sorted(names_b - names_a)]
    for name in sorted(names_a & names_b):
        found += compare_table(name, Path(first) / TABLES / name, Path(second) / TABLES / name)
    return found


def main(argv: list[str] | None = None) -> int:
    """Command line: print the differences, or that there are none; 1 when any."""
    parser = argparse.ArgumentParser(description="Compare two results folders' tables/*.csv cell by cell.")
    parser.add_argument("first", type=Path, help="a results folder (with tables/)")
    parser.add_argument("second", type=Path, help="the other")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not (folder / TABLES).is_dir():
            parser.error(f"{folder} has no {TABLES}/ folder; give a results folder")
    found = compare(args.first, args.second)
    for line in found:
        print(line)
    tables = len(
        {p.name for p in (args.first / TABLES).glob("*.csv")} | {p.name for p in (args.second / TABLES).glob("*.csv")}
    )
    print(f"{len(found)} difference{'s' * (len(found) != 1)} over {tables} tables")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
