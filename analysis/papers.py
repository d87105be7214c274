"""The papers' published numbers beside this suite's: deviation, and what differs.

``analysis/papers/papers.yaml`` describes each paper (hardware, scale, how it measured) and names
a CSV of its numbers, one per row with its source (table, figure or text) and whether it was read
from a plot (column meanings in the YAML's header). :func:`compare` finds, for each number, the
suite's measurement of the same quantity:

- on the paper's own workload (``task``) at the paper's worker count when such runs exist, and
  then every quantity compares;
- otherwise on a substitute task under the paper's conditions (its worker count and straggler
  kind, real or simulated), wall clock first. Dimensionless quantities (speed-ups, time reductions,
  throughput ratios) then still compare; accuracies and absolute times do not (a different task,
  different hardware), and the row says so instead of printing a meaningless deviation.
- a number whose conditions no run has is "not measured under its conditions", with no deviation.
  The claims (``analysis/claims.py``) go further: they name every setting their runs must have.

The papers' speed-ups are ratios of total training time for a fixed epoch budget, so the suite's
are too: the median ``wall_s`` of the baseline over the algorithm's, on the same layout, condition
and clock. A paper's straggler setting (WAGMA's 320 ms delays) is matched where the suite has runs
with stragglers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

PAPERS_DIR = Path(__file__).resolve().parent / "papers"
RATIOS = {"speedup", "time_reduction", "throughput_speedup"}
ABSOLUTE = {"time", "throughput"}  # tied to the paper's hardware: shown, never compared


@dataclass(frozen=True)
class Paper:
    """One paper: its description (``papers.yaml``) and its numbers (the CSV it names)."""

    key: str
    meta: dict[str, str]
    numbers: pd.DataFrame


def load_meta(path: Path = PAPERS_DIR / "papers.yaml") -> dict[str, dict[str, str]]:
    """Each paper's description in ``papers.yaml``, by key, in the file's order."""
    meta = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return {key: {k: str(v) for k, v in entry.items()} for key, entry in meta.items()}


def _read_numbers(path: Path, numeric: tuple[str, ...]) -> pd.DataFrame:
    """A CSV of published numbers: text stays text (a missing baseline is ""), ``numeric`` NaN where empty."""
    return pd.read_csv(
        path,
        dtype={"algorithm": str, "baseline": str, "task": str},
        keep_default_na=False,
        na_values={column: [""] for column in numeric},
    )


def load_papers(directory: Path = PAPERS_DIR) -> list[Paper]:
    """Read ``papers.yaml`` and each paper's CSV; a missing CSV is an error naming the file."""
    papers = []
    for key, meta in load_meta(Path(directory) / "papers.yaml").items():
        path = Path(directory) / meta["data"]
        if not path.is_file():
            raise FileNotFoundError(
                f"papers.yaml: paper {key!r} names {path}, which does not exist; add the CSV or fix its ``data`` entry."
            )
        papers.append(Paper(key, meta, _read_numbers(path, ("value", "workers", "spread"))))
    return papers


def read_compared(path: Path) -> pd.DataFrame:
    """Read back ``papers.csv``: every paper's :func:`compare` rows, with the paper's key in ``paper``."""
    return _read_numbers(path, ("value", "workers", "spread", "suite_value", "deviation"))


def _median(rows: pd.DataFrame, column: str) -> float:
    values = rows[column].dropna()
    return float(values.median()) if len(values) else math.nan


def _suite_value(quantity: str, alg: pd.DataFrame, base: pd.DataFrame | None) -> float:
    """The suite's value of ``quantity`` from time-to-target rows of the algorithm (and baseline)."""
    if quantity == "final_metric":
        return 100.0 * _median(alg, "final_metric_median")  # accuracies: percent, as the papers
    if base is None or base.empty:
        return math.nan
    if quantity == "speedup":
        return _median(base, "wall_median_s") / _median(alg, "wall_median_s")
    if quantity == "time_reduction":
        return 100.0 * (1.0 - _median(alg, "wall_median_s") / _median(base, "wall_median_s"))
    if quantity == "throughput_speedup":
        return _median(alg, "throughput_median") / _median(base, "throughput_median")
    return math.nan


