"""DANA's comparison: final accuracy and gap per algorithm and worker count, beside the paper's table.

The DANA paper reports, per worker count N, the final test accuracy of each asynchronous algorithm
(Tables 2-4 and 6, mean ± std over 5 seeds) and claims an ordering: DANA-DC and DANA-Slim keep
their accuracy as N grows, while NAG-ASGD collapses from 12-16 workers on. This module builds the
same table from the suite's runs of the asynchronous family (simulated or real; never pooled) and
says, per N, whether the ordering DANA-DC ≥ DANA-Slim > NAG-ASGD holds here. The gap is the mean
over a run's evaluations of ``metrics.csv``'s ``gap`` column (RMS distance between the master's
vector and the one a gradient was computed on), medianed over seeds.
"""

from __future__ import annotations

import pandas as pd

from analysis import papers

ASYNC = ["dana_dc", "dana_slim", "dana_zero", "dc_asgd", "multi_asgd", "nag_asgd", "asgd", "allreduce", "ddp"]
PAPER_TABLES = {"cifar10_resnet20": "Table 2", "cifar10_wrn16_4": "Table 3", "cifar100_wrn16_4": "Table 4"}
TOLERANCE = 0.005  # accuracies this close (half a point) count as a tie in the ordering check


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
    """One ``(title, table)`` per (suite, task, clock, straggler) holding asynchronous runs.

    Table rows are worker counts; columns per algorithm: ``<algo> acc`` (median final metric over
    seeds, with k/n converged), ``<algo> gap``, ``paper <algo>`` where the paper has the number, and
    ``ordering`` (whether DANA-DC ≥ DANA-Slim > NAG-ASGD holds at that N).
    """
    mine = runs[runs["algorithm"].isin(ASYNC) & runs["status"].isin(["completed", "diverged"])].copy()
    if mine.empty or not mine["algorithm"].isin(["dana_dc", "dana_slim", "dana_zero"]).any():
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
        table["ordering"] = [_ordering(table.loc[n]) for n in table.index]
        source = (f"paper: {PAPER_TABLES.get(task, 'Table 2 (CIFAR-10 ResNet-20)')}"
                  if not paper.empty else "no paper numbers for this task")
        label = "simulated" if clock == "simulated" else "wall clock"
        out.append((f"{suite} · {task} · {label} · stragglers {straggler} ({source})", table.reset_index()))
    return out


def _ordering(row: pd.Series) -> str:
    """Whether DANA-DC ≥ DANA-Slim > NAG-ASGD holds for this row's final accuracies."""
    try:
        dc, slim, nag = (float(row[f"{a} acc"]) for a in ("dana_dc", "dana_slim", "nag_asgd"))
    except KeyError:
        return "n/a"
    if any(pd.isna(v) for v in (dc, slim, nag)):
        return "n/a"
    holds = dc >= slim - TOLERANCE and slim > nag + TOLERANCE
    return "holds" if holds else "does not hold"


def verdict(tables: list[tuple[str, pd.DataFrame]], min_workers: int = 16) -> str:
    """One sentence: does the paper's ordering hold at ``min_workers`` or more workers, here?"""
    rows = [r for _, t in tables for _, r in t.iterrows() if r["workers"] >= min_workers and r["ordering"] != "n/a"]
    if not rows:
        return f"No runs with {min_workers} or more workers of DANA-DC, DANA-Slim and NAG-ASGD yet."
    held = sum(r["ordering"] == "holds" for r in rows)
    return (f"The paper's ordering (DANA-DC ≥ DANA-Slim > NAG-ASGD in final accuracy, ties within "
            f"{TOLERANCE:.1%}) holds here in {held} of {len(rows)} settings with {min_workers}+ workers.")
