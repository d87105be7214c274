"""DANA's comparison: final accuracy and gap per algorithm and worker count, beside the paper's table.

The DANA paper reports, per worker count N, the final test accuracy of each asynchronous algorithm
(Tables 2-4 and 6, mean ± std over 5 seeds) and claims an ordering: DANA-DC and DANA-Slim keep
their accuracy as N grows, while NAG-ASGD collapses from 12-16 workers on. This module builds the
same table from the suite's runs of the asynchronous family (simulated or real; never pooled) and
says, per N, whether the paper's ordering holds here: each DANA variant run (DANA-DC, DANA-Slim)
at least as accurate as each of its baselines run (DC-ASGD, Multi-ASGD, NAG-ASGD), ties within
``TOLERANCE``; the cell names the pairs that break it. Where no algorithm compared trained (every
final accuracy at most ``UNTRAINED``: the 10-class tasks' chance is 0.1), the order of numbers that
differ by noise says nothing, and the cell says so instead of "holds". The gap is the mean
over a run's evaluations of ``metrics.csv``'s ``gap`` column (RMS distance between the master's
vector and the one a gradient was computed on), medianed over seeds.

The tables step writes the tables to one CSV (:func:`cell_rows`) and the report reads them back
(:func:`read`), so that the report renders them without computing them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import papers

CELLS = ["setting", "workers", "column", "value"]  # the CSV's columns: one row per cell of a table
ASYNC = ["dana_dc", "dana_slim", "dana_zero", "dc_asgd", "multi_asgd", "nag_asgd", "asgd", "allreduce", "ddp"]
PAPER_TABLES = {"cifar10_resnet20": "Table 2", "cifar10_wrn16_4": "Table 3", "cifar100_wrn16_4": "Table 4"}
TOLERANCE = 0.005  # accuracies this close (half a point) count as a tie in the ordering check
UNTRAINED = 0.2  # a final accuracy at or below this is near chance (0.1 on the 10-class tasks): nothing trained
AT_CHANCE = "n/a: every algorithm near chance"


def _paper_numbers(task: str, straggler: str) -> pd.DataFrame:
    """The paper's final accuracies (%) for ``task`` per (workers, algorithm), or an empty frame."""
    found = [p.numbers for p in papers.load_papers() if p.key == "dana"]
    if not found:
        return pd.DataFrame()
    numbers = found[0]
    kind = "gamma_het" if straggler.startswith("gamma_het") else "gamma"
    rows = numbers[(numbers["quantity"] == "final_metric") & (numbers["straggler"] == kind)]
    if task in PAPER_TABLES or kind == "gamma_het":
        rows = rows[rows["task"] == (task if task in PAPER_TABLES else "cifar10_resnet20")]
    else:  # an embedded task: set Table 2 (ResNet-20, CIFAR-10) beside it
        rows = rows[rows["task"] == "cifar10_resnet20"]
    return rows


