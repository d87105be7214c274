"""Tests of ``analysis/`` on hand-made run directories with hand-checkable numbers.

One task (``digits``) on 1 node × 2 processes, suite ``local``:

- ``ddp``: seeds 0, 1, 2 reach the target at 10, 12, 14 s (median 12, 3 converged); seed 3
  completes without reaching it (k/n = 3/4).
- ``allreduce``: seeds 0, 1 reach it at 6 and 8 s (median 7); seed 2 fails with an error; seed 3
  is still running (no ``summary.json``): k/n = 2/3, one incomplete.

Speed-up of allreduce over DDP: 12 / 7.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import aggregate, figures, report, tables

SUITE, TASK, NODES, PPN = "local", "digits", 1, 2
TARGET = 0.9
ERROR = "RuntimeError: NCCL watchdog timed out on rank 1"


def write_run(results: Path, algorithm: str, seed: int, *, status: str | None,
              tta: float | None, walls: list[float], metrics: list[float],
              error: str | None = None, extra: dict[str, list[float]] | None = None) -> Path:
    """Write one run directory; ``status=None`` leaves out summary.json (an unfinished run)."""
    run_id = f"{TASK}__{algorithm}__n{NODES}x{PPN}__s{seed}"
    run_dir = results / "runs" / SUITE / run_id
    run_dir.mkdir(parents=True)
    ident = {"suite": SUITE, "run_id": run_id, "algorithm": algorithm, "task": TASK,
             "nodes": NODES, "procs_per_node": PPN, "world_size": NODES * PPN, "seed": seed}
    (run_dir / "config.json").write_text(json.dumps({**ident, "lr": 0.1}))
    (run_dir / "env.json").write_text(json.dumps({
        "python": "3.11.7", "torch": "2.13.0", "hosts": ["node01", f"node0{2 + seed % 2}"],
        "git_commit": "f7ed4d1", "backend": "gloo", "launcher": "local", "slurm_job_id": None}))
    frame = pd.DataFrame({
        "epoch": range(1, len(walls) + 1), "step": [10 * (i + 1) for i in range(len(walls))],
        "samples": [640 * (i + 1) for i in range(len(walls))], "wall_s": walls,
        "train_loss": [1.0 / (i + 1) for i in range(len(walls))], "val_loss": [0.5] * len(walls),
        "val_metric": metrics, "lr": [0.1] * len(walls),
        "comm_s": [None] * len(walls) if algorithm == "ddp" else [0.5 * w for w in walls],
        **(extra or {})})
    frame.to_csv(run_dir / "metrics.csv", index=False)
    if status is not None:
        (run_dir / "summary.json").write_text(json.dumps({
            **ident, "status": status, "time_to_target_s": tta, "epochs_to_target": None,
            "final_metric": metrics[-1] if metrics else None, "best_metric": max(metrics or [0]),
            "final_train_loss": 0.1, "epochs": len(walls), "steps": 10 * len(walls),
            "samples": 640 * len(walls), "wall_s": walls[-1] if walls else 0.0,
            "throughput": 100.0 * (seed + 1), "comm_share": None if algorithm == "ddp" else 0.5,
            "metric": "accuracy", "target": TARGET, "clock": "wall", "error": error}))
    return run_dir


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    for seed, tta in enumerate([10.0, 12.0, 14.0]):
        write_run(root, "ddp", seed, status="completed", tta=tta,
                  walls=[tta / 2, tta, tta + 4], metrics=[0.5, 0.92, 0.95])
    write_run(root, "ddp", 3, status="completed", tta=None, walls=[5.0, 10.0, 20.0],
              metrics=[0.4, 0.6, 0.8])
    for seed, tta in enumerate([6.0, 8.0]):
        write_run(root, "allreduce", seed, status="completed", tta=tta, walls=[tta / 2, tta],
                  metrics=[0.6, 0.91], extra={"bucket_mb": [25.0, 25.0]})
    write_run(root, "allreduce", 2, status="failed", tta=None, walls=[3.0], metrics=[0.5],
              error=ERROR)
    write_run(root, "allreduce", 3, status=None, tta=None, walls=[2.0], metrics=[0.3])
    return root


@pytest.fixture(scope="module")
def table(results: Path) -> pd.DataFrame:
    return tables.time_to_target(aggregate.load_runs(results)).set_index("algorithm")


def test_load_runs_one_row_per_directory(results: Path) -> None:
    runs = aggregate.load_runs(results).set_index("run_id")
    assert len(runs) == 8
    assert runs.loc["digits__allreduce__n1x2__s3", "status"] == aggregate.INCOMPLETE
    assert runs.loc["digits__allreduce__n1x2__s2", "error"] == ERROR
    assert math.isnan(runs.loc["digits__allreduce__n1x2__s2", "time_to_target_s"])
    assert runs.loc["digits__ddp__n1x2__s1", "hosts"] == "node01,node03"
    assert runs.loc["digits__ddp__n1x2__s1", "backend"] == "gloo"
    assert runs["nodes"].tolist() == [1] * 8


def test_load_curves_keeps_every_row_and_extra_columns(results: Path) -> None:
    curves = aggregate.load_curves(results)
    assert len(curves) == 4 * 3 + 2 * 2 + 1 + 1
    assert {"run_id", "algorithm", "seed", "status", "bucket_mb"} <= set(curves.columns)
    assert curves.loc[curves["algorithm"] == "ddp", "comm_s"].isna().all()


def test_medians_min_max_and_k_of_n(table: pd.DataFrame) -> None:
    ddp, allreduce = table.loc["ddp"], table.loc["allreduce"]
    assert (ddp["n"], ddp["k"], ddp["k/n"]) == (4, 3, "3/4")
    assert (ddp["tta_median_s"], ddp["tta_min_s"], ddp["tta_max_s"]) == (12.0, 10.0, 14.0)
    assert (allreduce["n"], allreduce["k"], allreduce["k/n"]) == (3, 2, "2/3")
    assert allreduce[["tta_median_s", "tta_min_s", "tta_max_s"]].tolist() == [7.0, 6.0, 8.0]
    assert allreduce["incomplete"] == 1 and ddp["incomplete"] == 0


def test_speedup_against_ddp(table: pd.DataFrame) -> None:
    assert table.loc["ddp", "speedup_vs_ddp"] == 1.0
    assert table.loc["allreduce", "speedup_vs_ddp"] == pytest.approx(12 / 7)


def test_speedup_is_nan_without_a_ddp_time(results: Path) -> None:
    runs = aggregate.load_runs(results)
    runs.loc[runs["algorithm"] == "ddp", "time_to_target_s"] = float("nan")
    table = tables.time_to_target(runs).set_index("algorithm")
    assert table.loc["ddp", "k/n"] == "0/4"
    assert math.isnan(table.loc["ddp", "tta_median_s"])
    assert math.isnan(table.loc["allreduce", "speedup_vs_ddp"])


def test_failures_counted_and_medians_over_finished_runs(table: pd.DataFrame) -> None:
    assert (table.loc["allreduce", "failed"], table.loc["allreduce", "diverged"]) == (1, 0)
    assert table.loc["ddp", ["failed", "diverged", "timeout"]].tolist() == [0, 0, 0]
    assert table.loc["ddp", "throughput_median"] == 250.0  # 100, 200, 300, 400
    assert table.loc["allreduce", "comm_share_median"] == 0.5
    assert math.isnan(table.loc["ddp", "comm_share_median"])


def test_display_and_markdown(table: pd.DataFrame) -> None:
    shown = tables.display_table(table.reset_index()).set_index("algorithm")
    assert shown.loc["allreduce", "speed-up vs DDP"] == "1.71×"
    assert shown.loc["ddp", "median time to target (s)"] == "12.0"
    assert shown.loc["ddp", "min–max (s)"] == "10.0–14.0"
    markdown = tables.to_markdown(shown.reset_index())
    assert markdown.splitlines()[0].startswith("| algorithm |")
    assert len(markdown.splitlines()) == 4


def test_step_values_hold_last_value() -> None:
    values = figures.step_values(np.array([3.0, 1.0]), np.array([0.6, 0.2]),
                                 np.array([0.5, 1, 2, 3, 9]))
    assert math.isnan(values[0]) and values[1:].tolist() == [0.2, 0.2, 0.6, 0.6]


def test_median_band_over_seeds(results: Path) -> None:
    # allreduce, finished seeds: s0 (3 s: 0.6, 6 s: 0.91), s1 (4 s: 0.6, 8 s: 0.91), s2 (3 s: 0.5).
    curves = aggregate.load_curves(results)
    curves = curves[(curves["algorithm"] == "allreduce")
                    & (curves["status"] != aggregate.INCOMPLETE)]
    grid, median, low, high = figures.median_band(curves)
    assert grid.tolist() == [3.0, 4.0, 6.0, 8.0]
    assert median.tolist() == pytest.approx([0.55, 0.6, 0.6, 0.91])
    assert low.tolist() == [0.5] * 4 and high.tolist() == [0.6, 0.6, 0.91, 0.91]


def test_figures_written(results: Path, tmp_path: Path) -> None:
    runs = aggregate.load_runs(results)
    paths = figures.plot_metric_vs_time(runs, aggregate.load_curves(results, runs), tmp_path)
    stem = "local__digits__n1x2__metric_vs_time"
    assert [p.name for p in paths] == [f"{stem}.png", f"{stem}.svg"]
    assert paths[0].read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in paths[1].read_bytes()[:2000]


def test_report_is_self_contained(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report.main(["--results", str(results)])
    path = Path(capsys.readouterr().out.strip())
    assert path == results / "report.html"
    for name in ["runs.csv", "curves.csv", "time_to_target.csv", "time_to_target.md"]:
        assert (results / "tables" / name).stat().st_size > 0
    assert (results / "figures" / "local__digits__n1x2__metric_vs_time.svg").is_file()
    text = path.read_text(encoding="utf-8")
    for heading in ["Summary", "Suite: local", "Runs that did not converge or failed",
                    "Run metadata"]:
        assert f">{heading}</h2>" in text
    summary = text.split("<h2>Summary</h2>")[1].split("<h2>")[0]
    assert "<td>allreduce</td>" in summary and "1.71×" in summary and "7.0" in summary
    problems = text.split("did not converge or failed</h2>")[1].split("<h2>")[0]
    assert "digits__allreduce__n1x2__s2" in problems and ERROR in problems
    assert "digits__ddp__n1x2__s3" in problems and aggregate.INCOMPLETE in problems
    assert "digits__ddp__n1x2__s0" not in problems
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert "node01, node02, node03" in text


def test_global_syncs_against_ddp_on_hand_made_curves():
    import pandas as pd

    from analysis import tables

    rows = []
    for seed, syncs in ((0, [22, 7, 7]), (1, [22, 7, 9])):  # per-epoch global syncs of two DASO seeds
        for epoch, n in enumerate(syncs, start=1):
            rows.append({"suite": "s", "task": "t", "nodes": 2, "procs_per_node": 2, "algorithm": "daso",
                         "run_id": f"r{seed}", "epoch": epoch, "step": 22 * epoch, "global_syncs": n,
                         "global_sync_bytes": 100 * n})
    rows.append({"suite": "s", "task": "t", "nodes": 2, "procs_per_node": 2, "algorithm": "ddp", "run_id": "d",
                 "epoch": 1, "step": 22, "global_syncs": float("nan"), "global_sync_bytes": float("nan")})
    out = tables.global_syncs(pd.DataFrame(rows))
    assert list(out["algorithm"]) == ["daso"]  # DDP has no such column values
    row = out.iloc[0]
    assert row["syncs"] == 37 and row["steps"] == 66  # median of 36 and 38; 3 epochs x 22 steps
    assert abs(row["saved vs DDP"] - (1 - 37 / 66)) < 1e-12 and row["sync_bytes"] == 3700
