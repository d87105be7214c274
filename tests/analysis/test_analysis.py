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
import shutil
from pathlib import Path

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest

from analysis import (
    aggregate,
    artefacts,
    claims,
    dana,
    figures,
    leaders,
    overview,
    papers,
    plotting,
    profile,
    report,
    scaling,
    stragglers,
    tables,
    traces,
)
from benchmarks import naming

SUITE, TASK, NODES, PPN = "local", "digits", 1, 2
TARGET = 0.9
ERROR = "RuntimeError: NCCL watchdog timed out on rank 1"


def write_run(
    results: Path,
    algorithm: str,
    seed: int,
    *,
    status: str | None,
    tta: float | None,
    walls: list[float],
    metrics: list[float],
    error: str | None = None,
    extra: dict[str, list[float]] | None = None,
    suite: str = SUITE,
    nodes: int = NODES,
    settings: dict | None = None,
    clock: str = "wall",
    throughput: float | None = None,
    step_s: float | None = None,
) -> Path:
    """Write one run directory; ``status=None`` leaves out summary.json (an unfinished run). A run
    makes 10 steps an epoch, in ``step_s`` seconds each (default: its wall time over its steps)."""
    run_id = f"{TASK}__{algorithm}__n{nodes}x{PPN}__s{seed}"
    run_dir = results / "runs" / suite / run_id
    run_dir.mkdir(parents=True)
    ident = {
        "suite": suite,
        "run_id": run_id,
        "algorithm": algorithm,
        "task": TASK,
        "nodes": nodes,
        "procs_per_node": PPN,
        "world_size": nodes * PPN,
        "seed": seed,
    }
    (run_dir / "config.json").write_text(
        json.dumps({**ident, "lr": 0.1, "settings": settings or {"straggler": "none"}})
    )
    (run_dir / "env.json").write_text(
        json.dumps(
            {
                "python": "3.11.7",
                "torch": "2.13.0",
                "hosts": ["node01", f"node0{2 + seed % 2}"],
                "git_commit": "f7ed4d1",
                "backend": "gloo",
                "launcher": "local",
                "slurm_job_id": None,
            }
        )
    )
    frame = pd.DataFrame(
        {
            "epoch": range(1, len(walls) + 1),
            "step": [10 * (i + 1) for i in range(len(walls))],
            "samples": [640 * (i + 1) for i in range(len(walls))],
            "wall_s": walls,
            "train_loss": [1.0 / (i + 1) for i in range(len(walls))],
            "val_loss": [0.5] * len(walls),
            "val_metric": metrics,
            "lr": [0.1] * len(walls),
            "comm_s": [None] * len(walls) if algorithm == "ddp" else [0.5 * w for w in walls],
            "sent_mb": [3.0 * w for w in walls],  # 3 MB a second
            **(extra or {}),
        }
    )
    frame.to_csv(run_dir / "metrics.csv", index=False)
    if status is not None:
        (run_dir / "summary.json").write_text(
            json.dumps(
                {
                    **ident,
                    "status": status,
                    "time_to_target_s": tta,
                    "epochs_to_target": None,
                    "final_metric": metrics[-1] if metrics else None,
                    "best_metric": max(metrics or [0]),
                    "final_train_loss": 0.1,
                    "epochs": len(walls),
                    "steps": 10 * len(walls),
                    "samples": 640 * len(walls),
                    "wall_s": walls[-1] if walls else 0.0,
                    "step_s": step_s if step_s is not None or not walls else walls[-1] / (10 * len(walls)),
                    "throughput": 100.0 * (seed + 1) if throughput is None else throughput,
                    "comm_share": None if algorithm == "ddp" else 0.5,
                    "sent_mb_to_target": None if tta is None else 3.0 * tta,
                    "target_step_s": None if tta is None else tta / 2,  # from the row before, at tta / 2 below
                    "metric": "accuracy",
                    "target": TARGET,
                    "clock": clock,
                    "error": error,
                }
            )
        )
    return run_dir


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    for seed, tta in enumerate([10.0, 12.0, 14.0]):
        write_run(
            root, "ddp", seed, status="completed", tta=tta, walls=[tta / 2, tta, tta + 4], metrics=[0.5, 0.92, 0.95]
        )
    write_run(root, "ddp", 3, status="completed", tta=None, walls=[5.0, 10.0, 20.0], metrics=[0.4, 0.6, 0.8])
    for seed, tta in enumerate([6.0, 8.0]):
        write_run(
            root,
            "allreduce",
            seed,
            status="completed",
            tta=tta,
            walls=[tta / 2, tta],
            metrics=[0.6, 0.91],
            extra={"bucket_mb": [25.0, 25.0]},
        )
    write_run(root, "allreduce", 2, status="failed", tta=None, walls=[3.0], metrics=[0.5], error=ERROR)
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
    assert set(runs["straggler"]) == {"none"} and set(runs["clock"]) == {"wall"}


def test_load_curves_keeps_every_row_and_extra_columns(results: Path) -> None:
    curves = aggregate.load_curves(results)
    assert len(curves) == 4 * 3 + 2 * 2 + 1 + 1
    assert {"run_id", "algorithm", "seed", "status", "bucket_mb"} <= set(curves.columns)
    assert curves.loc[curves["algorithm"] == "ddp", "comm_s"].isna().all()


def test_medians_min_max_and_k_of_n(table: pd.DataFrame) -> None:
    ddp, allreduce = table.loc["ddp"], table.loc["allreduce"]
    assert (ddp["n"], ddp["k"], ddp["k/n"]) == (4, 3, "3/4")
    assert (ddp["tta_median_s"], ddp["tta_min_s"], ddp["tta_max_s"]) == (12.0, 10.0, 14.0)
    assert ddp["step_share_max"] == 0.5, "each target evaluation came half its time after the one before"
    assert tables.display_table(table.reset_index())[tables.STEP_AT_TARGET].iloc[0] in ("50%", "—")
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
    # DDP's converged times 10, 12, 14: a resample of 3 has median 10 with probability 7/27 (two 10s
    # or three), 14 likewise, so the 95 % interval is [10, 14]. allreduce's 6, 8: median 6 with
    # probability 1/4, 8 likewise. The ratio of medians runs from 10/8 to 14/6, each end with
    # probability 7/27 x 1/4 = 0.065 > 0.025: its interval is [1.25, 2.33].
    assert shown.loc["allreduce", "speed-up vs DDP"] == "1.71× [1.25, 2.33]"
    assert shown.loc["ddp", "median time to target (s)"] == "12.00 [10.00, 14.00]"
    assert table.loc["ddp", "speedup_low"] == table.loc["ddp", "speedup_high"] == 1.0  # DDP against itself
    assert shown.loc["ddp", "min–max (s)"] == "10.0–14.0"
    # MB to target: 3 MB a second, so 30, 36, 42 for DDP's seeds, with the times' interval times 3
    assert shown.loc["ddp", "MB sent a rank to target"] == "36 [30, 42]"
    markdown = tables.to_markdown(shown.reset_index())
    assert markdown.splitlines()[0].startswith("| algorithm |")
    assert len(markdown.splitlines()) == 4


