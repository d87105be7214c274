"""The papers' claims and their verdicts (analysis/claims.py), on hand-made runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import claims, intervals
from benchmarks import config

ROOT = Path(__file__).resolve().parent.parent
REQUIRES = {"nodes": 64, "procs_per_node": 1, "clock": "simulated", "straggler_delay_ms": 320}


def claim(**changes) -> claims.Claim:
    fields = dict(
        paper="wagma", id="c", claim="WAGMA is faster.", source="Fig. 4", conditions="64 nodes",
        requires=REQUIRES, experiment="config/claims.yaml", quantity="throughput_speedup",
        algorithm="wagma", baseline="allreduce", paper_value="1.26x", setting="",
    )  # fmt: skip
    return claims.Claim(**{**fields, **changes})


def runs(tmp_path: Path, step_s: dict[str, list[float]], delay: float = 320, metric=None) -> pd.DataFrame:
    """One finished run per algorithm and seed, with its config.json: ``step_s[algorithm][seed]``."""
    rows = []
    for algorithm, times in step_s.items():
        for seed, t in enumerate(times):
            run_dir = tmp_path / f"{algorithm}-{seed}-{delay}"
            run_dir.mkdir(parents=True, exist_ok=True)
            settings = {"clock": "simulated", "straggler_delay_ms": delay}
            cfg = {"nodes": 64, "procs_per_node": 1, "seed": seed, "settings": settings, "hparams": {}}
            (run_dir / "config.json").write_text(json.dumps(cfg))
            rows.append(
                {"suite": "s", "algorithm": algorithm, "seed": seed, "nodes": 64, "procs_per_node": 1,
                 "status": "completed", "wall_s": 10 * t, "steps": 10, "clock": "simulated",
                 "final_metric": (metric or {}).get(algorithm, [0.5] * 9)[seed], "run_dir": str(run_dir)}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_bootstrap_interval_of_a_median_by_hand():
    """Two values: a resample of 2 has median 1 (1/4), 2 (1/2) or 3 (1/4); its 2.5 and 97.5
    percentiles are 1 and 3. One value repeated: the interval is that value."""
    assert intervals.median_interval([1.0, 3.0]) == pytest.approx((1.0, 3.0))
    assert intervals.median_interval([1.2] * 5) == (1.2, 1.2)
    assert intervals.median_interval([1.0, 1.1, 1.2, 1.3, 1.4]) == intervals.median_interval([1.0, 1.1, 1.2, 1.3, 1.4])


def test_a_ratio_holds_fails_or_is_inconclusive_by_its_interval(tmp_path):
    base = [1.3, 1.3, 1.3, 1.3, 1.3]  # allreduce's seconds per step
    faster = runs(tmp_path / "a", {"wagma": [1.0, 1.02, 0.98, 1.01, 0.99], "allreduce": base})
    row = claims.evaluate(claim(), faster)
    assert row["verdict"] == claims.HOLDS and row["seeds"] == 5 and row["low"] > 1
    assert row["value"] == pytest.approx(1.3 / 1.0)  # the median of the paired ratios
    slower = runs(tmp_path / "b", {"wagma": [1.5, 1.6, 1.55, 1.45, 1.5], "allreduce": base})
    assert claims.evaluate(claim(), slower)["verdict"] == claims.FAILS
    mixed = runs(tmp_path / "c", {"wagma": [1.0, 1.6, 1.1, 1.5, 1.3], "allreduce": base})
    row = claims.evaluate(claim(), mixed)
    assert row["verdict"] == claims.INCONCLUSIVE and row["low"] < 1 < row["high"]
    assert claims.ratio_verdict(0.7, 0.9, "below") == claims.HOLDS  # a claim that the ratio is below 1


def test_an_ordering_is_the_share_of_seeds(tmp_path):
    c = claim(quantity="final_metric_above", algorithm="dana_dc", baseline="nag_asgd")
    metric = {"dana_dc": [0.9, 0.9, 0.9, 0.9, 0.5], "nag_asgd": [0.2, 0.3, 0.95, 0.1, 0.2]}
    row = claims.evaluate(c, runs(tmp_path, {"dana_dc": [1] * 5, "nag_asgd": [1] * 5}, metric=metric))
    assert row["value"] == pytest.approx(0.8) and row["verdict"] == claims.HOLDS
    assert [claims.ordering_verdict(x) for x in (0.6, 0.2)] == [claims.INCONCLUSIVE, claims.FAILS]


def test_runs_under_other_conditions_never_get_a_verdict(tmp_path):
    """Runs with 100 ms delays do not count for a claim made at 320 ms: not measured, with the
    config that measures it; too few seeds give a value but no verdict."""
    other = runs(tmp_path / "a", {"wagma": [1.0] * 5, "allreduce": [1.3] * 5}, delay=100)
    row = claims.evaluate(claim(), other)
    assert row["verdict"] == claims.UNMEASURED and row["value"] is None and "config/claims.yaml" in row["why"]
    few = runs(tmp_path / "b", {"wagma": [1.0] * 3, "allreduce": [1.3] * 3})
    row = claims.evaluate(claim(), few)
    assert row["verdict"] == claims.INCONCLUSIVE and row["value"] == pytest.approx(1.3) and "needs 5" in row["why"]


def test_every_paper_has_three_claims_and_the_claims_config_builds_their_conditions():
    """Each claim that config/claims.yaml measures: for its algorithm and baseline, some run of that
    matrix, resolved as the Snakefile resolves it, has every setting the claim requires."""
    loaded = claims.load()
    for paper in ("daso", "wagma", "dana", "lpp_sgd"):
        assert sum(c.paper == paper for c in loaded) >= 3, paper
    matrices = config.matrices(yaml.safe_load((ROOT / "config/claims.yaml").read_text()))
    built = []
    for m in matrices:
        for algorithm in m["algorithms"]:
            for nodes in m["nodes"]:
                sets = config.overrides_for(algorithm, "digits", m["overrides"])
                cfg = config.resolve(algorithm, "digits", nodes, m["procs_per_node"], 0, Path("x"), sets)
                merged = {**cfg.algorithm_params, **cfg.hparams, **cfg.settings}
                built.append((algorithm, {**merged, "nodes": nodes, "procs_per_node": m["procs_per_node"]}))
    for c in loaded:
        if c.experiment.startswith("config/claims.yaml"):
            for name in (c.algorithm, c.baseline):
                assert any(a == name and claims.matches(pd.Series(dtype=object), s, c.requires) for a, s in built), (
                    c.id,
                    name,
                )
        else:
            assert (ROOT / c.experiment.split()[0]).is_file(), c.id


def test_the_papers_own_ratio_is_placed_against_the_interval():
    """A direction can hold while the size is far from the paper's: the row says where it lies."""
    assert claims.magnitude("1.26x", 1.28, 1.31) == "the paper's 1.26x lies below the interval"
    assert claims.magnitude("1.23x", 1.0, 1.04) == "the paper's 1.23x lies above the interval"
    assert claims.magnitude("1.3x", 1.2, 1.4) == "the paper's 1.3x lies inside the interval"
    assert claims.magnitude("up to 1.33x (25 % less time)", 1.0, 1.1) == ""


