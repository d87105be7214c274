"""The papers' claims with verdicts: each claim of ``analysis/papers/claims.yaml`` against the runs
made under its conditions.

A claim names the settings its runs must have (``requires``: layout, clock, network, stragglers, the
time model). Only runs that have every one of them count, so a paper's number is never set against
a measurement made under other conditions: a claim with no such runs is "not measured", with the
config that makes them. The algorithm's and the baseline's runs are paired by seed (same stragglers,
same data order, same arrival schedule).

- A ratio (``throughput_speedup``: seconds per step; ``speedup``: total time of the same epochs,
  the papers' measure) is the median over seeds of the paired ratios, with a 95 % percentile
  bootstrap interval over seeds (``analysis/intervals.py``). It
  holds when the interval lies on the paper's side of 1, does not hold when it lies on the other
  side, and is inconclusive otherwise.
- An ordering (``final_metric_above``) is the share of seeds in which it holds: the claim holds at
  80 % or more, does not at 20 % or less, and is inconclusive in between.

A verdict needs ``MIN_SEEDS`` paired seeds; with fewer the value is shown and the verdict is
inconclusive, saying why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.intervals import median_interval
from analysis.papers import PAPERS_DIR

CLAIMS = PAPERS_DIR / "claims.yaml"
MIN_SEEDS = 5
HOLDS, FAILS, INCONCLUSIVE, UNMEASURED = "holds", "does not hold", "inconclusive", "not measured"
RATIOS = {"throughput_speedup", "speedup"}
ORDERINGS = {"final_metric_above"}
COLUMNS = [
    "paper", "id", "claim", "source", "paper_value", "value", "low", "high", "verdict", "why", "seeds",
    "clock", "conditions", "setting", "experiment", "suite",
]  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """One claim of ``claims.yaml`` (its header says what each field means)."""

    paper: str
    id: str
    claim: str
    source: str
    conditions: str
    requires: dict[str, object]
    experiment: str
    quantity: str
    algorithm: str
    baseline: str
    paper_value: str
    setting: str
    expect: str = "above"


def load(path: Path = CLAIMS) -> list[Claim]:
    """Every claim, paper by paper in the file's order; an unknown quantity is an error naming the choices."""
    claims = []
    for paper, entries in yaml.safe_load(Path(path).read_text(encoding="utf-8")).items():
        for entry in entries:
            claim = Claim(paper=paper, **entry)
            if claim.quantity not in RATIOS | ORDERINGS:
                raise ValueError(
                    f"claim {claim.id}: quantity {claim.quantity!r} is not one of {sorted(RATIOS | ORDERINGS)}"
                )
            claims.append(claim)
    return claims


def ratio_verdict(low: float, high: float, expect: str = "above") -> str:
    """Holds when the interval lies on the paper's side of 1, does not when on the other side."""
    above, below = low > 1.0, high < 1.0
    if expect == "below":
        above, below = below, above
    return HOLDS if above else FAILS if below else INCONCLUSIVE


def ordering_verdict(share: float) -> str:
    """Holds in at least 80 % of the seeds, does not in at most 20 %; inconclusive in between."""
    return HOLDS if share >= 0.8 else FAILS if share <= 0.2 else INCONCLUSIVE


