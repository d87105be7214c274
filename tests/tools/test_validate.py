"""The validation of the virtual cluster (``tools/validate.py``): its case file, its error
arithmetic, one simulated prediction end to end, and one emulated case where root allows it."""

from __future__ import annotations

import csv
import math

import pandas as pd
import pytest
import yaml

import algorithms
from algorithms.daso import DASO
from algorithms.topology import Topology
from benchmarks import matrix, netns
from tools import validate

OK, WHY = netns.available()


def test_the_case_file_parses_and_each_case_names_its_source_and_role():
    cases, left_out = validate.load()
    assert {c["role"] for c in cases} == {"fit", "test", "apparatus"}
    assert all(c["source"] and c["network"] for c in cases)
    tests = [c for c in cases if c["role"] == "test"]
    assert len(tests) >= 12 and len({c["network"] for c in tests}) >= 3  # two papers' networks, the emulated one
    assert all(item["source"] and item["why"] for item in left_out)


def test_the_published_numbers_are_the_papers_own():
    """Every DASO Table 2 time and WAGMA-SGD balanced throughput of the case file is in the papers'
    tables of analysis/papers, where the claims read them too."""
    cases, _ = validate.load()
    daso = pd.read_csv(validate.ROOT / "analysis/papers/daso.csv")
    times = daso[(daso["source"] == "v2 Table 2") & (daso["quantity"] == "time")]
    table = {(r.setting.split(";")[0], r.workers): r.value for r in times.itertuples()}
    t2 = [c for c in cases if c["case"].startswith("daso-t2-")]
    assert len(t2) == len(table) == 40
    for c in t2:
        b, s = c["run"]["set"]["max_global_skips"], c["run"]["set"]["batches_to_wait"]
        assert table[(f"B={b}, S={s}", c["steps"]["gpus"])] == c["measured"], c["case"]
    wagma = pd.read_csv(validate.ROOT / "analysis/papers/wagma.csv")
    rates = wagma[wagma["quantity"] == "throughput"].set_index("algorithm")["value"]
    for c in cases:
        if c["case"].startswith("wagma-balanced-"):
            assert rates[c["run"]["algorithm"]] == c["measured"], c["case"]


def test_the_daso_table2_runs_hold_b_and_s_and_each_of_their_knobs_reaches_daso():
    """Table 2's runs are DASO's own with ``fixed_cycle`` and the phases off; a knob DASO did not
    know would be dropped from the run without a word (``matrix.overrides_for``), so none may be."""
    cases, _ = validate.load()
    t2 = [c for c in cases if c["case"].startswith("daso-t2-")]
    knobs = algorithms.params("daso")
    for c in t2:
        run, settings = c["run"], c["run"]["set"]
        assert run["algorithm"] == "daso", c["case"]
        assert (
            settings["fixed_cycle"] is True and settings["sync_warmup_epochs"] == settings["sync_cooldown_epochs"] == 0
        )
        items = [f"{k}={v}" for k, v in settings.items()]
        assert matrix.overrides_for("daso", run["task"], items) == items, c["case"]
        algo = DASO(
            Topology(0, nodes=run["nodes"], procs_per_node=1), **{k: v for k, v in settings.items() if k in knobs}
        )
        assert (algo.max_global_skips, algo.batches_to_wait) == (
            settings["max_global_skips"],
            settings["batches_to_wait"],
        )


EMULATED_ALGORITHMS = ("ddp", "local_sgd", "dpsgd", "daso", "wagma", "allreduce", "sgp", "adpsgd", "powersgd", "diloco")


def test_the_fit_rows_are_those_the_model_was_chosen_on():
    cases, _ = validate.load()
    fit = {c["case"] for c in cases if c["role"] == "fit"}
    assert fit == {
        *(f"daso-t2-{g}gpu-B{b}-S0" for g in (32, 128) for b in (1, 32)),
        "daso-t2-32gpu-B1-S1",  # what a hidden non-blocking sync costs the compute (mpi_overlap)
        "wagma-balanced-adpsgd",
        "wagma-fig4-over-dpsgd",
        "wagma-fig4-over-sgp",
        # the emulated links were changed after these rows (a tbf's bucket passed bursts at once)
        *(f"emulated-{a}-{r}mbit" for r in (25, 100) for a in EMULATED_ALGORITHMS),
    }
    # the machine spoils some rows (docs/measurements.md): at 2 x 2 the compute-bound algorithms, two
    # ranks a core; at any layout WAGMA and AD-PSGD, whose communication threads take the cores
    cores, threads = {"local_sgd", "diloco", "daso"}, {"wagma", "adpsgd"}
    spoiled = {c["case"] for c in cases if c["role"] == "apparatus"}
    assert spoiled == {
        *(f"emulated-{a}-{r}mbit" for r in (50, 200) for a in cores | threads),
        *(f"emulated21-{a}-{r}mbit" for r in (35, 140) for a in threads),
    }
    assert all("docs/measurements.md" in c["apparatus"] for c in cases if c["role"] == "apparatus")
    tested = {c["case"] for c in cases if c["role"] == "test" and c["network"] == "emulated"}
    assert tested == {
        *(f"emulated-{a}-{r}mbit" for r in (50, 200) for a in set(EMULATED_ALGORITHMS) - cores - threads),
        *(f"emulated21-{a}-{r}mbit" for r in (35, 140) for a in set(EMULATED_ALGORITHMS) - threads),
    }