def test_a_ratio_interval_with_one_run_on_a_side_resamples_the_other():
    """DDP 12 s in one run, the algorithm 6 or 8 s (median of a resample: 6, 7 or 8): 12/8 to 12/6."""
    assert intervals.ratio_interval([12.0], [6.0, 8.0]) == pytest.approx((1.5, 2.0))
    assert intervals.ratio_interval([6.0, 8.0], [2.0]) == pytest.approx((3.0, 4.0))
    assert intervals.ratio_interval([3.0], [1.5]) == (2.0, 2.0)


def test_a_required_knob_binds_only_the_runs_of_the_algorithm_that_has_it(tmp_path):
    """DASO against Horovod with fp16 messages: DASO's runs have no ``fp16_compression`` and still
    count; Horovod's count only where it is on."""
    c = claim(algorithm="daso", baseline="horovod", requires={**REQUIRES, "fp16_compression": True})
    table = runs(tmp_path, {"daso": [1.0] * 5, "horovod": [1.3] * 5})
    for run_dir, algorithm in zip(table["run_dir"], table["algorithm"]):
        if algorithm == "horovod":
            cfg = json.loads((Path(run_dir) / "config.json").read_text())
            cfg["algorithm_params"] = {"fp16_compression": True}
            (Path(run_dir) / "config.json").write_text(json.dumps(cfg))
    assert claims.evaluate(c, table)["verdict"] == claims.HOLDS
    for run_dir in table.loc[table["algorithm"] == "horovod", "run_dir"]:  # Horovod sending fp32
        cfg = json.loads((Path(run_dir) / "config.json").read_text())
        cfg["algorithm_params"] = {"fp16_compression": False}
        (Path(run_dir) / "config.json").write_text(json.dumps(cfg))
    assert claims.evaluate(c, table)["verdict"] == claims.UNMEASURED