def run_config(run_dir: str) -> dict[str, object]:
    """A run's ``config.json``, its settings, hyper-parameters and knobs merged into one mapping."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    merged = {**config.get("algorithm_params", {}), **config.get("hparams", {}), **config.get("settings", {})}
    return {**merged, **{k: config[k] for k in ("task", "nodes", "procs_per_node", "seed") if k in config}}


def matches(row: pd.Series, config: dict[str, object], requires: dict[str, object]) -> bool:
    """Whether a run has every required setting: from its ``config.json``, else its ``runs.csv`` row
    (the layout, the device). A key that neither has is another algorithm's knob, which binds only
    the runs of that algorithm (Horovod's ``fp16_compression``, not DASO's runs); a run without a
    ``config.json`` cannot show its conditions and never matches."""
    if not config:
        return False
    for key, want in requires.items():
        if key not in config and key not in row.index:
            continue
        have = config[key] if key in config else row.get(key)
        if isinstance(want, int | float) and not isinstance(want, bool):
            try:
                if not np.isclose(float(have), float(want)):
                    return False
            except (TypeError, ValueError):
                return False
        elif str(have) != str(want):
            return False
    return True


def _per_seed(runs: pd.DataFrame, claim: Claim) -> pd.DataFrame:
    """The algorithm's and the baseline's finished runs under the claim's conditions, paired by seed."""
    finished = runs[
        runs["status"].isin(["completed", "diverged"]) & runs["algorithm"].isin([claim.algorithm, claim.baseline])
    ]
    keep = [matches(row, run_config(row["run_dir"]), claim.requires) for _, row in finished.iterrows()]
    chosen = finished[pd.Series(keep, index=finished.index, dtype=bool)].copy()
    chosen["step_s"] = chosen["wall_s"] / chosen["steps"]
    value = {"throughput_speedup": "step_s", "speedup": "wall_s", "final_metric_above": "final_metric"}[claim.quantity]
    # paired within a suite: one suite's runs of a seed share stragglers, data order and settings
    wide = chosen.pivot_table(index=["suite", "seed"], columns="algorithm", values=value, aggfunc="first")
    if claim.algorithm not in wide or claim.baseline not in wide:
        return pd.DataFrame(columns=["algorithm", "baseline", "suite"])
    paired = pd.DataFrame({"algorithm": wide[claim.algorithm], "baseline": wide[claim.baseline]}).dropna()
    paired["suite"] = ", ".join(sorted(paired.index.get_level_values("suite").unique()))
    paired.attrs["clock"] = ", ".join(sorted(chosen["clock"].astype(str).unique()))
    return paired


def evaluate(claim: Claim, runs: pd.DataFrame) -> dict[str, object]:
    """The claim's row of the verdict table."""
    row = {
        c: getattr(claim, c)
        for c in ("paper", "id", "claim", "source", "paper_value", "conditions", "setting", "experiment")
    }
    paired = _per_seed(runs, claim) if not runs.empty else pd.DataFrame()
    n = len(paired)
    row.update(value=None, low=None, high=None, seeds=n, clock=paired.attrs.get("clock", ""), suite="")
    if n == 0:
        return {**row, "verdict": UNMEASURED, "why": f"no runs under its conditions: run {claim.experiment}"}
    row["suite"] = paired["suite"].iloc[0]
    if claim.quantity in RATIOS:
        # the baseline's time over the algorithm's: above 1, the algorithm is faster
        ratios = (paired["baseline"] / paired["algorithm"]).tolist()
        row["value"] = float(np.median(ratios))
        row["low"], row["high"] = median_interval(ratios)
        verdict = ratio_verdict(row["low"], row["high"], claim.expect)
    else:
        row["value"] = float((paired["algorithm"] > paired["baseline"]).mean())
        verdict = ordering_verdict(row["value"])
    if n < MIN_SEEDS:
        return {**row, "verdict": INCONCLUSIVE, "why": f"{n} seeds; a verdict needs {MIN_SEEDS}"}
    return {**row, "verdict": verdict, "why": magnitude(claim.paper_value, row["low"], row["high"])}


def magnitude(paper_value: str, low: float | None, high: float | None) -> str:
    """Where the paper's own ratio (``"1.26x"``) lies against the interval: a claim can hold in its
    direction and still be far from the paper's size. Empty for values that are not one ratio."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)x", paper_value.strip())
    if match is None or low is None:
        return ""
    value = float(match[1])
    where = "inside" if low <= value <= high else "above" if value > high else "below"
    return f"the paper's {value:g}x lies {where} the interval"


def table(runs: pd.DataFrame, claims: list[Claim] | None = None) -> pd.DataFrame:
    """Every claim's verdict, in ``claims.yaml``'s order."""
    rows = [evaluate(claim, runs) for claim in (load() if claims is None else claims)]
    return pd.DataFrame(rows, columns=COLUMNS)


def read(path: Path) -> pd.DataFrame:
    """Read back the table that ``analysis.tables`` wrote."""
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in ("value", "low", "high")})
