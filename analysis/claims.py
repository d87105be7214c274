"""The papers' claims with verdicts: each claim of ``analysis/papers/claims.yaml`` against the runs
made under its conditions.

A claim names the settings its runs must have (``requires``: layout, clock, network, stragglers, the
time model, the device that ran). Only runs that have every one of them count, so a paper's number is
never set against a measurement made under other conditions: a claim with no such runs is "not
measured", with the config that makes them.

Each (conditions, algorithm, seed) counts once. Two runs whose ``config.json`` agree on everything
but the suite's name and the output folder are one observation, whichever suites hold them; the
algorithm's and the baseline's runs pair where they share the seed, the layout, the task and every
run setting (same stragglers, same data order, same arrival schedule); a seed with several such
pairs gives one value, their median.

- A ratio (``throughput_speedup``: seconds per step; ``speedup``: total time of the same epochs,
  the papers' measure) is computed per seed over pairs in which both runs completed: a diverged or
  failed run is never fast, and the row counts the runs that did not finish. The value is the median
  over seeds, with the exact order-statistic interval of that median (``analysis/intervals.py``;
  its real coverage for n seeds is in the row).
- An ordering (``final_metric_above``) is judged per seed on the final metric (a diverged run keeps
  the metric it had: failing to train is what some of these claims are about); the value is the
  median gap over seeds, with the same interval.

The verdicts, the rule that ``claims.yaml``'s header and the README state:

- *reproduced*: a ratio on the paper's side of 1 whose interval, widened by ``TOLERANCE`` (10 %) on
  each side, holds the paper's value (for a range, meets it; a claim that gives no size needs the
  side only); an ordering that holds in every seed with a median gap between half and twice the
  paper's (a far larger gap is another effect: the baseline fails where the paper's trained);
- *direction only*: on the paper's side, but the paper's size outside that band (the row says
  whether this suite's effect is smaller or larger), or an ordering that holds in 80 % of the seeds
  or more without the above;
- *no effect*: the whole interval inside ``[1/NO_EFFECT, NO_EFFECT]`` (2 %), however it lies;
- *does not hold*: the interval on the other side of 1 (an ordering in at most 20 % of the seeds);
- *inconclusive*: the interval straddles 1, or fewer than ``MIN_SEEDS`` seeds; a deterministic run
  (no noise, no stragglers: the simulated DASO pair) repeats to the last digit, so
  ``DETERMINISTIC_SEEDS`` seeds whose ratios agree exactly are its one value, shown without an
  interval (not an ordering's gaps: accuracies are counts of samples and can agree by chance);
- *not measured*: no run under the claim's conditions.

"Up to X" (``up_to``) is compared with the best node count the claim covers, never pinned on one.
A simulated claim is evaluated again on the runs whose inter-node link is ``SENSITIVITY`` times as
fast (``sim_inter_speed``: bandwidth times it, latency divided by it); where a verdict there differs,
the claim is marked sensitive to the network model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.intervals import median_order_interval
from analysis.papers import PAPERS_DIR
from benchmarks import validation_cases

CLAIMS = PAPERS_DIR / "claims.yaml"
VALIDATION = validation_cases.CASES  # the one record of which published numbers chose a model input
MIN_SEEDS = 5
DETERMINISTIC_SEEDS = 2  # seeds that give the same value to the last digit: a deterministic run, one value
TOLERANCE = 1.10  # the paper's ratio is reproduced within [low / 1.10, high x 1.10]
NO_EFFECT = 1.02  # no effect: the interval within [1 / 1.02, 1.02]
HALF_GAP = 0.5  # an ordering is reproduced at half the paper's gap or more
SENSITIVITY = (0.5, 2.0)  # the inter-node link's speed factors a simulated verdict is re-checked at
REPRODUCED, DIRECTION, NO_CHANGE = "reproduced", "direction only", "no effect"
FAILS, INCONCLUSIVE, UNMEASURED = "does not hold", "inconclusive", "not measured"
CALIBRATED, NOT_TESTABLE = "calibrated", "not testable"
SENSITIVE = "sensitive to the network model"
# The rule in words, for the report (the README and claims.yaml's header state the same).
RULE = (
    f"reproduced: on the paper's side of 1, and the paper's value within the interval widened by "
    f"{(TOLERANCE - 1) * 100:.0f} % each way (an ordering: in every seed, with a gap between half and "
    f"twice the paper's, and each algorithm the paper shows trained at the task's target); direction only: the paper's side, not its size; no effect: the interval within "
    f"[{1 / NO_EFFECT:.2f}, {NO_EFFECT:.2f}]; does not hold: the other side of 1; inconclusive: the "
    f"interval holds 1, or under {MIN_SEEDS} seeds (a deterministic ratio: {DETERMINISTIC_SEEDS} that agree exactly); calibrated: a model input was chosen on the paper's "
    f"number, so the value is shown and is no reproduction; not testable: simulated, and no test "
    f"measurement validates the speed-up of its pair on its network (the row says what the baseline "
    f"would have to cost for the paper's number)"
)
# What a verdict row repeats of its claim as it is.
CLAIM_FIELDS = [
    *("paper", "id", "claim", "source", "quantity", "paper_value", "conditions", "setting", "experiment"),
    *("algorithm", "baseline", "assumed"),
]
RATIOS = {"throughput_speedup", "speedup"}
ORDERINGS = {"final_metric_above"}
# Run settings whose absence from an older run's config.json means their default.
SETTING_DEFAULTS = {"sim_inter_speed": 1.0}
# What does not make two runs' conditions differ: the suite's name, where the run wrote.
NOT_CONDITIONS = {"suite", "run_id", "out", "data_root", "wandb", "wandb_project", "wandb_mode"}
COLUMNS = [
    "paper", "id", "claim", "source", "quantity", "paper_value", "value", "low", "high", "coverage", "verdict", "why",
    "seeds", "unfinished", "nodes", "network", "clock", "conditions", "setting", "experiment", "suite",
    "sim_network", "algorithm", "baseline", "assumed",
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
    paper_ratio: float | list[float] | None = None  # a ratio's size: one value or [low, high]
    paper_gap: float | None = None  # an ordering's size: the paper's metric difference (a fraction)
    up_to: bool = False  # "up to X": the best over the node counts in requires
    validation: str | None = None  # the case of validation.yaml that is the same published number
    calibrated: bool = False  # that case is fit: set by ``load`` from the case file, never by hand
    # The validation's best role for the speed-up of (algorithm, baseline) on its simulated network:
    # "test", "fit" or "" (no measurement); set by ``load`` from the case file
    # (``validation_cases.validated_pairs``).
    pair_validation: str = "test"
    baseline_implied: str = ""  # what the paper's own numbers imply of the baseline's cost, with the derivation
    assumed: str = ""  # the conditions the paper does not state, each with where this suite's value comes from
    # An ordering's levels: the algorithms of the pair that the paper shows trained (near its
    # single-worker accuracy); here each must reach the task's target, or the effect is another one.
    trains: tuple[str, ...] = ()

    @property
    def simulated(self) -> bool:
        return self.requires.get("clock") == "simulated" and "sim_network" in self.requires


def validation_roles(path: Path = VALIDATION) -> dict[str, dict[str, object]]:
    """{case: its role and measured number} of the validation's case file: a ``fit`` case's number
    chose a model input (the file's header says which and why)."""
    cases, _ = validation_cases.load(path)
    return {c["case"]: {"role": c["role"], "measured": c.get("measured")} for c in cases}


def load(path: Path = CLAIMS, validation: Path = VALIDATION) -> list[Claim]:
    """Every claim, paper by paper in the file's order. An unknown quantity, a claim over several node
    counts that is not "up to", a size of the wrong kind, or a ``validation`` case that is not in the
    case file or holds another number is an error naming the fix."""
    roles = validation_roles(validation)
    validated = validation_cases.validated_pairs(validation)
    claims = []
    for paper, entries in yaml.safe_load(Path(path).read_text(encoding="utf-8")).items():
        for entry in entries:
            for derived in ("calibrated", "pair_validation"):
                if derived in entry:
                    raise ValueError(
                        f"claim {entry.get('id')}: {derived} comes from the validation's case file, not by hand"
                    )
            claim = Claim(paper=paper, **entry)
            if claim.quantity not in RATIOS | ORDERINGS:
                raise ValueError(
                    f"claim {claim.id}: quantity {claim.quantity!r} is not one of {sorted(RATIOS | ORDERINGS)}"
                )
            if isinstance(claim.requires.get("nodes"), list) and not claim.up_to:
                raise ValueError(f"claim {claim.id}: several node counts need up_to: true, or name one")
            if claim.quantity in ORDERINGS and claim.paper_ratio is not None:
                raise ValueError(f"claim {claim.id}: an ordering's size is paper_gap, not paper_ratio")
            if set(claim.trains) - {claim.algorithm, claim.baseline} or (claim.trains and claim.quantity in RATIOS):
                raise ValueError(f"claim {claim.id}: trains names the ordering's algorithm or baseline, or is left out")
            claim = dataclasses.replace(claim, trains=tuple(claim.trains))
            if claim.validation is not None:
                case = roles.get(claim.validation)
                if case is None:
                    raise ValueError(f"claim {claim.id}: validation case {claim.validation!r} is not in {validation}")
                if case["measured"] != claim.paper_ratio:
                    raise ValueError(
                        f"claim {claim.id}: its paper_ratio {claim.paper_ratio} is not validation case "
                        f"{claim.validation!r}'s measured {case['measured']}: the same number in both files"
                    )
                claim = dataclasses.replace(claim, calibrated=case["role"] == "fit")
            if claim.simulated:
                key = (str(claim.requires["sim_network"]), claim.algorithm, claim.baseline)
                claim = dataclasses.replace(claim, pair_validation=validated.get(key, ""))
            claims.append(claim)
    return claims


# -- the verdict rule ---------------------------------------------------------------------------------


def _sizes(paper_ratio: float | list[float] | None) -> tuple[float, float] | None:
    if paper_ratio is None:
        return None
    if isinstance(paper_ratio, list | tuple):
        return float(min(paper_ratio)), float(max(paper_ratio))
    return float(paper_ratio), float(paper_ratio)


def ratio_verdict(
    low: float, high: float, paper_ratio: float | list[float] | None = None, expect: str = "above"
) -> tuple[str, str]:
    """The verdict of a ratio's interval ``[low, high]`` against the paper's size, and why."""
    if 1.0 / NO_EFFECT <= low and high <= NO_EFFECT:
        return NO_CHANGE, f"the interval lies within [{1 / NO_EFFECT:.2f}, {NO_EFFECT:.2f}]"
    on_side, against = (low > 1.0, high < 1.0) if expect == "above" else (high < 1.0, low > 1.0)
    if against:
        return FAILS, "the interval lies on the other side of 1"
    if not on_side:
        return INCONCLUSIVE, "the interval holds 1"
    size = _sizes(paper_ratio)
    if size is None:
        return REPRODUCED, "the paper gives a direction, no size"
    wide_low, wide_high = low / TOLERANCE, high * TOLERANCE
    band = f"[{wide_low:.2f}, {wide_high:.2f}]"
    paper = f"{size[0]:g}x" if size[0] == size[1] else f"{size[0]:g}-{size[1]:g}x"
    if size[0] <= wide_high and wide_low <= size[1]:
        return REPRODUCED, f"the paper's {paper} lies within the interval widened by 10 %, {band}"
    farther = size[0] > wide_high if expect == "above" else size[1] < wide_low
    effect = "smaller" if farther else "larger"
    return DIRECTION, f"effect {effect} than the paper's: its {paper} lies outside {band}"


def ordering_verdict(gaps: list[float], paper_gap: float | None = None) -> tuple[str, str]:
    """The verdict of per-seed metric gaps (the algorithm's minus the baseline's), and why."""
    share = float(np.mean(np.asarray(gaps) > 0))
    held = f"holds in {round(share * len(gaps))} of {len(gaps)} seeds"
    if share <= 0.2:
        return FAILS, held
    if share < 0.8:
        return INCONCLUSIVE, held
    median = float(np.median(gaps))
    if share == 1.0 and paper_gap is None:  # the paper gives an order, no size
        return REPRODUCED, held
    if share == 1.0 and HALF_GAP * paper_gap <= median <= paper_gap / HALF_GAP:
        return REPRODUCED, held + f", gap {median:.2f} within half and twice the paper's {paper_gap:.2f}"
    if share < 1.0:
        return DIRECTION, held + " (a reproduction needs every seed)"
    if median > paper_gap / HALF_GAP:  # the baseline fails here where the paper's trained: another effect
        return DIRECTION, held + f", effect larger: gap {median:.2f} over twice the paper's {paper_gap:.2f}"
    return DIRECTION, held + f", effect smaller: gap {median:.2f} under half the paper's {paper_gap:.2f}"


# -- the runs a claim counts ---------------------------------------------------------------------------


def run_config(run_dir: str) -> dict[str, object]:
    """A run's ``config.json``, its settings, hyper-parameters and knobs merged into one mapping, with
    the device that ran it from ``env.json`` (the settings hold what was asked: ``auto``)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    merged = {**config.get("algorithm_params", {}), **config.get("hparams", {}), **config.get("settings", {})}
    merged.update({k: config[k] for k in ("task", "nodes", "procs_per_node", "seed") if k in config})
    env = Path(run_dir) / "env.json"
    if env.is_file():
        device = json.loads(env.read_text()).get("device")
        if device:
            merged["device"] = device
    return merged


def conditions(run_dir: str) -> tuple[str, str]:
    """What makes a run one observation: its whole ``config.json`` and device but the suite's name
    and its folder; and what its pair must share: its run settings and hyper-parameters but the lr."""
    path = Path(run_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    settings = {k: v for k, v in (config.get("settings") or {}).items() if k not in NOT_CONDITIONS}
    whole = {k: v for k, v in config.items() if k not in NOT_CONDITIONS | {"settings"}}
    whole["device"] = run_config(run_dir).get("device")
    # the task's hyper-parameters but the lr, which scale_lr sets per algorithm
    shared = [settings, {k: v for k, v in (config.get("hparams") or {}).items() if k != "lr"}]
    return json.dumps([whole, settings], sort_keys=True, default=str), json.dumps(shared, sort_keys=True, default=str)


def _same(have: object, want: object) -> bool:
    if isinstance(want, list):
        return any(_same(have, w) for w in want)
    if isinstance(want, int | float) and not isinstance(want, bool):
        try:
            return bool(np.isclose(float(have), float(want)))
        except (TypeError, ValueError):
            return False
    return str(have) == str(want)


def matches(row: pd.Series, config: dict[str, object], requires: dict[str, object]) -> bool:
    """Whether a run has every required setting (a list: any of its values): from its ``config.json``
    and ``env.json``, else its ``runs.csv`` row. A run setting that an older run lacks has its
    default; any other key that neither has is another algorithm's knob, which binds only the runs of
    that algorithm (Horovod's ``fp16_compression``, not DASO's runs). A run without a
    ``config.json`` cannot show its conditions and never matches."""
    if not config:
        return False
    for key, want in requires.items():
        if key in config:
            have = config[key]
        elif key in SETTING_DEFAULTS:
            have = SETTING_DEFAULTS[key]
        elif key in row.index:
            have = row.get(key)
        else:
            continue
        if not _same(have, want):
            return False
    return True


def _paired(runs: pd.DataFrame, claim: Claim, requires: dict[str, object]) -> tuple[pd.DataFrame, int]:
    """One value per (node count, seed) of the claim's quantity, and how many of its runs did not finish.

    The runs under the claim's conditions, each observation once; the algorithm's and the baseline's
    paired on seed, layout, task and run settings; a seed's several pairs by their median."""
    mine = runs[runs["algorithm"].isin([claim.algorithm, claim.baseline])]
    keep = [matches(row, run_config(row["run_dir"]), requires) for _, row in mine.iterrows()]
    chosen = mine[pd.Series(keep, index=mine.index, dtype=bool)].copy()
    if chosen.empty:
        return pd.DataFrame(columns=["nodes", "seed", "value", "suite", "clock"]), 0
    keys = [conditions(d) for d in chosen["run_dir"]]
    chosen["observation"], chosen["pairing"] = [k[0] for k in keys], [k[1] for k in keys]
    chosen = chosen.sort_values("run_dir").drop_duplicates(["algorithm", "observation"])
    finished = ["completed"] if claim.quantity in RATIOS else ["completed", "diverged"]
    done = chosen["status"].isin(finished)
    unfinished, chosen = int((~done).sum()), chosen[done].copy()
    column = {"throughput_speedup": "step_s", "speedup": "wall_s", "final_metric_above": "final_metric"}
    chosen["measure"] = chosen[column[claim.quantity]].astype(float)
    on = ["seed", "nodes", "procs_per_node", "task", "pairing"]
    a = chosen[chosen["algorithm"] == claim.algorithm]
    b = chosen[chosen["algorithm"] == claim.baseline]
    pairs = a.merge(b, on=on, suffixes=("", "_base"))
    if claim.quantity in RATIOS:  # the baseline's time over the algorithm's: above 1, the algorithm is faster
        pairs["value"] = pairs["measure_base"] / pairs["measure"]
    else:  # the algorithm's metric minus the baseline's
        pairs["value"] = pairs["measure"] - pairs["measure_base"]
    pairs = pairs.dropna(subset=["value"])
    names = sorted(set(pairs["suite"]) | set(pairs["suite_base"])) if not pairs.empty else []
    per_seed = pairs.groupby(["nodes", "seed"], as_index=False)[["value", "measure", "measure_base"]].median()
    per_seed["target"] = float(pairs["target"].iloc[0]) if not pairs.empty else np.nan
    per_seed["suite"] = ", ".join(str(s) for s in names)
    per_seed["clock"] = ", ".join(sorted(pairs["clock"].astype(str).unique())) if not pairs.empty else ""
    return per_seed, unfinished


def _measure(claim: Claim, seeds: pd.DataFrame) -> dict[str, object]:
    """Value, interval, coverage and verdict of one node count's per-seed values (``seeds``: value,
    the algorithm's and the baseline's own measure, the task's target)."""
    values = seeds["value"].tolist()
    low, high, coverage = median_order_interval(values)
    out = {"value": float(np.median(values)), "low": low, "high": high, "coverage": coverage, "seeds": len(values)}
    if claim.quantity in RATIOS:
        verdict, why = ratio_verdict(low, high, claim.paper_ratio, claim.expect)
    else:
        verdict, why = ordering_verdict(values, claim.paper_gap)
        level = {claim.algorithm: seeds["measure"].median(), claim.baseline: seeds["measure_base"].median()}
        target = float(seeds["target"].iloc[0])
        short = [f"{name} {level[name]:.2f}" for name in claim.trains if level[name] < target]
        if short:  # the paper's levels do not hold, whatever the order: said with every verdict
            if verdict == REPRODUCED:
                verdict = DIRECTION
            why += (
                f"; but {', '.join(short)} (median) under the task's target {target:.2f}, where the paper's "
                "trained to near its single-worker accuracy"
            )
    # A deterministic run (no noise, no stragglers) repeats to the last digit: DETERMINISTIC_SEEDS
    # ratios of times that agree exactly are its one value. Only ratios: an accuracy is counted in
    # test samples, so two seeds' gaps can agree by chance; those need MIN_SEEDS like any other.
    agree = len(set(values)) == 1
    few = DETERMINISTIC_SEEDS if claim.quantity in RATIOS else MIN_SEEDS
    deterministic = agree and len(values) >= few
    if len(values) < MIN_SEEDS and not deterministic:
        verdict, why = (
            INCONCLUSIVE,
            f"{len(values)} seeds; a verdict needs {MIN_SEEDS}"
            + (f", or {DETERMINISTIC_SEEDS} that agree" if claim.quantity in RATIOS else ""),
        )
    elif deterministic:
        out["coverage"] = None
        why += f"; every seed ({len(values)}) gives {values[0]:.4g}: a deterministic run, one value and no interval"
    return {**out, "verdict": verdict, "why": why, "enough": len(values) >= MIN_SEEDS or deterministic}


def measure(claim: Claim, runs: pd.DataFrame, requires: dict[str, object] | None = None) -> dict[str, object]:
    """The claim's value, interval and verdict on ``runs`` under ``requires`` (the claim's own by
    default): at its node count, or for "up to" the best of its node counts with at least
    ``MIN_SEEDS`` seeds."""
    requires = claim.requires if requires is None else requires
    per_seed, unfinished = _paired(runs, claim, requires) if not runs.empty else (pd.DataFrame(), 0)
    empty = {"value": None, "low": None, "high": None, "coverage": None, "seeds": 0, "nodes": "", "suite": ""}
    if per_seed.empty:
        why = f"no runs under its conditions: run {claim.experiment}"
        if unfinished:
            why = f"{unfinished} runs under its conditions did not finish; run {claim.experiment}"
        return {**empty, "clock": "", "unfinished": unfinished, "verdict": UNMEASURED, "why": why}
    by_nodes = {int(n): _measure(claim, g) for n, g in per_seed.groupby("nodes")}
    enough = {n: m.pop("enough") for n, m in by_nodes.items()}  # MIN_SEEDS, or a deterministic run
    counted = {n: m for n, m in by_nodes.items() if enough[n]} or by_nodes
    sign = 1.0 if claim.expect == "above" else -1.0
    best = max(counted, key=lambda n: sign * counted[n]["value"])
    row = {**by_nodes[best], "nodes": best, "suite": per_seed["suite"].iloc[0], "clock": per_seed["clock"].iloc[0]}
    if claim.up_to and len(by_nodes) > 1:
        others = ", ".join(f"{by_nodes[n]['value']:.2f} at {n} nodes" for n in sorted(by_nodes) if n != best)
        row["why"] += f"; the best of {len(by_nodes)} node counts, at {best} nodes (the others: {others})"
    if unfinished:
        row["why"] += f"; {unfinished} runs did not finish and are not counted"
    return {**row, "unfinished": unfinished}


def _described(m: dict[str, object], quantity: str) -> str:
    if m["value"] is None:
        return m["verdict"]
    value = f"{m['value']:.2f}x" if quantity in RATIOS else f"{m['value']:+.2f}"
    return f"{value} {m['verdict']}"


def evaluate(claim: Claim, runs: pd.DataFrame) -> dict[str, object]:
    """The claim's row of the verdict table; a simulated claim's ``network`` column gives its verdict
    with the inter-node link ``SENSITIVITY`` times as fast, where such runs exist."""
    row = {c: getattr(claim, c) for c in CLAIM_FIELDS}
    row.update(measure(claim, runs))
    row["sim_network"] = claim.requires.get("sim_network", "") if claim.simulated else ""  # its validation's key
    if claim.simulated and not claim.calibrated and claim.pair_validation != "test" and row["verdict"] != UNMEASURED:
        row["why"] = f"{untestable(claim, row['value'])}; as measured it would read {row['verdict']} ({row['why']})"
        row["verdict"] = NOT_TESTABLE
    if claim.calibrated and row["verdict"] != UNMEASURED:
        row["why"] = (
            f"a model input was chosen on the paper's number ({claim.validation} is a fit row of analysis/papers/"
            f"validation.yaml): the value is the calibration's, no reproduction; as a ratio it would read "
            f"{row['verdict']} ({row['why']})"
        )
        row["verdict"] = CALIBRATED
    row["network"] = ""
    if claim.simulated and row["verdict"] != UNMEASURED:
        ends = {s: measure(claim, runs, {**claim.requires, "sim_inter_speed": s}) for s in SENSITIVITY}
        measured = {s: m for s, m in ends.items() if m["verdict"] != UNMEASURED}
        row["network"] = "; ".join(f"{s:g}x link: {_described(m, claim.quantity)}" for s, m in measured.items())
        if any(m["verdict"] != row["verdict"] for m in measured.values()):
            row["why"] += f"; {SENSITIVE}"
    return {c: row.get(c) for c in COLUMNS}


def untestable(claim: Claim, value: float | None) -> str:
    """Why a simulated verdict cannot be tested, and its break-even: the factor by which the
    baseline's simulated time a step would have to grow for the paper's number (a claim of
    direction only: for the ratio to cross 1), beside what the paper's own numbers imply of it."""
    network = claim.requires["sim_network"]
    how = "only by a fit row" if claim.pair_validation == "fit" else "by no measurement"
    why = f"the speed-up of {claim.algorithm} over {claim.baseline} on {network} is validated {how}"
    size = _sizes(claim.paper_ratio)
    if size is not None and value:
        factor = (size[0] if claim.expect == "above" else size[1]) / value
        why += f"; for the paper's {claim.paper_value} the baseline would have to take {factor:.2f}x its simulated time"
    elif value:  # a direction, no size: the baseline's time at which the ratio crosses 1
        side = "more" if claim.expect == "above" else "less"
        why += f"; for the paper's side of 1 the baseline would have to take {side} than {1 / value:.2f}x its simulated time"
    if claim.baseline_implied:
        why += f"; the paper's own numbers: {claim.baseline_implied}"
    return why


def table(runs: pd.DataFrame, claims: list[Claim] | None = None) -> pd.DataFrame:
    """Every claim's verdict, in ``claims.yaml``'s order."""
    rows = [evaluate(claim, runs) for claim in (load() if claims is None else claims)]
    return pd.DataFrame(rows, columns=COLUMNS)


def read(path: Path) -> pd.DataFrame:
    """Read back the table that ``analysis.tables`` wrote."""
    numbers = ("value", "low", "high", "coverage")
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in numbers})