def comparison(runs: pd.DataFrame, curves: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One ``(title, table)`` per (suite, task, clock, straggler) of a suite that runs a DANA variant.

    Table rows are worker counts; columns per algorithm: ``<algo> acc`` (median final metric over
    seeds, with k/n converged), ``<algo> gap``, ``paper <algo>`` where the paper has the number, and
    ``ordering`` (whether every DANA variant is at least as accurate as every baseline at that N).
    """
    # A suite is DANA's comparison when it runs a DANA variant, whether or not those runs finished:
    # another paper's suite that runs allreduce or DDP (DASO's, WAGMA's) gets no table here.
    dana_suites = set(runs.loc[runs["algorithm"].isin(["dana_dc", "dana_slim", "dana_zero"]), "suite"])
    mine = runs[
        runs["algorithm"].isin(ASYNC) & runs["status"].isin(["completed", "diverged"]) & runs["suite"].isin(dana_suites)
    ].copy()
    if mine.empty:
        return []
    # A parameter server's world holds one master: N workers = world - 1 on the wall clock.
    server = (mine["clock"] == "wall") & ~mine["algorithm"].isin(["allreduce", "ddp"])
    mine["workers"] = mine["world_size"] - server.astype(int)
    gaps = pd.DataFrame(columns=["run_id", "suite", "gap"])
    if "gap" in curves.columns:
        gaps = curves.groupby(["suite", "run_id"], as_index=False)["gap"].mean()
    mine = mine.merge(gaps, on=["suite", "run_id"], how="left")
    out = []
    for (suite, task, clock, straggler), group in mine.groupby(["suite", "task", "clock", "straggler"]):
        paper = _paper_numbers(task, straggler)
        table = pd.DataFrame(index=sorted(group["workers"].unique()))
        table.index.name = "workers"
        algos = [a for a in ASYNC if a in set(group["algorithm"])]
        for algo in algos:
            per = group[group["algorithm"] == algo].groupby("workers")
            table[f"{algo} acc"] = per["final_metric"].median()
            table[f"{algo} gap"] = per["gap"].median()
            if not paper.empty:
                p = paper[paper["algorithm"] == algo].set_index("workers")["value"]
                if not p.empty:
                    table[f"paper {algo}"] = p.reindex(table.index)
        dana_columns = [c for c in table.columns if c.startswith("dana_") and c.endswith(" acc")]
        table = table[table[dana_columns].notna().any(axis=1)]  # a worker count without DANA runs says nothing
        table["ordering"] = [ordering(table.loc[n]) for n in table.index]
        source = (
            f"paper: {PAPER_TABLES.get(task, 'Table 2 (CIFAR-10 ResNet-20)')}"
            if not paper.empty
            else "no paper numbers for this task"
        )
        label = "simulated" if clock == "simulated" else "wall clock"
        out.append((f"{suite} · {task} · {label} · stragglers {straggler} ({source})", table.reset_index()))
    return out


DANA = ("dana_dc", "dana_slim")
BASELINES = ("dc_asgd", "multi_asgd", "nag_asgd")


def ordering(row: pd.Series) -> str:
    """Whether every DANA variant's median final accuracy is at least every baseline's (ties within
    ``TOLERANCE``); "does not hold" names the pairs that break it, "n/a" where either side is missing,
    ``AT_CHANCE`` where no accuracy is above ``UNTRAINED``."""

    def acc(algo: str) -> float | None:
        value = row.get(f"{algo} acc")
        return None if value is None or pd.isna(value) else float(value)

    dana = {a: acc(a) for a in DANA if acc(a) is not None}
    baselines = {b: acc(b) for b in BASELINES if acc(b) is not None}
    if not dana or not baselines:
        return "n/a"
    if max(*dana.values(), *baselines.values()) <= UNTRAINED:
        return AT_CHANCE
    broken = [f"{a} < {b}" for a, v in dana.items() for b, w in baselines.items() if v < w - TOLERANCE]
    return "holds" if not broken else "does not hold: " + ", ".join(broken)


def cell_rows(tables: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """:func:`comparison`'s tables as one CSV's rows, one per cell (``CELLS``), in the tables' order.

    The settings' tables have columns of their own (the algorithms run there, the paper's numbers),
    which one wide CSV would pad with empty cells that read back as missing values in a column the
    table has; a row per cell keeps each table's columns, empty ones included. A table without rows
    (no worker count with a DANA run) keeps its columns as rows without workers.
    """
    rows = []
    for title, table in tables:
        columns = [c for c in table.columns if c != "workers"]
        values = [(n, c, v) for n, row in table.set_index("workers").iterrows() for c, v in row.items()]
        rows += [
            {"setting": title, "workers": n, "column": c, "value": v}
            for n, c, v in values or [(None, c, None) for c in columns]
        ]
    return pd.DataFrame(rows, columns=CELLS).astype({"workers": "Int64"})  # a table without rows has none


def table(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """The registry's DANA table: :func:`comparison`'s tables as :func:`cell_rows` (no rows without
    runs of the asynchronous family)."""
    return cell_rows(comparison(runs, curves))


def read(path: Path) -> list[tuple[str, pd.DataFrame]]:
    """Read back the tables that :func:`cell_rows` laid out, each with its columns in their order and
    its numbers as numbers (``ordering`` stays text)."""
    rows = pd.read_csv(
        path,
        dtype={"setting": str, "workers": "Int64", "column": str, "value": str},
        keep_default_na=False,  # "n/a" is an ordering, not a missing value
        na_values={"workers": [""], "value": [""]},
    )
    out = []
    for title, group in rows.groupby("setting", sort=False):
        filled = group.dropna(subset=["workers"])
        table = filled.pivot(index="workers", columns="column", values="value").reindex(
            index=filled["workers"].unique(), columns=group["column"].unique()
        )
        for column in table.columns:
            if column != "ordering":
                table[column] = pd.to_numeric(table[column])
        out.append((title, table.rename_axis(index="workers", columns=None).reset_index()))
    return out


def verdict(tables: list[tuple[str, pd.DataFrame]], min_workers: int = 16) -> str:
    """One sentence: does the paper's ordering hold at ``min_workers`` or more workers, here?"""
    rows = [
        r
        for _, t in tables
        for _, r in t.iterrows()
        if r["workers"] >= min_workers and not r["ordering"].startswith("n/a")
    ]
    if not rows:
        chance = any(
            r["ordering"] == AT_CHANCE for _, t in tables for _, r in t.iterrows() if r["workers"] >= min_workers
        )
        if chance:
            return f"With {min_workers} or more workers every algorithm is near chance here: no ordering to read."
        return f"No runs with {min_workers} or more workers of a DANA variant and its baselines yet."
    held = sum(r["ordering"] == "holds" for r in rows)
    return (
        f"The paper's ordering (every DANA variant at least as accurate as DC-ASGD, Multi-ASGD and "
        f"NAG-ASGD in final accuracy, ties within {TOLERANCE:.1%}) holds here in {held} of {len(rows)} "
        f"settings with {min_workers}+ workers."
    )