def _where(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    clock = " (simulated)" if first["clock"] == "simulated" else ""
    stragglers = "" if first["straggler"] == "none" else f", stragglers {first['straggler']}"
    layout = f"{first['nodes']}×{first['procs_per_node']}"
    return f"{first['suite']}: {first['task']} on {layout}{stragglers}{clock}"


def _candidates(table: pd.DataFrame, number: pd.Series) -> tuple[pd.DataFrame, bool, bool]:
    """The rows of one layout and condition that measure ``number``; whether on its workload; and
    whether under its conditions (its worker count and straggler kind)."""
    finished = table[table["n"] > 0]
    needed = [number["algorithm"]] + ([number["baseline"]] if number["baseline"] else [])
    wanted = "none" if number["straggler"] in ("", "none") else number["straggler"]
    layouts = []
    keys = ["suite", "task", "nodes", "procs_per_node", "straggler", "clock", "time_model"]
    for key, rows in finished.groupby(keys):
        if not set(needed) <= set(rows["algorithm"]):
            continue
        suite, task, nodes, ppn, straggler, clock, _ = key
        workers = int(nodes) * int(ppn)
        same_task = bool(number["task"]) and task == number["task"]
        same_size = pd.notna(number["workers"]) and workers == int(number["workers"])
        kind_matches = str(straggler).split()[0] == wanted  # "fixed 2×320 ms": the kind, then its size
        conditions = same_size and kind_matches
        # Order: the paper's workload and conditions, its conditions, wall clock, then the largest.
        rank = (not (same_task and conditions), not conditions, not same_task, clock != "wall", -workers)
        layouts.append((rank, same_task and same_size, conditions, rows))
    if not layouts:
        return finished.iloc[0:0], False, False
    layouts.sort(key=lambda item: item[0])
    _, exact, conditions, rows = layouts[0]
    return rows, exact, conditions


def compare(paper: Paper, table: pd.DataFrame) -> pd.DataFrame:
    """One row per published number, with the suite's value where it measured the same thing.

    Args:
        paper: A paper from :func:`load_papers`.
        table: The time-to-target table (:func:`analysis.tables.time_to_target`).

    Returns:
        The paper's columns plus ``suite_value``, ``deviation`` (for ratios: suite / paper - 1;
        for percentages: suite - paper, in points; NaN where not comparable), ``measured_on``
        and ``comparison`` (``same workload``, ``substituted workload``, or why there is none).
    """
    rows = []
    for _, number in paper.numbers.iterrows():
        out = number.to_dict()
        out.update({"suite_value": math.nan, "deviation": math.nan, "measured_on": ""})
        quantity = number["quantity"]
        if quantity in ABSOLUTE:
            out["comparison"] = "absolute, on the paper's hardware (compare the ratios)"
        elif not number["algorithm"]:
            out["comparison"] = "not in the suite"
        elif number["algorithm"] == number["baseline"]:
            out["comparison"] = "two settings of one algorithm: not in the suite's matrix"
        elif number["paper_baseline"] and not number["baseline"]:
            out["comparison"] = f"baseline {number['paper_baseline']} not in the suite"
        else:
            candidates, exact, conditions = _candidates(table, number)
            if candidates.empty:
                out["comparison"] = "not run yet"
            elif not conditions:  # another worker count or straggler setting: no deviation to show
                out["comparison"] = "not measured under its conditions"
            else:
                alg = candidates[candidates["algorithm"] == number["algorithm"]]
                base = candidates[candidates["algorithm"] == number["baseline"]] if number["baseline"] else None
                value = _suite_value(quantity, alg, base)
                if not (exact or quantity in RATIOS):  # e.g. digits accuracy against ImageNet's
                    out["comparison"] = "not comparable: the paper's workload is not run yet"
                elif pd.isna(value):
                    out["measured_on"] = _where(candidates)
                    out["comparison"] = "not measurable from these runs"
                else:
                    out["measured_on"] = _where(candidates)
                    out["suite_value"] = value
                    out["comparison"] = "same workload" if exact else "substituted workload"
                    out["deviation"] = deviation(quantity, float(number["value"]), value)
        rows.append(out)
    return pd.DataFrame(rows)


def table(papers_yaml: Path, time_to_target: pd.DataFrame) -> pd.DataFrame:
    """The registry's papers table: every published number of the papers beside ``papers_yaml``
    compared with the suite's (:func:`compare`), a ``paper`` column saying whose."""
    compared = [
        compare(paper, time_to_target).assign(paper=paper.key) for paper in load_papers(Path(papers_yaml).parent)
    ]
    return pd.concat(compared, ignore_index=True)


def deviation(quantity: str, paper: float, suite: float) -> float:
    """How far the suite is from the paper: relative for ratios, in points for percentages.

    Ratios (``speedup``, ``throughput_speedup``) give ``suite / paper - 1``; ``time_reduction`` and
    ``final_metric`` are percentages and give ``suite - paper`` points; times give the ratio - 1.
    """
    if quantity in ("time_reduction", "final_metric"):
        return suite - paper
    return suite / paper - 1.0


def display(compared: pd.DataFrame) -> pd.DataFrame:
    """The comparison for people: one formatted row per published number."""

    def fmt(value: float, unit: str) -> str:
        if pd.isna(value):
            return "—"
        if unit == "x":
            return f"{value:.2f}×"
        if unit == "%":
            return f"{value:.2f} %"
        return f"{value:g} {unit}"

    def dev(value: float, quantity: str) -> str:
        if pd.isna(value):
            return "—"
        if quantity in ("time_reduction", "final_metric"):
            return f"{value:+.1f} pp"
        return f"{value:+.0%}"

    source = [
        s + (" (read from plot)" if str(p).lower() == "true" else "")
        for s, p in zip(compared["source"], compared["from_plot"])
    ]
    what = [f"{a} vs {b}" if b else a for a, b in zip(compared["paper_algorithm"], compared["paper_baseline"])]
    return pd.DataFrame(
        {
            "source": source,
            "setting": compared["setting"],
            "what": what,
            "quantity": compared["quantity"].str.replace("_", " "),
            "paper": [
                fmt(v, u) + (f" ± {s:g}" if pd.notna(s) else "")
                for v, u, s in zip(compared["value"], compared["unit"], compared["spread"])
            ],
            "this suite": [fmt(v, u) for v, u in zip(compared["suite_value"], compared["unit"])],
            "deviation": [dev(v, q) for v, q in zip(compared["deviation"], compared["quantity"])],
            "measured on": compared["measured_on"],
            "comparison": compared["comparison"],
            "note": compared["note"],
        }
    )