def test_step_values_hold_last_value() -> None:
    values = figures.step_values(np.array([3.0, 1.0]), np.array([0.6, 0.2]), np.array([0.5, 1, 2, 3, 9]))
    assert math.isnan(values[0]) and values[1:].tolist() == [0.2, 0.2, 0.6, 0.6]


def test_median_band_over_seeds(results: Path) -> None:
    # allreduce, finished seeds: s0 (3 s: 0.6, 6 s: 0.91), s1 (4 s: 0.6, 8 s: 0.91), s2 (3 s: 0.5).
    curves = aggregate.load_curves(results)
    curves = curves[(curves["algorithm"] == "allreduce") & (curves["status"] != aggregate.INCOMPLETE)]
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
    paths = figures.plot_metric_vs_time(runs, aggregate.load_curves(results, runs), tmp_path, x="sent_mb")
    assert [p.name for p in paths] == [f"local__digits__n1x2__metric_vs_bytes.{ext}" for ext in ("png", "svg")]


def _drawn(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The figures the plotting functions draw, by file stem, kept open instead of saved."""
    drawn = {}

    def keep(fig: object, out_dir: Path, stem: str) -> list[Path]:
        drawn[stem] = fig
        return []

    monkeypatch.setattr(plotting, "save", keep)
    return drawn


def test_bytes_axis_is_logarithmic_from_the_smallest_count_sent(
    results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = aggregate.load_runs(results)
    curves = aggregate.load_curves(results, runs)
    curves.loc[curves.index[0], "sent_mb"] = 0.0  # an evaluation before the first message
    drawn = _drawn(monkeypatch)
    figures.plot_metric_vs_time(runs, curves, tmp_path, x="sent_mb")
    (ax,) = drawn["local__digits__n1x2__metric_vs_bytes"].axes[:1]
    finished = curves[curves["status"] != aggregate.INCOMPLETE]
    smallest = finished.loc[finished["sent_mb"] > 0, "sent_mb"].min()
    assert ax.get_xscale() == "log"
    assert ax.get_xlim()[0] == pytest.approx(smallest) and smallest > 0
    plotting.plt.close("all")


def test_no_scaling_figure_for_a_single_node_count(results: Path, tmp_path: Path) -> None:
    table = tables.time_to_target(aggregate.load_runs(results))  # one suite, all on 1 node
    assert scaling.plot_scaling(table[table["n"] > 0], tmp_path) == []
    assert not list(tmp_path.glob("*scaling*"))
    one, two = [("s", "digits", 1, 2)], [("s", "digits", 1, 2), ("s", "digits", 2, 2), ("o", "digits", 4, 2)]
    assert artefacts.figure_files("scaling", one, "png") == []  # the Snakefile declares what is drawn
    assert artefacts.figure_files("scaling", two, "svg") == ["s__digits__scaling.svg"]


def test_report_is_self_contained(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report.main(["--results", str(results)])
    path = Path(capsys.readouterr().out.strip())
    assert path == results / "report.html"
    for name in ["runs.csv", "curves.csv", "time_to_target.csv", "time_to_target.md"]:
        assert (results / "tables" / name).stat().st_size > 0
    assert (results / "figures" / "local__digits__n1x2__metric_vs_time.svg").is_file()
    assert (results / "figures" / "local__digits__n1x2__metric_vs_bytes.svg").is_file()
    text = path.read_text(encoding="utf-8")
    for heading in report.SECTIONS + ["Suite: local"]:
        assert f">{heading}</h2>" in text
    summary = text.split(">Summary</h2>")[1].split("<h2")[0]
    assert "<td>allreduce</td>" in summary and "1.71×" in summary and "7.0" in summary
    claimed = text.split(">Claims</h2>")[1].split("<h2")[0]  # the report opens with the claims
    assert text.index(">Claims</h2>") < text.index(">Summary</h2>")
    count = len(claims.load())
    assert claimed.count('<details class="claim">') == claimed.count('class="badge not-measured"') - 1 == count
    assert f"{count} not measured" in claimed and "config/claims.yaml" in claimed  # none measured by these runs
    assert "Each suite by what it measures (local: time to target)" in claimed  # the first figure's caption
    for name in ["scaling.csv", "performance_profile.csv", "stragglers.csv", "papers.csv"]:
        assert (results / "tables" / name).stat().st_size > 0
    for stem in [
        "first_to_target",
        "local__digits__n1x2__traces",
        "local__digits__stragglers",
        "performance_profile",
    ]:
        assert (results / "figures" / f"{stem}.png").read_bytes().startswith(b"\x89PNG")
        assert (results / "figures" / f"{stem}.svg").is_file()
    section = text.split(">Suite: local</h2>")[1].split('<details class="suite">')[0]
    assert "This suite ran on 1 node(s) only: nothing to scale" in section  # and no scaling figure
    assert not (results / "figures" / "local__digits__scaling.png").exists() and "node count (log" not in section
    assert "No run of this suite has stragglers" in section and "throughput with and without" not in section
    problems = text.split("did not converge or failed</h2>")[1].split("<h2")[0]
    assert "digits__allreduce__n1x2__s2" in problems and ERROR in problems
    assert "digits__ddp__n1x2__s3" in problems and aggregate.INCOMPLETE in problems
    assert "digits__ddp__n1x2__s0" not in problems
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert "node01, node02, node03" in text


def test_render_only_reads_the_tables_and_figures_not_the_runs(
    results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(results / "runs", tmp_path / "runs")
    report.main(["--results", str(tmp_path)])  # by hand: every step, then the report
    by_hand = (tmp_path / "report.html").read_text(encoding="utf-8")
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "tables" / "curves.csv").unlink()  # what the tables step reads, not the report
    (tmp_path / "report.html").unlink()

    def computed(*args: object) -> None:
        raise AssertionError("the report computes a table the tables step writes")

    monkeypatch.setattr(tables, "global_syncs", computed)
    monkeypatch.setattr(dana, "comparison", computed)
    report.main(["--render-only", "--results", str(tmp_path)])
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == by_hand
    with pytest.raises(SystemExit):  # a file named without --render-only would be rebuilt elsewhere
        report.main(["--results", str(tmp_path), "--runs", str(tmp_path / "tables" / "runs.csv")])


def test_run_ids_and_figure_names() -> None:
    assert naming.run_id("digits", "post_local_sgd", 2, 4, 10) == "digits__post_local_sgd__n2x4__s10"
    assert naming.parse_run_id("digits__post_local_sgd__n2x4__s10") == {
        "task": "digits",
        "algorithm": "post_local_sgd",
        "nodes": "2",
        "procs_per_node": "4",
        "seed": "10",
    }
    assert naming.parse_run_id("try1") is None  # a run started by hand into a directory of its own
    assert artefacts.figure_stem("traces", "my suite", "digits", 2, 4) == "my_suite__digits__n2x4__traces"
    assert artefacts.figure_stem("scaling", "s", "digits") == "s__digits__scaling"
    layouts = [("s", "digits", 1, 2), ("s", "digits", 2, 2)]
    assert artefacts.figure_files("stragglers", layouts, "svg") == ["s__digits__stragglers.svg"]
    assert artefacts.figure_files("performance_profile", layouts, "png") == ["performance_profile.png"]
    assert len(artefacts.figure_files("metric_vs_time", layouts, "png")) == 2


def test_every_algorithm_has_a_colour_of_its_own_ddp_first() -> None:
    names = ["wagma", "ddp", "dana_dc", *[f"algorithm_{i}" for i in range(16)]]
    colours = plotting.colours(names + ["ddp"])
    assert list(colours)[:3] == ["ddp", "algorithm_0", "algorithm_1"]
    assert len(colours) == 19 and len(set(colours.values())) == 19


def test_global_syncs_against_ddp_on_hand_made_curves(tmp_path: Path) -> None:
    import pandas as pd

    from analysis import tables

    rows = []
    for seed, syncs in ((0, [22, 7, 7]), (1, [22, 7, 9])):  # per-epoch global syncs of two DASO seeds
        for epoch, n in enumerate(syncs, start=1):
            # An epoch's count is written at its end, and written again at each evaluation of the
            # next epoch (the algorithm's metrics are its last epoch's): counted once.
            for at, count in ((epoch - 0.5, syncs[epoch - 2] if epoch > 1 else 0), (epoch, n)):
                rows.append(
                    {
                        "suite": "s",
                        "task": "t",
                        "nodes": 2,
                        "procs_per_node": 2,
                        "algorithm": "daso",
                        "run_id": f"r{seed}",
                        "epoch": at,
                        "step": round(22 * at),
                        "global_syncs": count,
                        "global_sync_bytes": 100 * count,
                    }
                )
    rows.append(
        {
            "suite": "s",
            "task": "t",
            "nodes": 2,
            "procs_per_node": 2,
            "algorithm": "ddp",
            "run_id": "d",
            "epoch": 1,
            "step": 22,
            "global_syncs": float("nan"),
            "global_sync_bytes": float("nan"),
        }
    )
    out = tables.global_syncs(pd.DataFrame(rows))
    assert list(out["algorithm"]) == ["daso"]  # DDP has no such column values
    row = out.iloc[0]
    assert row["syncs"] == 37 and row["steps"] == 66  # median of 36 and 38; 3 epochs x 22 steps
    assert abs(row["saved vs DDP"] - (1 - 37 / 66)) < 1e-12 and row["sync_bytes"] == 3700
    # The tables step writes it for the report, which reads it back by column name, as it was.
    out.to_csv(tmp_path / "global_syncs.csv", index=False)
    pd.testing.assert_frame_equal(tables.read_table(tmp_path / "global_syncs.csv"), out, check_dtype=False)
    none = tables.global_syncs(pd.DataFrame(rows).drop(columns=["global_syncs", "global_sync_bytes"]))
    assert none.empty and list(none.columns) == list(out.columns)  # no DASO run: no rows, the same columns


def test_straggler_label_names_every_setting_that_changes_the_delay() -> None:
    assert aggregate.straggler_label({}) == "none"
    assert (
        aggregate.straggler_label({"straggler": "fixed", "straggler_ranks": 2, "straggler_delay_ms": 320.0})
        == "fixed 2×320 ms"
    )
    assert aggregate.straggler_label({"straggler": "gamma_het", "straggler_delay_ms": 50}) == "gamma_het 50 ms"


def test_time_model_label_names_every_setting_of_the_virtual_clock() -> None:
    """Runs under different time models are never pooled: noise and the updaters' speedup count too."""
    assert aggregate.time_model_label({}, "wall") == aggregate.WALL_CLOCK
    plain = {"sim_network": "piz_daint", "sim_step_ms": 620.0, "sim_model_mb": 102.2}
    assert aggregate.time_model_label(plain, "simulated") == "piz_daint, 620 ms a batch, 102.2 MB"
    noisy = {**plain, "sim_step_cv": 0.01, "sim_updater_speedup": 1.35}
    assert (
        aggregate.time_model_label(noisy, "simulated")
        == "piz_daint, 620 ms a batch (CV 0.01), 102.2 MB, updaters ×1.35"
    )


def _row(algorithm: str, nodes: int, tta: float, throughput: float, **extra: object) -> dict:
    """One time-to-target table row, only the columns the derived tables read."""
    row = {
        "suite": "s",
        "task": "t",
        "nodes": nodes,
        "procs_per_node": 2,
        "straggler": "none",
        "clock": "wall",
        "time_model": "measured",
        "algorithm": algorithm,
        "n": 3,
        "k": 3 if tta == tta else 0,
        "tta_median_s": tta,
        "tta_min_s": tta,
        "tta_max_s": tta,
        "throughput_median": throughput,
        "wall_median_s": 2 * tta,
    }
    row.update(extra)
    return row


def test_scaling_speedup_and_parallel_efficiency() -> None:
    # ddp: 100 s on 1 node, 60 s on 2, 40 s on 4 (workers 2, 4, 8); throughput 10, 18, 30.
    table = pd.DataFrame(
        [
            _row("ddp", 1, 100.0, 10.0),
            _row("ddp", 2, 60.0, 18.0),
            _row("ddp", 4, 40.0, 30.0),
            _row("daso", 2, math.nan, 20.0),
            _row("daso", 4, 30.0, 36.0),
        ]
    )
    out = scaling.scaling(table).set_index(["algorithm", "nodes"])
    assert out.loc[("ddp", 2), "speedup_tta"] == pytest.approx(100 / 60)
    assert out.loc[("ddp", 4), "efficiency_tta"] == pytest.approx(2.5 / 4)
    assert out.loc[("ddp", 4), "efficiency_throughput"] == pytest.approx(3.0 / 4)
    # daso never reached the target on 2 nodes: its time reference is 4 nodes, its throughput 2.
    assert out.loc[("daso", 4), "reference_nodes"] == 4
    assert out.loc[("daso", 4), "speedup_tta"] == 1.0
    assert math.isnan(out.loc[("daso", 2), "speedup_tta"])
    assert out.loc[("daso", 4), "efficiency_throughput"] == pytest.approx(1.8 / 2)


def test_performance_profile_values() -> None:
    # Three workloads (1, 2, 4 nodes). a: 10, 30, 40 s; b: 20, 15, never; c: only on 1 node, 50 s.
    table = pd.DataFrame(
        [
            _row("a", 1, 10.0, 1.0),
            _row("a", 2, 30.0, 1.0),
            _row("a", 4, 40.0, 1.0),
            _row("b", 1, 20.0, 1.0),
            _row("b", 2, 15.0, 1.0),
            _row("b", 4, math.nan, 1.0),
            _row("c", 1, 50.0, 1.0),
        ]
    )
    ratios = profile.ratios(table)
    r = ratios.set_index(["algorithm", "nodes"])["ratio"]
    assert (r[("a", 1)], r[("a", 2)], r[("a", 4)]) == (1.0, 2.0, 1.0)
    assert (r[("b", 1)], r[("b", 2)]) == (2.0, 1.0) and math.isinf(r[("b", 4)])
    assert r[("c", 1)] == 5.0 and math.isinf(r[("c", 2)])  # not run counts as infinite
    prof = profile.profile(ratios).set_index("algorithm")
    assert prof.loc["a", "rho(1)"] == pytest.approx(2 / 3)
    assert prof.loc["a", "rho(2)"] == 1.0 and prof.loc["b", "rho(2)"] == pytest.approx(2 / 3)
    assert prof.loc["c", "rho(4)"] == 0.0 and prof.loc["a", "wins"] == 2
    # Score: area of rho over [1, 4] / 3. a: (3 + 2 + 3) / 9; b: (2 + 3 + 0) / 9; c: 0.
    assert prof.loc["a", "score"] == pytest.approx(8 / 9)
    assert prof.loc["b", "score"] == pytest.approx(5 / 9)
    assert prof.loc["c", "score"] == 0.0
    assert list(prof.index) == ["a", "b", "c"]


def test_simulated_times_are_never_divided_by_wall_clock_times() -> None:
    runs = pd.DataFrame(
        [
            {
                "suite": "s",
                "task": "t",
                "nodes": 1,
                "procs_per_node": 2,
                "straggler": "none",
                "clock": clock,
                "time_model": model,
                "algorithm": alg,
                "status": "completed",
                "time_to_target_s": tta,
                "final_metric": 0.9,
                "best_metric": 0.9,
                "throughput": 1.0,
                "comm_share": 0.1,
                "sent_mb_to_target": 3.0 * tta,
                "target_step_s": tta / 10,
                "wall_s": tta,
                "step_s": tta / 10,
                "metric": "accuracy",
                "target": 0.9,
            }
            for alg, clock, model, tta in (
                ("ddp", "wall", "measured", 10.0),
                ("dana_slim", "simulated", "m1", 2.0),
                ("ddp", "simulated", "m1", 4.0),
                ("ddp", "simulated", "m2", 1.0),  # another time model: never divides m1's times
                ("local_sgd", "wall", "measured", 5.0),
            )
        ]
    )
    table = tables.time_to_target(runs).set_index(["algorithm", "clock", "time_model"])
    assert table.loc[("dana_slim", "simulated", "m1"), "speedup_vs_ddp"] == 2.0  # 4 / 2, not 10 / 2 or 1 / 2
    assert table.loc[("local_sgd", "wall", "measured"), "speedup_vs_ddp"] == 2.0
    summary = overview.summary_table(table.reset_index())
    simulated = summary[summary["median"].str.contains("simulated") & (summary["leader"] != "ddp")]
    assert simulated["leader"].tolist() == ["dana_slim"]
    # one seed a side: the ratio alone, never a "[2.00, 2.00]" interval
    assert simulated["speed-up vs DDP"].tolist() == ["2.00× (simulated: m1)"]
    assert simulated["median"].tolist() == ["2.0 s (1 seed) (simulated: m1)"]


def test_throughput_with_and_without_stragglers() -> None:
    table = pd.DataFrame(
        [
            _row("wagma", 1, 10.0, 100.0),
            _row("wagma", 1, 12.0, 80.0, straggler="fixed 1×50 ms"),
            _row("ddp", 1, 10.0, 100.0),
            _row("ddp", 1, 20.0, 40.0, straggler="fixed 1×50 ms"),
        ]
    )
    out = stragglers.straggler_throughput(table).set_index(["algorithm", "straggler"])
    assert out.loc[("wagma", "fixed 1×50 ms"), "retained"] == pytest.approx(0.8)
    assert out.loc[("ddp", "fixed 1×50 ms"), "retained"] == pytest.approx(0.4)
    assert out.loc[("ddp", "none"), "retained"] == 1.0
    shown = stragglers.display(stragglers.straggler_throughput(table))
    assert shown["retained"].tolist() == ["40%", "80%"]


def test_a_suites_straggler_table_and_chart_hold_only_its_own_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the claims matrices: dana-16 ran with gamma times only, dana-het with gamma_het only, and
    # base, on the same task and layout, without stragglers. No suite compares with another's runs.
    table = pd.DataFrame(
        [
            _row("dana_dc", 1, 10.0, 40.0, straggler="gamma", suite="dana-16"),
            _row("dana_dc", 1, 10.0, 70.0, straggler="gamma_het", suite="dana-het"),
            _row("dana_dc", 1, 10.0, 100.0, suite="base"),
            _row("ddp", 1, 10.0, 100.0, suite="mixed"),
            _row("ddp", 1, 20.0, 50.0, straggler="fixed 1×50 ms", suite="mixed"),
        ]
    )
    pooled = stragglers.straggler_throughput(table)
    own = pooled[pooled["suite"] == "dana-16"]
    assert own["straggler"].tolist() == ["gamma"] and own["throughput_none"].isna().all()
    assert stragglers.display(own).empty  # gamma is not set beside another suite's runs, nor beside gamma_het
    assert "Every run of this suite has stragglers (gamma)" in stragglers.nothing_to_compare(own["straggler"])
    mixed = stragglers.display(pooled[pooled["suite"] == "mixed"])
    assert mixed["retained"].tolist() == ["50%"]

    drawn = _drawn(monkeypatch)
    stragglers.plot_stragglers(pooled, tmp_path)
    bars = drawn["dana-16__t__stragglers"].axes
    assert all(ax.get_legend() is None for ax in bars)  # a sentence, no bars: nothing to compare
    (ax,) = drawn["mixed__t__stragglers"].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["stragglers: none", "stragglers: fixed 1×50 ms"]


def test_traces_find_every_extra_numeric_column(results: Path) -> None:
    curves = aggregate.load_curves(results)
    curves["phase"] = "warmup"  # a text column: no trace
    curves["sim_compute_s"] = curves["wall_s"] / 2  # the simulator's counter: the clock's, no algorithm's
    assert traces.trace_columns(curves) == [("allreduce", "bucket_mb")]
    # a value at one epoch only is a point, not a trace
    assert traces.trace_columns(curves[curves["epoch"] == 1]) == []
    band = traces.epoch_band(curves[curves["algorithm"] == "allreduce"], "bucket_mb")
    assert band["epoch"].tolist() == [1, 2] and band["median"].tolist() == [25.0, 25.0]


def test_paper_numbers_compare_only_under_their_conditions(tmp_path: Path) -> None:
    (tmp_path / "papers.yaml").write_text(
        "p:\n  title: T\n  authors: A\n  venue: V\n  url: ''\n  data: p.csv\n  hardware: H\n"
        "  software: S\n  scale: X\n  measure: M\n  differences: D\n"
    )
    header = (
        "source,from_plot,workload,task,workers,straggler,setting,paper_algorithm,algorithm,"
        "paper_baseline,baseline,quantity,value,spread,unit,note\n"
    )
    (tmp_path / "p.csv").write_text(
        header
        + "\n".join(
            [
                "Table 1,false,W,t,4,none,s,A,a,B,ddp,speedup,1.5,,x,",  # run at 2x2: same
                "Table 1,false,W,t,4,none,s,A,a,,,final_metric,80,,%,",  # same workload
                "Fig. 2,true,W,u,4,none,s,A,a,B,ddp,time_reduction,25,,%,",  # substituted
                "Fig. 2,true,W,u,4,none,s,A,a,,,final_metric,70,,%,",  # not comparable
                "Text,false,W,t,4,none,s,A,,B,ddp,speedup,2,,x,",  # not in the suite
                "Text,false,W,t,4,none,s,A,a,,,time,3,,h,",  # absolute time
                "Fig. 3,false,W,u,64,none,s,A,a,B,ddp,speedup,1.3,,x,",  # 64 workers: none ran
                "Fig. 3,false,W,t,4,fixed,s,A,a,B,ddp,speedup,1.3,,x,",  # stragglers: none ran
            ]
        )
        + "\n"
    )
    [paper] = papers.load_papers(tmp_path)
    table = pd.DataFrame(
        [_row("a", 2, 10.0, 1.0, final_metric_median=0.85), _row("ddp", 2, 15.0, 1.0, final_metric_median=0.84)]
    )
    table["wall_median_s"] = [30.0, 60.0]
    out = papers.compare(paper, table)
    assert out.loc[0, "suite_value"] == 2.0 and out.loc[0, "comparison"] == "same workload"
    assert out.loc[0, "deviation"] == pytest.approx(2.0 / 1.5 - 1)
    assert out.loc[1, "suite_value"] == pytest.approx(85.0)
    assert out.loc[1, "deviation"] == pytest.approx(5.0)
    assert out.loc[2, "suite_value"] == pytest.approx(50.0)
    assert out.loc[2, "comparison"] == "substituted workload" and out.loc[2, "deviation"] == 25.0
    assert math.isnan(out.loc[3, "suite_value"]) and out.loc[3, "comparison"].startswith("not comparable")
    assert out.loc[4, "comparison"] == "not in the suite"
    assert out.loc[5, "comparison"].startswith("absolute")
    for row in (6, 7):  # never a deviation from runs under other conditions
        assert out.loc[row, "comparison"] == "not measured under its conditions"
        assert math.isnan(out.loc[row, "suite_value"]) and math.isnan(out.loc[row, "deviation"])
    shown = papers.display(out)
    assert shown.loc[2, "source"] == "Fig. 2 (read from plot)" and shown.loc[1, "deviation"] == "+5.0 pp"


def test_shipped_paper_numbers_have_their_source() -> None:
    loaded = papers.load_papers()
    assert {p.key for p in loaded} == {"daso", "wagma", "dana", "lpp_sgd"}
    for paper in loaded:
        numbers = paper.numbers
        assert len(numbers) > 10 and numbers["source"].str.len().min() > 0
        assert set(numbers["from_plot"].astype(str).str.lower()) <= {"true", "false"}
        assert numbers["value"].notna().all()
        assert set(numbers["quantity"]) <= {
            "final_metric",
            "time",
            "speedup",
            "time_reduction",
            "throughput_speedup",
            "throughput",
        }
    root = Path(__file__).resolve().parents[2]
    for key, meta in papers.load_meta().items():  # the "Matrix" line names config files that exist
        named = [m.strip() for m in meta["matrix"].split(",")]
        assert named and all((root / m).is_file() for m in named), key
    wagma = next(p for p in loaded if p.key == "wagma").numbers
    row = wagma[(wagma["baseline"] == "allreduce") & (wagma["quantity"] == "speedup")]
    assert row["value"].tolist() == [1.63] and row["source"].str.startswith("Fig. 5").all()


def test_calibration_errors_are_medians_over_the_seeds_that_reached_the_target(tmp_path: Path) -> None:
    rows = pd.DataFrame(
        {
            "algorithm": ["ddp", "ddp", "ddp", "wagma", "wagma", "sgp"],
            "seed": [0, 1, 2, 0, 1, 0],
            "measured_s": [1.0, 2.0, 4.0, 2.0, None, None],
            "predicted_s": [1.2, 2.2, 3.0, 1.0, 1.5, 1.0],
        }
    )
    out = overview.calibration_summary(rows).set_index("algorithm")
    # ddp: medians 2.0 measured, 2.2 predicted: +10 %; wagma: its one complete seed, 1.0 / 2.0 - 1
    assert out.loc["ddp", "measured_s"] == 2.0 and out.loc["ddp", "predicted_s"] == pytest.approx(2.2)
    assert out.loc["ddp", "error"] == pytest.approx(0.1) and out.loc["ddp", "seeds"] == 3
    assert out.loc["wagma", "error"] == pytest.approx(-0.5) and out.loc["wagma", "seeds"] == 1
    assert math.isnan(out.loc["sgp", "error"])  # no seed reached the target on both clocks
    rows.to_csv(tmp_path / "calibration.csv", index=False)
    shown = report.calibration_section(tmp_path / "calibration.csv")
    assert shown["figure"] is None and shown["table"]["rows"][0] == ["ddp", "2.00", "2.20", "+10%", "3"]
    assert (
        shown["table"]["rows"][2] == ["sgp", "", "", "", "0"]
        and report.calibration_section(tmp_path / "absent.csv") is None
    )


def test_the_summary_names_the_algorithms_tied_with_the_fastest() -> None:
    """B's 95 % interval of the median time overlaps the fastest A's: tied; C's does not."""
    rows = [("a", 1.1, 1.0, 1.2), ("b", 1.3, 1.15, 1.5), ("c", 2.2, 2.0, 2.5)]
    table = pd.DataFrame(
        [
            {"suite": "s", "task": "t", "nodes": 2, "procs_per_node": 2, "straggler": "none", "clock": "wall", "time_model": "measured",
             "algorithm": name, "n": 3, "k": 3, "k/n": "3/3", "tta_median_s": m, "tta_low_s": lo, "tta_high_s": hi,
             "speedup_vs_ddp": math.nan, "speedup_low": math.nan, "speedup_high": math.nan}
            for name, m, lo, hi in rows
        ]
    )  # fmt: skip
    (summary,) = overview.summary_table(table).to_dict("records")
    assert summary["leader"] == "a" and summary["tied with it"] == "b"
    assert summary["median"] == "1.1 s [1.0, 1.2]" and summary["measure"] == "time to target"


def _measured(suite: str, algorithm: str, step: float, final: float, k: int = 0, tta: float = math.nan) -> dict:
    """One time-to-target row of a simulated suite at 64×1: its seconds a step and final metric, each
    with a 95 % interval of ±5 %, and its time to target where ``k`` seeds reached it."""
    return {
        **_row(algorithm, 64, tta, 1.0, suite=suite, procs_per_node=1, clock="simulated", time_model="m"),
        "n": 5, "k": k, "k/n": f"{k}/5", "tta_low_s": tta, "tta_high_s": tta,
        "speedup_vs_ddp": math.nan, "speedup_low": math.nan, "speedup_high": math.nan,
        "step_median_s": step, "step_low_s": step * 0.95, "step_high_s": step * 1.05,
        "final_metric_median": final, "final_metric_low": final * 0.95, "final_metric_high": final * 1.05,
    }  # fmt: skip


def test_a_suite_is_measured_by_what_its_claims_read_of_it() -> None:
    """A suite whose runs the claims compare by seconds a step (wagma-claims-64: one epoch, never meant
    to reach the target) is measured by them, and ranked by them in the summary, where a suite no
    claim reads keeps its time to target and says when none reached it."""
    verdicts = pd.DataFrame(
        [
            {"quantity": "throughput_speedup", "suite": "wagma-claims-64"},
            {"quantity": "throughput_speedup", "suite": "wagma-claims-64, wagma-claims"},
            {"quantity": "speedup", "suite": "wagma-claims-64"},
            {"quantity": "final_metric_above", "suite": "dana-claims-16"},
            {"quantity": "speedup", "suite": ""},  # not measured: no suite
        ]
    )
    measures = leaders.suite_measures(verdicts)
    assert measures == {
        "wagma-claims-64": "seconds a step",  # 2 claims read it, 1 the total time
        "wagma-claims": "seconds a step",
        "dana-claims-16": "final metric",
    }
    table = pd.DataFrame(
        [
            _measured("other", "wagma", 0.8, 0.1),
            _measured("wagma-claims-64", "allreduce", 1.28, 0.1),
            _measured("wagma-claims-64", "wagma", 0.8, 0.1),
            _measured("dana-claims-16", "nag_asgd", 1.0, 0.2),
            _measured("dana-claims-16", "dana_dc", 1.0, 0.9, k=2, tta=7.0),
        ]
    )
    summary = overview.summary_table(table, measures).set_index("suite")
    assert summary.loc["other", "median"] == "none reached the target" and summary.loc["other", "leader"] == ""
    wagma = summary.loc["wagma-claims-64"]
    assert (wagma["measure"], wagma["leader"]) == ("seconds a step", "wagma")
    assert wagma["median"] == "0.8 s a step [0.76, 0.84] (simulated: m)" and wagma["converged (k/n)"] == "—"
    dana_row = summary.loc["dana-claims-16"]  # its claims read the final metric, though one seed converged
    assert (dana_row["measure"], dana_row["leader"], dana_row["median"]) == (
        "final metric",
        "dana_dc",
        "0.900 [0.855, 0.945] (simulated: m)",
    )


def test_the_first_figure_shows_each_suite_by_its_measure_in_explained_colours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bars of seconds a step over the fastest's for WAGMA's suite (its speed-ups: 1.60× over
    allreduce), of the final metric for DANA's, of the time to target for the rest; no "no target";
    a legend for the colours, the leader's never red."""
    table = pd.DataFrame(
        [
            {**_measured("embedded", "ddp", 1.0, 0.9, k=3, tta=12.0), "tta_low_s": 11.0, "tta_high_s": 13.0},
            {**_measured("embedded", "daso", 1.0, 0.9, k=3, tta=6.0), "tta_low_s": 5.0, "tta_high_s": 7.0},
            _measured("wagma-claims-64", "allreduce", 1.28, 0.1),
            _measured("wagma-claims-64", "wagma", 0.8, 0.1),
            _measured("wagma-claims-64", "local_sgd", 0.82, 0.1),
            _measured("dana-claims-16", "nag_asgd", 1.0, 0.2),
            _measured("dana-claims-16", "dana_dc", 1.0, 0.9),
        ]
    )
    measures = {"wagma-claims-64": "seconds a step", "dana-claims-16": "final metric"}
    drawn = _drawn(monkeypatch)
    leaders.plot_first_to_target(table, tmp_path, measures)
    fig = drawn["first_to_target"]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "1.60×" in texts and "0.8 s (simulated)" in texts  # WAGMA leads, 1.28 / 0.8 over allreduce
    assert "2.00×" in texts and "0.9" in texts and "0.2" in texts  # ddp 12 s over daso's 6; DANA's metrics
    assert not any("target" in t and "none" in t or "no target" in t for t in texts)
    assert [ax.get_xlabel().split(" (line")[0] for ax in fig.axes] == [
        leaders.MEASURES[m].axis for m in ("time to target", "seconds a step", "final metric")
    ]
    ticks = [[t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes]
    assert ticks == [["daso", "ddp"], ["wagma", "local_sgd", "allreduce"], ["dana_dc", "nag_asgd"]]
    colours = [[matplotlib.colors.to_hex(bar.get_facecolor()) for bar in ax.patches] for ax in fig.axes]
    # wagma leads; local_sgd's interval (0.78-0.86) overlaps its (0.76-0.84): tied; allreduce's does not
    assert colours[1] == [leaders.LEADER, leaders.TIED, leaders.OTHER]
    assert all(c[0] == leaders.LEADER for c in colours)
    red = [
        c for row in colours for c in row if matplotlib.colors.to_rgb(c)[0] > 0.6 > max(matplotlib.colors.to_rgb(c)[1:])
    ]
    assert red == []
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "the leader",
        "tied with it (95 % intervals overlap)",
        "the others",
    ]
    plotting.plt.close("all")


def test_completed_runs_of_a_suite_without_a_target_did_not_fail_to_converge(results: Path) -> None:
    """DDP's seed 3 completed without the target: a problem where the suite is measured by its time to
    target, what it was run for where the claims read its seconds a step. Failed and unfinished runs
    are listed either way."""
    runs = aggregate.load_runs(results)
    listed = overview.problem_runs(runs)["run_id"].tolist()
    assert listed == ["digits__allreduce__n1x2__s2", "digits__allreduce__n1x2__s3", "digits__ddp__n1x2__s3"]
    measured = {"local": "seconds a step"}
    assert overview.problem_runs(runs, measured)["run_id"].tolist() == listed[:2]
    assert overview.by_design(runs, measured) == (
        "Not listed: 1 completed run of suites without a target, which their claims read for something "
        "else (local: 1, measured by its seconds a step)."
    )
    assert overview.by_design(runs, {}) == ""


def test_a_suites_table_is_sorted_by_its_measure_without_repeats(table: pd.DataFrame) -> None:
    """allreduce reaches the target first (7 s against 12), DDP ends higher (0.95 against 0.91): the
    table's order follows the suite's measure, not the alphabet. Every run's best metric is its final
    one: that column goes, said once. A suite without a target whose runs never reached one loses the
    time-to-target columns and gets its measure's with the interval."""
    rows = table.reset_index()
    by_time, note = overview.suite_table(rows, "time to target")
    assert by_time["algorithm"].tolist() == ["allreduce", "ddp"]
    assert "best metric" not in by_time and note == "The best metric equals the final one in every row."
    by_metric, _ = overview.suite_table(rows, "final metric")
    assert by_metric["algorithm"].tolist() == ["ddp", "allreduce"]
    assert list(by_metric.columns[2:4]) == ["algorithm", "final metric"] and "converged (k/n)" in by_metric
    assert by_metric["final metric"].iloc[0] == "0.950 [0.800, 0.950]"  # 0.95 in 3 seeds of 4, 0.8 in one
    never = rows.assign(k=0, tta_median_s=math.nan)
    steps, note = overview.suite_table(never, "seconds a step")
    assert "seconds a step" in steps and not set(overview.TARGET_COLUMNS) & set(steps.columns)
    assert note.endswith("No run reached a target: the time-to-target columns are left out.")


def test_one_seed_has_a_median_and_no_interval() -> None:
    """One converged seed at 2 s is "2.00 (1 seed)", never a 95 % interval [2.00, 2.00]."""
    assert tables.median_text(2.0, 2.0, 2.0, 1, ".2f") == "2.00 (1 seed)"
    assert tables.median_text(2.0, 2.0, 2.0, 5, ".2f") == "2.00 (5 seeds, all equal)"
    assert tables.median_text(2.0, 1.5, 2.5, 3, ".1f", "s") == "2.0 s [1.5, 2.5]"
    one = pd.DataFrame([_row("a", 1, 2.0, 1.0)]).assign(
        k=1, tta_low_s=2.0, tta_high_s=2.0, mb_median=6.0, mb_low=6.0, mb_high=6.0, step_share_max=0.25,
        speedup_vs_ddp=1.5, speedup_low=1.5, speedup_high=1.5, final_metric_median=0.9, best_metric_median=0.9,
        comm_share_median=0.1, failed=0, diverged=0, timeout=0, incomplete=0, **{"k/n": "1/3"},
    )  # fmt: skip
    shown = tables.display_table(one).iloc[0]
    assert shown["median time to target (s)"] == "2.00 (1 seed)" and shown["speed-up vs DDP"] == "1.50×"
    assert shown[tables.STEP_AT_TARGET] == "25%"  # a share of the time to target, and its name says so


def test_what_the_curves_let_the_figures_draw(results: Path) -> None:
    """DDP's finished runs have 3 evaluations, allreduce's at most 2 (seed 2 failed after 1); only
    allreduce logs a column of its own (bucket_mb). A one-evaluation group has points and no curve."""
    drawn = tables.drawn(aggregate.load_curves(results)).set_index("algorithm")
    assert drawn.loc["ddp", "evaluations"] == 3 and drawn.loc["allreduce", "evaluations"] == 2
    assert (drawn.loc["ddp", "traced"], drawn.loc["allreduce", "traced"]) == (0, 1)


def test_no_profile_over_one_workload_or_workloads_nothing_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload where no algorithm reached the target is left out (it would draw every line flat at
    0), and one workload is no profile: a sentence, where 21 step lines would overlap."""
    table = pd.DataFrame(
        [_row("a", 1, 10.0, 1.0), _row("b", 1, 20.0, 1.0), _row("a", 2, math.nan, 1.0), _row("b", 2, math.nan, 1.0)]
    )
    ratios = profile.ratios(table)
    assert set(ratios["nodes"]) == {1} and profile.workloads(ratios) == {"wall": 1}
    assert profile.nothing_to_profile(profile.workloads(ratios)).startswith(
        "No performance profile: it needs 2 workloads or more on one clock where an algorithm reached the target "
        "(here: 1 on the wall clock)."
    )
    drawn = _drawn(monkeypatch)
    profile.plot_profile(ratios, tmp_path)
    (ax,) = drawn["performance_profile"].axes
    assert len(ax.lines) == 0 and "No performance profile" in ax.texts[0].get_text()
    assert profile.nothing_to_profile({"wall": 2, "simulated": 1}) == ""
    plotting.plt.close("all")


def test_many_lines_keep_the_best_few_in_colour(results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve algorithms in one axes: the six fastest to target keep their colours and a legend entry
    each, the other six are thin grey lines under one entry."""
    runs = aggregate.load_runs(results)
    runs = runs[(runs["algorithm"] == "ddp") & (runs["seed"] == 0)]
    many = pd.concat([runs.assign(algorithm=f"alg{i:02d}", time_to_target_s=10.0 + i) for i in range(12)])
    curves = aggregate.load_curves(results, runs)
    curves = pd.concat([curves.assign(algorithm=f"alg{i:02d}") for i in range(12)])
    drawn = _drawn(monkeypatch)
    figures.plot_metric_vs_time(many, curves, tmp_path)
    (ax,) = drawn["local__digits__n1x2__metric_vs_time"].axes[:1]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [f"alg{i:02d} (1/1)" for i in range(6)] + ["the other 6, in grey", "target 0.9"]
    grey = [line for line in ax.lines if matplotlib.colors.to_hex(line.get_color()) == plotting.OTHERS]
    assert len(grey) == 6 and "(the best 6 of 12 in colour)" in ax.get_title()
    plotting.plt.close("all")


def test_the_report_says_how_long_the_workflow_took(tmp_path: Path) -> None:
    started = tmp_path / "started.txt"
    started.write_text("1000.0\n")  # seconds since the epoch, as the Snakefile's onstart writes
    assert overview.workflow_minutes(started, now=1000.0 + 519.0) == pytest.approx(8.65)
    assert overview.workflow_minutes(tmp_path / "absent.txt") is None  # rendered by hand: nothing said
    (tmp_path / "finished.txt").write_text("1231.0\n")  # the invocation ended (onsuccess)
    assert overview.workflow_minutes(started, now=1000.0 + 3200.0) == pytest.approx(3.85)  # a later rebuild by hand
    started.write_text("2000.0\n")  # the next invocation, rendering before it ends
    assert overview.workflow_minutes(started, now=2000.0 + 60.0) == pytest.approx(1.0)


def test_the_validation_is_shown_and_each_simulated_claim_cites_its_networks_error(tmp_path: Path) -> None:
    """validation.csv (python -m tools.validate): per network the geomean |error| of its test rows
    only, and a simulated claim's detail names the error of the network it ran on."""
    path = tmp_path / "validation.csv"
    pd.DataFrame(
        [
            dict(
                case="a", source="s", network="piz_daint", measured=1.0, predicted=1.1, relative_error=0.1, role="test"
            ),
            dict(
                case="b", source="s", network="piz_daint", measured=1.0, predicted=0.9, relative_error=-0.4, role="test"
            ),
            dict(
                case="c", source="s", network="piz_daint", measured=1.0, predicted=3.0, relative_error=2.0, role="fit"
            ),
        ]
    ).to_csv(path, index=False)
    errors = overview.validation_errors(pd.read_csv(path))
    assert errors["piz_daint"][0] == pytest.approx(0.2) and errors["piz_daint"][1] == 2  # sqrt(0.1 * 0.4); fit unscored
    assert report.validation_section(path)["summary"] == "piz_daint 20.0% over 2 test rows"
    assert report.validation_section(tmp_path / "absent.csv") is None
    verdicts = claims.table(pd.DataFrame(), claims.load())
    verdicts["sim_network"] = verdicts["sim_network"].fillna("")
    key = "the model's error out of sample"
    lines = {line["claim"]: dict(line["details"]) for line in report.claim_lines(verdicts, errors)}
    wagma = next(d for c, d in lines.items() if "Allreduce" in c)
    assert wagma[key] == "piz_daint's times: 20.0% geomean |error| over 2 test rows"
    daso = next(d for c, d in lines.items() if "Horovod" in c and "here 16 and 64" in c)  # the simulated one
    assert "juwels_booster_heat: no test rows" in daso[key]
    # With the ratio table: the claim's own pair first (test rows only), else that its pair has none.
    ratios = pd.DataFrame(
        [
            dict(
                ratio="f4",
                network="piz_daint",
                algorithm="wagma",
                baseline="allreduce",
                role="test",
                relative_error=0.12,
            ),
            dict(
                ratio="f5", network="piz_daint", algorithm="wagma", baseline="allreduce", role="fit", relative_error=0.5
            ),
            dict(ratio="d", network="piz_daint", algorithm="wagma", baseline="dpsgd", role="fit", relative_error=0.02),
        ]
    )
    lines = {line["claim"]: dict(line["details"]) for line in report.claim_lines(verdicts, errors, ratios)}
    wagma = next(d for c, d in lines.items() if "Allreduce" in c)
    assert wagma[key].startswith("wagma over allreduce on piz_daint: +12.0% (f4); piz_daint's times: 20.0%")
    dpsgd = next(d for c, d in lines.items() if "1.23x the steps per second of D-PSGD" in c)
    assert "no test ratio on piz_daint (fit only: d)" in dpsgd[key]
    unvalidated = {line["claim"]: dict(line["details"]) for line in report.claim_lines(verdicts, {})}
    wagma = next(d for c, d in unvalidated.items() if "Allreduce" in c)  # before any validation has run
    assert wagma[key].startswith("piz_daint: not validated here yet")