@pytest.mark.parametrize(
    "change, message",
    [({"source": ""}, "missing source"), ({"role": "tuned"}, "role in"), ({"measured": None}, "measured number")],
)
def test_a_case_without_its_source_role_or_number_is_refused(tmp_path, change, message):
    case = {"case": "c", "source": "s", "network": "n", "quantity": "steps_per_s", "unit": "steps/s", "role": "test"}
    case |= {"measured": 1.0, "run": {}} | change
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump({"cases": [case]}))
    with pytest.raises(ValueError, match=message):
        validate.load(path)


def test_relative_error_and_its_geometric_mean():
    assert validate.relative_error(2.0, 2.5) == pytest.approx(0.25)
    assert validate.relative_error(4.0, 3.0) == pytest.approx(-0.25)
    assert validate.geomean_abs([0.1, -0.4]) == pytest.approx(0.2)  # sqrt(0.1 x 0.4)
    assert validate.geomean_abs([0.05, 0.0]) == 0.0
    assert math.isnan(validate.geomean_abs([]))


def test_the_geomean_per_network_scores_test_rows_only(tmp_path):
    rows = [
        {"case": "a", "network": "x", "role": "test", "relative_error": 0.1},
        {"case": "b", "network": "x", "role": "test", "relative_error": -0.9},
        {"case": "c", "network": "x", "role": "fit", "relative_error": 5.0},
        {"case": "d", "network": "y", "role": "test", "relative_error": 0.02},
    ]
    rows = [{**r, "source": "s", "measured": 1.0, "predicted": 1.0 + r["relative_error"], "unit": "s"} for r in rows]
    path = tmp_path / "validation.csv"
    validate.write(rows, path)
    with open(path, newline="") as f:
        assert next(csv.reader(f)) == validate.COLUMNS
    assert validate.geomean_by_network(path) == pytest.approx({"x": 0.3, "y": 0.02})


def _case(name: str, algorithm: str, quantity: str = "emulated_step", role: str = "test", **knobs) -> dict:
    run = {"algorithm": algorithm, "task": "digits", "nodes": 2, "procs_per_node": 2, "set": knobs}
    return {"case": name, "source": "s", "network": "n", "quantity": quantity, "unit": "ms", "role": role, "run": run}


def test_a_ratio_is_the_baselines_time_over_the_algorithms_with_its_error_and_role():
    """Numbers by hand: allreduce 10 ms measured, 12 predicted (+20 %); wagma 8 ms measured, 6
    predicted (-25 %). Times alone, the two errors' geomean is sqrt(0.2 x 0.25) = 22 %; the speed-up
    is 10/8 = 1.25 measured, 12/6 = 2.0 predicted: +60 %, the two errors compounded (1.2 / 0.75 = 1.6)."""
    cases = [
        _case("emu-allreduce-50", "allreduce"),
        _case("emu-wagma-50", "wagma"),
        _case("emu-dpsgd-50", "dpsgd", role="fit"),
        _case("emu-wagma-25", "wagma"),  # no allreduce at 25: no pair
    ]
    rows = {
        "emu-allreduce-50": {"measured": 10.0, "predicted": 12.0, "role": "test"},
        "emu-wagma-50": {"measured": 8.0, "predicted": 6.0, "role": "test"},
        "emu-dpsgd-50": {"measured": 20.0, "predicted": 20.0, "role": "fit"},
        "emu-wagma-25": {"measured": 9.0, "predicted": 9.0, "role": "test"},
    }
    rules = [{"case": r"emu-(?P<alg>[a-z]+)-(?P<rate>\d+)", "baseline": "emu-allreduce-{rate}"}]
    ratios = {r["ratio"]: r for r in validate.ratio_rows(cases, rows, rules)}
    assert set(ratios) == {"emu-wagma-50 over emu-allreduce-50", "emu-dpsgd-50 over emu-allreduce-50"}
    wagma = ratios["emu-wagma-50 over emu-allreduce-50"]
    assert (wagma["measured"], wagma["predicted"]) == (pytest.approx(1.25), pytest.approx(2.0))
    assert wagma["relative_error"] == pytest.approx(0.6)
    assert (wagma["algorithm"], wagma["baseline"], wagma["family"], wagma["role"]) == (
        "wagma", "allreduce", "point-to-point", "test"
    )  # fmt: skip
    assert ratios["emu-dpsgd-50 over emu-allreduce-50"]["role"] == "fit"  # a fit case fits its ratios too
    summary = validate.ratio_summary(list(ratios.values()))
    assert summary == [
        {
            "network": "n",
            "family": "point-to-point",
            "test_ratios": 1,
            "geomean_abs_error": pytest.approx(0.6),
            "largest_abs_error": pytest.approx(0.6),
            "largest": "emu-wagma-50 over emu-allreduce-50",
        }
    ]


