"""The validation's case file (``analysis/papers/validation.yaml``): its cases and the pairs of cases
whose speed-ups the claims read. Plain data, no torch: ``python -m tools.validate`` runs the
cases, and ``analysis/claims.py`` reads from the same file which published numbers chose a model
input (``fit``) and which pairs of algorithms a measurement validates, so that a verdict knows
where its numbers come from.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "analysis" / "papers" / "validation.yaml"
# fit: a model input was chosen on it; test: scored, never used for a choice; apparatus: scored, but
# the measuring machine spoils it (the case's ``apparatus`` says how, and which measurement shows it),
# so it stays out of the summaries beside the fit rows
ROLES = ("fit", "test", "apparatus")
QUANTITIES = ("time", "steps_per_s", "speedup", "emulated_step", "bus_bandwidth")
UNITS = {"h": 3600.0, "min": 60.0, "s": 1.0, "ms": 1e-3, "steps/s": None, "x": None, "GB/s": None}
EMULATED = "emulated"  # the network column of the emulated runs, whatever their rate


def load(path: Path = CASES) -> tuple[list[dict], list[dict]]:
    """The cases and the left-out measurements of ``path``, each case checked for what it needs."""
    data = yaml.safe_load(Path(path).read_text())
    cases, left_out = data["cases"], data.get("left_out", [])
    names = set()
    for case in cases:
        name = case.get("case")
        missing = [k for k in ("case", "source", "network", "role", "quantity", "unit") if not case.get(k)]
        if missing:
            raise ValueError(f"case {name!r}: missing {', '.join(missing)}")
        if name in names:
            raise ValueError(f"case {name!r} appears twice")
        names.add(name)
        if case["role"] not in ROLES or case["quantity"] not in QUANTITIES or case["unit"] not in UNITS:
            raise ValueError(f"case {name!r}: role in {ROLES}, quantity in {QUANTITIES}, unit in {list(UNITS)}")
        if (case["role"] == "apparatus") != bool(case.get("apparatus")):
            raise ValueError(f"case {name!r}: role apparatus, and only it, says in `apparatus` what spoils the row")
        if case["quantity"] == "emulated_step":
            if "rate_mbit" not in case or case["network"] != EMULATED:
                raise ValueError(f"case {name!r}: an emulated case names rate_mbit and network {EMULATED!r}")
        elif case["quantity"] == "bus_bandwidth":
            if set(case.get("allreduce", {})) != {"nodes", "procs_per_node", "bytes"}:
                raise ValueError(
                    f"case {name!r}: a bus bandwidth names its allreduce's nodes, procs_per_node and bytes"
                )
        elif not isinstance(case.get("measured"), (int, float)) or "run" not in case:
            raise ValueError(f"case {name!r}: a published case gives its measured number and its run")
        if case["quantity"] == "speedup" and "baseline" not in case:
            raise ValueError(f"case {name!r}: a speedup names its baseline run")
    return cases, left_out


def ratio_rules(path: Path = CASES) -> list[dict]:
    """The case file's ``ratios``: which pairs of cases give the speed-ups the claims read."""
    rules = yaml.safe_load(Path(path).read_text()).get("ratios", [])
    for rule in rules:
        if set(rule) != {"case", "baseline"}:
            raise ValueError(f"ratio rule {rule}: it names a case pattern and a baseline pattern, nothing else")
    return rules


def pair_role(a: dict, b: dict) -> str:
    """The role of a ratio of two cases: fit where either chose a model input, apparatus where either
    is spoiled by the machine, else test."""
    roles = {a["role"], b["role"]}
    return "fit" if "fit" in roles else "apparatus" if "apparatus" in roles else "test"


def algorithm_of(spec: dict) -> str:
    """The label of a run in a ratio: its algorithm, with DASO's fixed (B, S) where a case sets them."""
    knobs = spec.get("set", {})
    if spec["algorithm"] == "daso" and "max_global_skips" in knobs:
        return f"daso B={knobs['max_global_skips']} S={knobs.get('batches_to_wait', 0)}"
    return spec["algorithm"]


def pairs(cases: list[dict], rules: list[dict]) -> list[tuple[dict, dict]]:
    """The (case, baseline case) pairs that ``rules`` name: each rule's ``case`` pattern matched whole
    against every case's name, its ``baseline`` pattern formatted with the match's named groups and
    matched whole against every other case's name. Every rule must pair something, so that a renamed
    case cannot drop its ratios silently."""
    by_name = {c["case"]: c for c in cases}
    found: list[tuple[dict, dict]] = []
    for rule in rules:
        matched = 0
        for name, case in by_name.items():
            m = re.fullmatch(rule["case"], name)
            if m is None:
                continue
            wanted = rule["baseline"].format(**m.groupdict())
            for other, base in by_name.items():
                if other != name and re.fullmatch(wanted, other) and (case, base) not in found:
                    found.append((case, base))
                    matched += 1
        if not matched:
            raise ValueError(f"ratio rule {rule}: pairs no two cases")
    return found


def validated_pairs(path: Path = CASES) -> dict[tuple[str, str, str], str]:
    """{(network, algorithm, baseline): role} for every speed-up the case file can score: ``test``
    where one of its ratios has two test cases, else ``fit`` (a fit or an apparatus row: no
    measurement that validates). A pair that is absent has no measurement at all; its inverse (the
    baseline over the algorithm) counts as the same pair."""
    cases, _ = load(path)
    roles: dict[tuple[str, str, str], str] = {}

    def note(network: str, a: str, b: str, role: str) -> None:
        for key in ((network, a, b), (network, b, a)):
            roles[key] = "test" if role == "test" or roles.get(key) == "test" else "fit"

    for c in cases:
        if c["quantity"] == "speedup":
            note(c["network"], algorithm_of(c["run"]), algorithm_of(c["baseline"]), c["role"])
    for a, b in pairs(cases, ratio_rules(path)):
        role = pair_role(a, b)
        note(a["network"], algorithm_of(a["run"]), algorithm_of(b["run"]), role)
    return roles


def geomean_abs(errors: list[float]) -> float:
    """The geometric mean of |e|: one large error does not hide the rest, as in an arithmetic mean."""
    if not errors:
        return math.nan
    if any(e == 0 for e in errors):
        return 0.0
    return math.exp(sum(math.log(abs(e)) for e in errors) / len(errors))


def ratio_summary(ratios: list[dict]) -> list[dict]:
    """Per network and family, the test ratios' count, geomean |error| and largest |error| (with its
    ratio): what a verdict's ratio may be off by, where errors of two algorithms add instead of cancel."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in ratios:
        if r["role"] == "test":
            groups.setdefault((r["network"], r["family"]), []).append(r)
    summary = []
    for (net, family), rs in sorted(groups.items()):
        worst = max(rs, key=lambda r: abs(r["relative_error"]))
        summary.append(
            {
                "network": net,
                "family": family,
                "test_ratios": len(rs),
                "geomean_abs_error": geomean_abs([r["relative_error"] for r in rs]),
                "largest_abs_error": abs(worst["relative_error"]),
                "largest": worst["ratio"],
            }
        )
    return summary
