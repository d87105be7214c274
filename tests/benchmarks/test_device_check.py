"""The GPU check (``python -m benchmarks.device_check``) runs in CI on the strict CPU stand-in.

The check is written for the rare minutes a GPU is lent; a regression in it, or in a GPU path it
runs, must show before then. Under ``--strict-stand-in`` every line runs on the strict device of
``tests/strict_device.py`` but pinned memory, which only CUDA has. The virtual-cluster lines run
for three algorithms, one of each way the virtual cluster runs ranks: DDP (its all-reduce in
autograd's backward), LAP-SGD (updater threads) and DANA-DC (the parameter server's arrival
order). All 21 algorithms' lines take 8 minutes on 2 busy cores, the 3 here about 1.5-3 minutes
(``tests/benchmarks/test_strict_device.py`` runs every algorithm for real on the stand-in).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import device_check

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = ["ddp", "lap_sgd", "dana_dc"]
SKIPPED_ON_THE_STAND_IN = {"loader: pinned memory"}


def test_every_line_passes_on_the_strict_stand_in(tmp_path):
    out = tmp_path / "device_check.json"
    command = [sys.executable, "-m", "benchmarks.device_check", "--strict-stand-in", "--out", str(out)]
    done = subprocess.run(
        [*command, "--algorithms", *ALGORITHMS], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "strict" and report["stand_in"] is True
    lines = {line["check"]: line for line in report["lines"]}
    virtual = {f"virtual {name} {n}x{g}" for name in ALGORITHMS for n, g in device_check.LAYOUTS}
    assert virtual < set(lines) and len(lines) == len(virtual) + 8, sorted(lines)
    for check, line in lines.items():
        expected = "skip" if check in SKIPPED_ON_THE_STAND_IN else "pass"
        assert line["result"] == expected and line["detail"], line
        assert 0 < line["seconds"] <= line["budget_s"] or expected == "skip", line
    # the deterministic one equals the CPU to the bit, the others train as they do there
    assert "loss to 0.0e+00" in lines["virtual ddp 2x2"]["detail"]
    assert "trained as on the CPU" in lines["virtual dana_dc 8x1"]["detail"]
    assert "equal to the uninterrupted run" in lines["real ddp 1x1: SIGTERM mid-epoch, resume"]["detail"]
    assert "passed, 0 failed, 1 skipped" in done.stdout  # the table


def test_without_an_accelerator_it_says_so_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_check.main(["--out", str(tmp_path / "dc.json")]) == 0
    assert "no accelerator here" in capsys.readouterr().out
    assert json.loads((tmp_path / "dc.json").read_text())["lines"] == []


def test_a_failing_line_is_reported_and_the_others_still_run(tmp_path):
    def fails(ctx, line):
        raise RuntimeError("broken")

    def skips(ctx, line):
        raise device_check.Skipped("not here")

    lines = [
        device_check.Line("a", "loader", fails, 60),
        device_check.Line("b", "loader", skips, 60),
        device_check.Line("c", "loader", lambda ctx, line: "fine", 60),
    ]
    ctx = device_check.Context("strict", True, [], tmp_path, 1, deadline=float("inf"))
    for line in lines:
        device_check.run_line(ctx, line, lambda line: None)
    assert [(line.result, line.detail) for line in lines] == [
        ("fail", "RuntimeError: broken"),
        ("skip", "not here"),
        ("pass", "fine"),
    ]
    assert "1 passed, 1 failed, 1 skipped" in device_check.table("header", lines, 1.0)