def test_a_row_the_machine_spoils_is_shown_and_left_out_of_the_summaries(tmp_path):
    """A case of role apparatus says what spoils it; its ratios take that role and stay out of the
    family summary, as a fit case's do."""
    cases = [_case("e-allreduce-50", "allreduce"), _case("e-sgp-50", "sgp"), _case("e-wagma-50", "wagma")]
    cases[2] |= {"role": "apparatus", "apparatus": "its thread takes the core (measured)"}
    rows = {
        "e-allreduce-50": {"measured": 10.0, "predicted": 10.0},
        "e-sgp-50": {"measured": 10.0, "predicted": 11.0},
        "e-wagma-50": {"measured": 10.0, "predicted": 5.0},
    }
    rules = [{"case": r"e-(?P<alg>sgp|wagma)-(?P<rate>\d+)", "baseline": "e-allreduce-{rate}"}]
    ratios = {r["algorithm"]: r for r in validate.ratio_rows(cases, rows, rules)}
    assert ratios["wagma"]["role"] == "apparatus" and ratios["sgp"]["role"] == "test"
    (summary,) = validate.ratio_summary(list(ratios.values()))
    assert summary["test_ratios"] == 1 and summary["largest_abs_error"] == pytest.approx(1 - 1 / 1.1)  # sgp only
    path = tmp_path / "cases.yaml"
    bare = {k: v for k, v in cases[2].items() if k != "apparatus"}
    path.write_text(yaml.safe_dump({"cases": [{**bare, "rate_mbit": 50, "network": "emulated"}]}))
    with pytest.raises(ValueError, match="role apparatus, and only it, says in `apparatus` what spoils the row"):
        validate.load(path)


def test_a_throughput_ratio_and_a_published_speedup_keep_their_direction():
    """steps/s: the case's over the baseline's (3 over 2 = 1.5 measured, 3.3 over 2 = 1.65, +10 %);
    a published speed-up case is a ratio already and passes as it is; DASO's label holds B and S."""
    cases = [
        _case("fast", "wagma", quantity="steps_per_s"),
        _case("slow", "sgp", quantity="steps_per_s"),
        {**_case("t2-b4", "daso", quantity="time", max_global_skips=4, batches_to_wait=1), "baseline": {}},
        {**_case("fig", "wagma", quantity="speedup", role="fit"), "baseline": {"algorithm": "local_sgd"}},
    ]
    rows = {
        "fast": {"measured": 3.0, "predicted": 3.3, "role": "test"},
        "slow": {"measured": 2.0, "predicted": 2.0, "role": "test"},
        "fig": {"measured": 1.25, "predicted": 1.5, "role": "fit"},
    }
    ratios = validate.ratio_rows(cases, rows, [{"case": "fast", "baseline": "slow"}])
    assert [(r["ratio"], r["baseline"], r["role"]) for r in ratios] == [
        ("fig", "local_sgd", "fit"),
        ("fast over slow", "sgp", "test"),
    ]
    assert ratios[1]["relative_error"] == pytest.approx(0.1)
    assert validate.algorithm_of(cases[2]["run"]) == "daso B=4 S=1"


def test_every_ratio_rule_of_the_case_file_pairs_cases_and_a_rule_that_pairs_none_is_refused():
    cases, _ = validate.load()
    found = validate.pairs(cases, validate.ratio_rules())
    names = {f"{a['case']} over {b['case']}" for a, b in found}
    assert "emulated-wagma-50mbit over emulated-allreduce-50mbit" in names
    assert "daso-t2-128gpu-B4-S1 over daso-t2-32gpu-B4-S1" in names
    assert "wagma-balanced-wagma over wagma-balanced-sgp" in names
    with pytest.raises(ValueError, match="pairs no two cases"):
        validate.pairs(cases, [{"case": "emulated-nothing", "baseline": "x"}])


