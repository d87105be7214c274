"""A run's wandb record is made from its files once it has ended: which runs get one, and what it holds."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import wandb_records


def make_run(path: Path, status: str = "completed", wandb: bool = True) -> Path:
    """A run directory as the runner leaves it, written by hand (no training needed)."""
    path.mkdir(parents=True)
    settings = dict(wandb=wandb, wandb_mode="offline", wandb_project="dp-bench-test", suite="unit")
    config = dict(run_id="digits__sgp__n2x2__s0", algorithm="sgp", task="digits", nodes=2, procs_per_node=2)
    (path / "config.json").write_text(json.dumps({**config, "settings": settings}))
    (path / "metrics.csv").write_text(
        "epoch,step,samples,wall_s,train_loss,val_loss,val_metric,lr,comm_s,ps_weight\n"
        "1,22,1408,0.41,2.0106,1.2,0.5989,0.05,,0.25\n"
        "2,44,2816,0.83,0.5982,0.4,0.9526,0.05,,0.25\n"
    )
    (path / "summary.json").write_text(json.dumps(dict(status=status, wall_s=0.83, time_to_target_s=0.83)))
    (path / "env.json").write_text(json.dumps({"versions": {"torch": "9.9.9-test"}, "host": "node-test-1"}))
    return path


def the_record(run: Path) -> bytes:
    (log,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    return log.read_bytes()


def test_a_row_goes_to_wandb_under_its_keys_with_empty_cells_left_out():
    row = {"epoch": "2", "step": "44", "val_metric": "0.9526", "comm_s": "", "ps_weight": "0.25", "phase": "warmup"}
    assert wandb_records.wandb_row(row) == (44, {"epoch": 2, "val/metric": 0.9526, "algo/ps_weight": 0.25})


def test_a_finished_run_gets_one_offline_record_with_its_rows(tmp_path):
    run = make_run(tmp_path / "run")
    assert wandb_records.write([run])[0] == [run]
    record = the_record(run)
    for text in (
        b"digits__sgp__n2x2__s0",
        b"val/metric",
        b"algo/ps_weight",
        b"time_to_target_s",
        b"0.9526",
        b"9.9.9-test",
    ):
        assert text in record, text
    # The run's own software and machine (env.json), not the recording host's package list
    assert b"node-test-1" in record and b"requirements.txt" not in record
    # Made once: the same summary again writes nothing.
    assert wandb_records.write([run]) == ([], {})
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1


def test_a_run_done_again_gets_its_record_remade(tmp_path):
    run = make_run(tmp_path / "run")
    assert wandb_records.write([run])[0] == [run]
    (run / "summary.json").write_text(json.dumps(dict(status="failed", error="rank 1 ended with exit code 1")))
    assert wandb_records.write([run])[0] == [run]
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert b"rank 1 ended with exit code 1" in the_record(run)


def test_no_record_for_a_run_that_resumes_or_turned_wandb_off(tmp_path):
    stopped = make_run(tmp_path / "stopped", status="timeout")
    off = make_run(tmp_path / "off", wandb=False)
    assert wandb_records.write([stopped, off, tmp_path / "never_started"]) == ([], {})
    assert not (stopped / "wandb").exists() and not (off / "wandb").exists()


def test_one_runs_trouble_leaves_the_others_records(tmp_path):
    broken, good = make_run(tmp_path / "broken"), make_run(tmp_path / "good")
    (broken / "metrics.csv").write_text("epoch,step,val_metric\n1,not-a-step,0.5\n")
    written, failed = wandb_records.write([broken, good])
    assert written == [good] and list(failed) == [broken] and "ValueError" in failed[broken]
    assert not (broken / "wandb" / wandb_records.DONE).exists()


def test_the_command_writes_the_records_of_a_runs_file(tmp_path, capsys):
    runs = [make_run(tmp_path / f"r{i}") for i in range(2)]
    listing = tmp_path / "runs.txt"
    listing.write_text("".join(f"{run / 'summary.json'}\n" for run in runs))
    done = tmp_path / "done.txt"
    assert wandb_records.main(["--runs-file", str(listing), "--done", str(done)]) == 0
    assert "2 written" in capsys.readouterr().out and done.is_file()
    assert all(list((run / "wandb").glob("offline-run-*")) for run in runs)
