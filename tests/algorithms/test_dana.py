"""DANA and the asynchronous baselines: the rules on hand-checkable numbers, the paper's equivalences,
the gamma model's straggler rates, the simulator's shared schedule, and real parameter-server runs."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import algorithms
from algorithms import async_rules as ar
from algorithms.base import Algorithm
from benchmarks import config
from benchmarks.config import ConfigError
from benchmarks.stragglers import GammaTimes

ROOT = Path(__file__).resolve().parents[2]
LR, M = 0.1, 0.9


def quadratic_grad(point: torch.Tensor) -> torch.Tensor:
    """Gradient of 0.5 x^T A x + b^T x with a fixed well-conditioned A (float64)."""
    a = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=torch.float64)
    b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    return a @ point + b


def run_rule(rule: str, workers: int, order: list[int], lr=LR, **knobs) -> list[torch.Tensor]:
    """Serve gradients in ``order`` (a fixed arrival schedule); returns every vector sent."""
    theta = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    master = ar.make_master(rule, theta, workers, M, **knobs)
    point = [master.sent(i) for i in range(workers)]
    v = [torch.zeros_like(theta) for _ in range(workers)]
    out = []
    for step, i in enumerate(order):
        g = quadratic_grad(point[i])
        payload = ar.slim_payload(v[i], g, M) if rule == "dana_slim" else g
        point[i] = master.apply(i, payload, lr(step) if callable(lr) else lr)
        out.append(point[i].clone())
    return out


def test_one_step_by_hand():
    theta = torch.tensor([1.0])
    g = torch.tensor([2.0])
    zero = ar.make_master("dana_zero", theta, 2, M)
    # v0 = 2; theta = 1 - 0.1*2 = 0.8; look-ahead = 0.8 - 0.1*0.9*(2 + 0) = 0.62
    assert zero.apply(0, g, LR).item() == pytest.approx(0.62)
    nag = ar.make_master("nag_asgd", theta, 2, M)
    # v = 2; theta = 1 - 0.1*(2 + 0.9*2) = 0.62 (PyTorch Nesterov); heavy-ball: 1 - 0.1*2 = 0.8
    assert nag.apply(0, g, LR).item() == pytest.approx(0.62)
    assert ar.make_master("nag_asgd", theta, 2, M, nag_form="heavy_ball").apply(0, g, LR).item() == pytest.approx(0.8)
    multi = ar.make_master("multi_asgd", theta, 2, M)
    multi.apply(0, g, LR)  # v0 = 2, theta = 0.8
    # worker 1's own momentum starts at zero: v1 = 2, theta = 0.8 - 0.2 = 0.6; worker 0 again: v0 = 1.8+2
    assert multi.apply(1, g, LR).item() == pytest.approx(0.6)
    assert multi.apply(0, g, LR).item() == pytest.approx(0.6 - 0.1 * 3.8)
    v = torch.tensor([1.0])
    assert ar.slim_payload(v, g, M).item() == pytest.approx(2 + 0.9 * 2.9) and v.item() == pytest.approx(2.9)


def test_delay_compensation_by_hand():
    g, drift = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    # g + lam * g * g * drift = [1 + 2*1*0.5, 2 + 2*4*(-1)]
    assert ar.delay_compensated(g, drift, 2.0).tolist() == [2.0, -6.0]
    dc = ar.DelayCompensation(g, 1, lam0=2.0, mode="adaptive", decay=0.95, eps=0.0)
    # mean square after one gradient: 0.05 * g^2 = [0.05, 0.2]; lam = 2 / sqrt(ms)
    lam = 2.0 / torch.tensor([0.05, 0.2]).sqrt()
    expected = g + lam * g * g * drift
    assert torch.allclose(dc(0, g, drift), expected)
    assert torch.allclose(dc.mean_square[0], torch.tensor([0.05, 0.2]))


def test_dc_asgd_compensates_the_drift_since_its_last_send():
    theta = torch.tensor([0.0])
    master = ar.make_master("dc_asgd", theta, 2, M, dc={"lam0": 1.0, "mode": "constant", "decay": 0.95, "eps": 0.0})
    master.apply(0, torch.tensor([1.0]), LR)  # worker 0: no drift yet; v0 = 1, theta = -0.1
    # worker 1 computed at 0; the master moved to -0.1: g_hat = 2 + 1*4*(-0.1) = 1.6; theta = -0.1 - 0.16
    assert master.apply(1, torch.tensor([2.0]), LR).item() == pytest.approx(-0.26)


def test_dana_slim_sends_what_dana_zero_sends_at_constant_lr():
    order = [0, 1, 2, 0, 2, 1, 1, 0, 2, 2, 0, 1] * 3
    zero, slim = run_rule("dana_zero", 3, order), run_rule("dana_slim", 3, order)
    for a, b in zip(zero, slim):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_multi_asgd_is_not_dana_slim():
    order = [0, 1, 2, 0, 2, 1] * 3
    diff = max(
        (a - b).abs().max().item() for a, b in zip(run_rule("multi_asgd", 3, order), run_rule("dana_slim", 3, order))
    )
    assert diff > 1e-3


@pytest.mark.parametrize(
    "rule, knobs", [("dana_zero", {}), ("dana_slim", {}), ("dana_dc", {"dc_anchor": "lookahead"}), ("nag_asgd", {})]
)
def test_one_worker_is_single_worker_nag(rule, knobs):
    """With N = 1 every DANA variant computes its gradients where torch's Nesterov SGD does (DANA-DC
    with the ``lookahead`` anchor; Alg. 7 as printed corrects even an undelayed worker, next test)."""
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=LR, momentum=M, nesterov=True)
    points = []
    for _ in range(30):
        p.grad = quadratic_grad(p.detach())
        opt.step()
        points.append(p.detach().clone())
    for a, b in zip(run_rule(rule, 1, [0] * 30, **knobs), points):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_one_worker_multi_and_dc_asgd_are_heavy_ball():
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=LR, momentum=M)
    points = []
    for _ in range(20):
        p.grad = quadratic_grad(p.detach())
        opt.step()
        points.append(p.detach().clone())
    for rule in ("multi_asgd", "dc_asgd"):
        for a, b in zip(run_rule(rule, 1, [0] * 20), points):
            assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_dana_dc_spec_anchor_differs_without_delay():
    """The printed reading (drift = theta^0 - look-ahead sent) corrects even a single undelayed worker."""
    a = run_rule("dana_dc", 1, [0] * 10)  # the default anchor, ``sent``
    b = run_rule("dana_zero", 1, [0] * 10)
    assert max((x - y).abs().max().item() for x, y in zip(a, b)) > 1e-6


def test_v_sum_stays_the_sum_of_the_momenta():
    master = ar.make_master("dana_zero", torch.zeros(4), 3, M)
    for step in range(200):
        master.apply(step % 3, torch.randn(4), LR)
    assert torch.allclose(master.v_sum, master.v.sum(0), atol=1e-5)


def test_gamma_straggler_rates_match_the_paper():
    """P(t > 1.25 x mean): 0.93 % homogeneous, 27.86 % heterogeneous (App. A.4 states 1 % and 27.9 %)."""
    mean = 128.0
    homog = GammaTimes("gamma", 1, mean, seed=0).sample(0, 400_000)
    sd = (0.0093 * 0.9907 / homog.size) ** 0.5
    assert homog.mean() == pytest.approx(mean, rel=0.002)
    assert abs((homog >= 1.25 * mean).mean() - 0.0093) < 4 * sd
    het = GammaTimes("gamma_het", 100_000, mean, seed=1)
    times = np.concatenate([het.rng.gamma(het.shape, het.means / het.shape) for _ in range(4)])
    sd = (0.2786 * 0.7214 / 100_000) ** 0.5  # one draw of the machine means per worker dominates
    assert abs((times >= 1.25 * mean).mean() - 0.2786) < 4 * sd
    assert times.mean() == pytest.approx(mean, rel=0.02)


def simulate(
    run_command: list[str], tmp_path: Path, algorithm: str, workers: int, *extra: str
) -> tuple[dict, list[dict]]:
    out = tmp_path / algorithm
    cmd = [
        *run_command,
        "--algorithm",
        algorithm,
        "--task",
        "digits",
        "--nodes",
        "1",
        "--procs-per-node",
        str(workers),
        "--seed",
        "3",
        "--out",
        str(out),
        "--set",
        "clock=simulated",
        "--set",
        "wandb=false",
        *extra,
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    with open(out / "metrics.csv") as f:
        return json.loads((out / "summary.json").read_text()), list(csv.DictReader(f))


def test_simulator_shares_one_schedule_and_writes_a_simulated_run(tmp_path, run_command):
    a_sum, a_rows = simulate(run_command, tmp_path, "dana_dc", 8, "--set", "straggler=gamma")
    b_sum, b_rows = simulate(run_command, tmp_path, "nag_asgd", 8, "--set", "straggler=gamma")
    assert a_sum["clock"] == b_sum["clock"] == "simulated" and a_sum["status"] == "completed"
    assert [r["lag"] for r in a_rows] == [r["lag"] for r in b_rows]  # identical arrival schedule
    assert [r["wall_s"] for r in a_rows] == [r["wall_s"] for r in b_rows]
    assert float(a_rows[-1]["lag"]) == pytest.approx(7, abs=0.5)  # homogeneous: mean lag about N - 1
    mean_gap = [sum(float(r["gap"]) for r in rows) / len(rows) for rows in (a_rows, b_rows)]
    assert mean_gap[0] < mean_gap[1]  # DANA's look-ahead shrinks the gap
    assert a_sum["final_metric"] > 0.9


def test_simulated_synchronous_reference_waits_for_the_slowest_batch(tmp_path, run_command):
    """allreduce on the virtual cluster under DANA's heterogeneous gamma model: each step waits for
    the slowest of the P batch times drawn for it (plus the evaluations, and the all-reduce,
    microseconds here)."""
    summary, rows = simulate(run_command, tmp_path, "allreduce", 4, "--set", "epochs=3", "--set", "straggler=gamma_het")
    assert summary["status"] == "completed" and summary["clock"] == "simulated"
    assert summary["final_metric"] > 0.8
    steps = summary["steps"]  # per worker: 1438 // (16 x 4) = 22 an epoch
    times = GammaTimes("gamma_het", 4, 0.100, 3)  # sim_step_ms 100, seed 3: the run's draws
    slowest = sum(times.draw_all().max() for _ in range(steps))
    evaluations = 3 * 90 / 16 * 0.100 / 3  # 90 samples a rank, forward only: a third of a batch of 16 each
    assert steps == 3 * 22 and summary["wall_s"] == pytest.approx(slowest + evaluations, rel=1e-3)
    assert slowest > steps * 0.100  # the heterogeneous machines' slowest is slower than the mean


def test_simulated_clock_rejects_an_algorithm_without_a_simulator(tmp_path, monkeypatch):
    """Every registered algorithm runs on the virtual clock (or the parameter server's simulator); a
    new one whose class names no simulator is refused by name before anything starts."""
    assert [name for name in algorithms.names() if algorithms.get(name).simulator is None] == []

    class Plain(Algorithm):
        def step(self) -> None:
            self.optimizer.step()

    monkeypatch.setitem(algorithms.REGISTRY, "plain", Plain)
    with pytest.raises(ConfigError, match="'plain' has no simulator; simulated algorithms: ddp"):
        config.resolve("plain", "digits", 1, 2, 0, tmp_path, ["clock=simulated"])


@pytest.mark.parametrize(
    "algorithm", ["asgd", "nag_asgd", "multi_asgd", "dc_asgd", "dana_zero", "dana_slim", "dana_dc"]
)
def test_parameter_server_trains(tmp_path, algorithm, run_command):
    """A real master and two workers (three gloo processes) train the digits CNN far above chance (10 %)."""
    out = tmp_path / algorithm
    cmd = [
        *run_command,
        "--algorithm",
        algorithm,
        "--task",
        "digits",
        "--nodes",
        "1",
        "--procs-per-node",
        "3",
        "--seed",
        "0",
        "--out",
        str(out),
        "--set",
        "wandb=false",
        "--set",
        "epochs=4",
        "--set",
        "threads=1",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert summary["status"] == "completed" and summary["best_metric"] > 0.7
    assert summary["samples"] == 4 * (1438 // 16) * 16  # epochs of M/B master updates (our reading)
    assert float(rows[-1]["lag"]) > 0 and float(rows[-1]["gap"]) > 0


def test_report_sets_accuracy_and_gap_beside_the_paper_and_checks_the_ordering(tmp_path):
    """Hand-made simulated runs at 16 workers (nodes 8 x 2): medians over seeds, mean gaps, the paper's
    Table 2 column, and the ordering verdict (holds at 16, fails where NAG-ASGD beats DANA-Slim)."""
    from analysis import aggregate, dana
    from tests.analysis.test_analysis import write_run

    finals = {"dana_dc": [0.95, 0.97, 0.96], "dana_slim": [0.94, 0.92, 0.93], "nag_asgd": [0.2, 0.1, 0.3]}
    for algo, values in finals.items():
        for seed, final in enumerate(values):
            write_run(
                tmp_path,
                algo,
                seed,
                status="completed",
                tta=None,
                walls=[1.0, 2.0],
                metrics=[0.5, final],
                nodes=8,
                clock="simulated",
                settings={"straggler": "gamma", "clock": "simulated"},
                extra={"gap": [0.01 * (seed + 1), 0.03 * (seed + 1)] if algo == "nag_asgd" else [0.001, 0.003]},
            )
    write_run(
        tmp_path,
        "dana_slim",
        0,
        status="completed",
        tta=None,
        walls=[1.0],
        metrics=[0.5],
        nodes=4,
        clock="simulated",
        settings={"straggler": "gamma", "clock": "simulated"},
        extra={"gap": [0.0]},
    )
    write_run(
        tmp_path,
        "dana_dc",
        0,
        status="completed",
        tta=None,
        walls=[1.0],
        metrics=[0.6],
        nodes=4,
        clock="simulated",
        settings={"straggler": "gamma", "clock": "simulated"},
        extra={"gap": [0.0]},
    )
    write_run(
        tmp_path,
        "nag_asgd",
        0,
        status="completed",
        tta=None,
        walls=[1.0],
        metrics=[0.7],
        nodes=4,
        clock="simulated",
        settings={"straggler": "gamma", "clock": "simulated"},
        extra={"gap": [0.0]},
    )
    for algo in ("allreduce", "ddp"):  # another paper's suite (DASO's) that runs no DANA variant: no table
        write_run(
            tmp_path,
            algo,
            0,
            suite="daso-like",
            status="completed",
            tta=None,
            walls=[1.0],
            metrics=[0.9],
            nodes=8,
            clock="simulated",
            settings={"straggler": "none", "clock": "simulated"},
        )
    runs = aggregate.load_runs(tmp_path)
    ((title, table),) = dana.comparison(runs, aggregate.load_curves(tmp_path, runs))
    assert "simulated" in title and "Table 2" in title
    row16 = table.set_index("workers").loc[16]
    assert row16["dana_dc acc"] == pytest.approx(0.96) and row16["dana_slim acc"] == pytest.approx(0.93)
    assert row16["nag_asgd gap"] == pytest.approx(0.04)  # seeds' mean gaps 0.02, 0.04, 0.06: median 0.04
    assert row16["paper dana_dc"] == pytest.approx(91.01) and row16["paper nag_asgd"] == pytest.approx(17.45)
    assert row16["ordering"] == "holds"
    assert table.set_index("workers").loc[8, "ordering"] == (  # NAG-ASGD 0.7 > DC 0.6 > Slim 0.5
        "does not hold: dana_dc < nag_asgd, dana_slim < nag_asgd"
    )
    assert "holds here in 1 of 1 settings" in dana.verdict([(title, table)])
    # The tables step writes the tables a row per cell, and the report reads each back as it was: its
    # own columns in their order, one with no value (a synchronous reference has no gap) and a table
    # without rows (a setting whose worker counts have no DANA run) included.
    shown = [(title, table.assign(**{"allreduce gap": float("nan")})), ("none", table.iloc[:0, [0, 1, -1]])]
    dana.cell_rows(shown).to_csv(tmp_path / "dana.csv", index=False)
    read = dana.read(tmp_path / "dana.csv")
    assert [t for t, _ in read] == [title, "none"] and list(read[1][1].columns) == [
        "workers",
        "dana_dc acc",
        "ordering",
    ]
    for (_, frame), (_, back) in zip(shown, read):
        pd.testing.assert_frame_equal(back, frame, check_dtype=False)
    # Each DANA variant against each baseline: DANA-Slim below DC-ASGD breaks the ordering, although
    # DANA-DC >= DANA-Slim > NAG-ASGD (the only pairs the check once compared) still holds.
    row = pd.Series(
        {"dana_dc acc": 0.96, "dana_slim acc": 0.90, "dc_asgd acc": 0.95, "multi_asgd acc": 0.89, "nag_asgd acc": 0.30}
    )
    assert dana.ordering(row) == "does not hold: dana_slim < dc_asgd"
    assert dana.ordering(row.drop(["dc_asgd acc", "multi_asgd acc", "nag_asgd acc"])) == "n/a"
    # both at chance (0.106 against 0.092 on a 10-class task): no ordering is read, whichever is higher
    assert dana.ordering(pd.Series({"dana_dc acc": 0.106, "nag_asgd acc": 0.092})) == dana.AT_CHANCE
    assert dana.ordering(pd.Series({"dana_dc acc": 0.9, "nag_asgd acc": 0.092})) == "holds"
    at_chance = [("t", pd.DataFrame({"workers": [16], "ordering": [dana.AT_CHANCE]}))]
    assert dana.verdict(at_chance).endswith("near chance here: no ordering to read.")  # not "holds in 0 of 1"
    # the report's columns in the paper's units: percent beside percent, one meaning per word
    from analysis import report

    (shown,) = report.dana_section([(title, table)])["tables"]
    columns = shown["table"]["columns"]
    assert "dana_dc accuracy (%)" in columns and "paper dana_dc (%)" in columns
    assert "nag_asgd parameter distance" in columns and not any(c.endswith(" gap") for c in columns)
    row = dict(zip(columns, shown["table"]["rows"][-1]))  # 16 workers
    assert (row["dana_dc accuracy (%)"], row["paper dana_dc (%)"]) == ("96.0", "91.01")


def test_dana_dc_default_anchor_is_algorithm_7_as_printed():
    """Alg. 7 by hand, with the default anchor: g_hat = g + lam g*g*(theta^0 - theta^i), theta^i the
    look-ahead last sent to worker i (Sec. 4.3); v^i = m v^i + g_hat; theta^0 -= lr v^i; send
    theta_hat = theta^0 - lr m sum_j v^j. Two workers, m = 0.9, lr = 0.1, constant lambda = 2."""
    theta = torch.tensor([1.0, 2.0], dtype=torch.float64)
    master = ar.DanaDc(theta, 2, M, {"lam0": 2.0, "mode": "constant", "decay": 0.95, "eps": 0.0})
    # 1. worker 0, g = [1, -1] computed at theta_0 = [1, 2] = what it was sent: drift 0, g_hat = g.
    #    v0 = [1, -1]; theta^0 = [1, 2] - 0.1 [1, -1] = [0.9, 2.1];
    #    sent = [0.9, 2.1] - 0.1*0.9 [1, -1] = [0.81, 2.19]
    sent0 = master.apply(0, torch.tensor([1.0, -1.0], dtype=torch.float64), LR)
    assert sent0.tolist() == pytest.approx([0.81, 2.19])
    assert master.params.tolist() == pytest.approx([0.9, 2.1])
    # 2. worker 1, g = [0.5, 1] computed at theta_0 = [1, 2]: drift = [0.9, 2.1] - [1, 2] = [-0.1, 0.1]
    #    g_hat = [0.5 + 2*0.25*(-0.1), 1 + 2*1*0.1] = [0.45, 1.2] = v1 (v1 was 0)
    #    theta^0 = [0.9, 2.1] - 0.1 [0.45, 1.2] = [0.855, 1.98]; sum v = [1.45, 0.2]
    #    sent = [0.855 - 0.09*1.45, 1.98 - 0.09*0.2] = [0.7245, 1.962]
    #    (the ``lookahead`` anchor would take drift = [0.81, 2.19] - [1, 2] and g_hat = [0.405, 1.38])
    sent1 = master.apply(1, torch.tensor([0.5, 1.0], dtype=torch.float64), LR)
    assert master.v[1].tolist() == pytest.approx([0.45, 1.2])
    assert master.params.tolist() == pytest.approx([0.855, 1.98])
    assert sent1.tolist() == pytest.approx([0.7245, 1.962])
    # 3. worker 0, g = [-1, 2] computed at its look-ahead [0.81, 2.19]:
    #    drift = [0.855, 1.98] - [0.81, 2.19] = [0.045, -0.21]
    #    g_hat = [-1 + 2*1*0.045, 2 + 2*4*(-0.21)] = [-0.91, 0.32]
    #    v0 = 0.9 [1, -1] + [-0.91, 0.32] = [-0.01, -0.58]
    #    theta^0 = [0.855, 1.98] - 0.1 [-0.01, -0.58] = [0.856, 2.038]; sum v = [0.44, 0.62]
    #    sent = [0.856 - 0.09*0.44, 2.038 - 0.09*0.62] = [0.8164, 1.9822]
    sent0 = master.apply(0, torch.tensor([-1.0, 2.0], dtype=torch.float64), LR)
    g_hat = master.v[0] - M * torch.tensor([1.0, -1.0], dtype=torch.float64)
    assert g_hat.tolist() == pytest.approx([-0.91, 0.32])
    assert master.v[0].tolist() == pytest.approx([-0.01, -0.58])
    assert master.params.tolist() == pytest.approx([0.856, 2.038])
    assert sent0.tolist() == pytest.approx([0.8164, 1.9822])
    assert master.anchor == ar.make_master("dana_dc", theta, 2, M).anchor == "sent"  # the default, both ways


def dana_sim_sets(algorithm: str) -> list[str]:
    """The ``--set`` items config/dana-sim.yaml gives ``algorithm``'s runs, as the Snakefile builds them."""
    import yaml

    from benchmarks import matrix

    (m,) = [
        m
        for m in matrix.matrices(yaml.safe_load((ROOT / "config/dana-sim.yaml").read_text()))
        if m["suite"] == "dana-sim"
    ]
    items = matrix.overrides_for(algorithm, "digits", m["overrides"])
    return [arg for item in items for arg in ("--set", item)]


def test_simulated_reference_of_dana_sim_takes_the_large_batch_lr(tmp_path, run_command):
    """dana-sim's synchronous reference at 8 workers averages 8 gradients per update: after its warm-up
    from 0.02 it logs lr 0.02 x 8 and, with 8 times fewer updates than a parameter server, beats the same
    run at the single-worker lr. (The parameter servers' 0.02 is checked in tests/benchmarks/test_config.py.)"""
    short = ["--set", "epochs=3", "--set", "warmup_epochs=1"]  # a cosine over 3 epochs: 11 updates each
    summary, rows = simulate(run_command, tmp_path, "allreduce", 8, *dana_sim_sets("allreduce"), *short)
    config_json = json.loads((tmp_path / "allreduce" / "config.json").read_text())
    assert config_json["hparams"]["lr"] == pytest.approx(0.16) and config_json["settings"]["scale_lr"] is True
    assert float(rows[0]["lr"]) == pytest.approx(0.16)  # end of the warm-up: the next update's lr is the peak
    plain, _ = simulate(
        run_command, tmp_path / "plain", "allreduce", 8, *dana_sim_sets("allreduce"), *short, "--set", "scale_lr=false"
    )
    assert summary["final_metric"] > plain["final_metric"] + 0.2  # seed 3: 0.92 against 0.44