def test_every_registered_algorithm_names_its_family():
    assert all(algorithms.get(name).family for name in algorithms.names())


@pytest.mark.slow  # runs (through the runner, in this process): not the quick subset's
def test_a_simulated_case_runs_end_to_end(tmp_path):
    """One published-style case through the command: a 2 x 2 allreduce run on the virtual cluster,
    whose step is its 100 ms batch and a ring all-reduce of microseconds on JUWELS' data-sheet links;
    a second case shares its run (the process holds a run's folder while it lives: it runs once)."""
    run = {"algorithm": "allreduce", "task": "digits", "nodes": 2, "procs_per_node": 2}
    run["set"] = {"sim_network": "juwels_booster", "sim_step_ms": 100, "epochs": 1, "batch_size": 64}
    case = {"case": "tiny", "source": "made up", "network": "juwels_booster", "quantity": "steps_per_s"}
    case |= {"unit": "steps/s", "measured": 8.0, "role": "test", "run": run}
    same = {**case, "case": "same", "quantity": "speedup", "unit": "x", "measured": 1.0, "role": "fit", "baseline": run}
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump({"cases": [case, same]}))  # one run, shared
    out = tmp_path / "validation.csv"
    argv = ["--cases", str(tmp_path / "cases.yaml"), "--out", str(out), "--work", str(tmp_path / "work")]
    assert validate.main(argv) == 0
    row, shared = pd.read_csv(out).to_dict("records")
    assert shared["predicted"] == 1.0 and shared["role"] == "fit"  # a run's speed-up over itself
    assert row["case"] == "tiny" and row["role"] == "test" and row["measured"] == 8.0
    assert row["predicted"] == pytest.approx(10.0, rel=1e-3)
    assert row["relative_error"] == pytest.approx(0.25, rel=1e-2)
    assert validate.geomean_by_network(out) == pytest.approx({"juwels_booster": 0.25}, rel=1e-2)


@pytest.mark.slow
@pytest.mark.skipif(not OK, reason=f"no emulated network here: {WHY}")
def test_an_emulated_case_is_measured_behind_its_link_and_predicted(tmp_path):
    """A real 2 x 2 DDP run behind 25 Mbit/s links and its twin: each step moves the ring's 2(p-1)/p
    of the 175 kB model across a node's link, 84 ms at the link's rate, which both must pay."""
    run = {"algorithm": "ddp", "task": "digits", "nodes": 2, "procs_per_node": 2}
    run["set"] = {"epochs": 2, "evals_per_epoch": 1}
    case = {"case": "emu", "source": "here", "network": "emulated", "quantity": "emulated_step", "unit": "ms"}
    case |= {"rate_mbit": 25, "role": "test", "run": run}
    machine = {4: {"intra": {"latency_s": 1e-3, "bandwidth_bps": 1e9}, "sync_s": 0.0, "skips": True, "step_ms": 7.0}}
    row = validate.evaluate(case, tmp_path, machine)
    floor_ms = 1.5 * 174_664 / (25e6 / 8) * 1e3
    assert row["measured"] > 0.8 * floor_ms and row["predicted"] > floor_ms
    assert row["relative_error"] == pytest.approx(row["predicted"] / row["measured"] - 1)


def test_the_calibration_names_its_fit_and_test_algorithms():
    """calibration.csv's role: the algorithms the model was chosen on are fit, the rest test."""
    from tools import calibrate

    assert set(calibrate.FITTED).isdisjoint(calibrate.TESTED)
    assert calibrate.PREDICTED == [*calibrate.FITTED, *calibrate.TESTED] and calibrate.TESTED


def test_a_bus_bandwidth_is_the_virtual_rings_bytes_over_its_time():
    """nccl-tests' bus bandwidth, predicted: 2 nodes of 4 ranks on juwels_booster (4 rails), 100 MB.
    Four rings, one an adapter: each rank's 2(n-1)/n of the bytes cross a node's four 25 GB/s
    adapters in a quarter each, after 2(n-1) latencies of 5 us: t = 14 x 5e-6 + 1.75e8 / 1e11, and
    the bus bandwidth is 1.75e8 / t."""
    case = {"network": "juwels_booster", "allreduce": {"nodes": 2, "procs_per_node": 4, "bytes": 100_000_000}}
    t = 14 * 5e-6 + 1.75e8 / 1e11
    assert validate.predict_bus_bandwidth(case) == pytest.approx(1.75e8 / t / 1e9)
