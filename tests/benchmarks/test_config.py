"""Configuration resolution, schedules and the run directory's helpers, on hand-checkable values."""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import algorithms
from algorithms.topology import Topology
from benchmarks import config, matrix, rundir
from benchmarks.schedule import LRSchedule, make_optimizer


def test_set_reaches_task_algorithm_and_run_settings_with_types():
    cfg = config.resolve(
        "ddp",
        "digits",
        2,
        2,
        3,
        Path("x"),
        [
            "lr=2e-1",
            "epochs=3",
            "weight_decay=5e-4",
            "milestones=[1,2]",
            "nesterov=true",
            "bucket_cap_mb=4",
            "wandb=false",
            "data_root=/some/where",
            "suite=my-suite",
        ],
    )
    assert (
        cfg.hparams["lr"] == 0.2
        and cfg.hparams["weight_decay"] == 5e-4
        and cfg.hparams["epochs"] == 3
        and cfg.hparams["milestones"] == [1, 2]
    )
    assert cfg.hparams["nesterov"] is True
    assert cfg.algorithm_params["bucket_cap_mb"] == 4.0 and isinstance(cfg.algorithm_params["bucket_cap_mb"], float)
    assert cfg.settings.wandb is False and cfg.settings.data_root == "/some/where"
    assert cfg.run_id == "digits__ddp__n2x2__s3" and cfg.world_size == 4


@pytest.mark.parametrize(
    "item, message",
    [
        ("lr=fast", "``lr`` must be float"),
        ("epochs=1.5", "``epochs`` must be int"),
        ("nesterov=1", "``nesterov`` must be bool"),
        ("milestones=[a]", "``milestones`` must be list[int]"),
        ("schedule=linear", "must be one of constant, cosine, step, plateau"),
        ("lr", "expected key=value"),
        ("epoch=3", "did you mean 'epochs'?"),
    ],
)
def test_bad_overrides_name_the_fix(item, message):
    with pytest.raises(config.ConfigError) as error:
        config.resolve("ddp", "digits", 1, 2, 0, Path("x"), [item])
    assert message in str(error.value)


def test_yaml_value_round_trips_through_set():
    for value in (0.1, 3, True, "cosine", [80, 120], None):
        text = matrix.yaml_value(value)
        assert config.coerce("k", text, type(value) if value is not None else str | None) == value


def test_check_matrix_rejects_a_key_no_run_knows():
    matrix.check_matrix(["ddp", "allreduce"], ["digits"], [1, 2], 2, ["bucket_cap_mb=10", "lr=0.1"])
    with pytest.raises(config.ConfigError, match="unknown key"):
        matrix.check_matrix(["ddp"], ["digits"], [1], 2, ["no_such_knob=1"])


def test_a_setting_the_runs_clock_ignores_is_refused_naming_the_clock_it_needs(tmp_path):
    """``sim_*`` on a wall-clock run, ``collective_timeout_s`` on a simulated one: each would do nothing."""
    with pytest.raises(config.ConfigError) as error:
        config.resolve("ddp", "digits", 1, 2, 0, tmp_path, ["sim_network=juwels_booster", "sim_step_ms=5"])
    assert str(error.value) == (
        "--set sim_network, sim_step_ms: applies only to clock=simulated, and this run's clock is wall (the "
        "default), which ignores them; add --set clock=simulated, or leave sim_network, sim_step_ms out"
    )
    with pytest.raises(config.ConfigError, match=r"collective_timeout_s: applies only to clock=wall.*simulated"):
        config.resolve("ddp", "digits", 1, 2, 0, tmp_path, ["clock=simulated", "collective_timeout_s=60"])
    for clock, key in (("simulated", "sim_network=piz_daint"), ("wall", "collective_timeout_s=60")):
        config.resolve("ddp", "digits", 1, 2, 0, tmp_path, [f"clock={clock}", key])
    assert config.ignored_settings("wall") == {k for k in config.SETTINGS if k.startswith("sim_")}
    assert config.ignored_settings("simulated") == {"collective_timeout_s", "link_mbit", "link_queue_ms"}


def _two_clocks(top: dict[str, object], wall: dict[str, object], simulated: dict[str, object]) -> dict[str, object]:
    """A workflow config of a wall-clock matrix and a simulated one, ``top`` the top-level ``set``."""
    common = {"algorithms": ["allreduce"], "tasks": ["digits"], "nodes": [1], "procs_per_node": 2, "seeds": [0]}
    return {
        "suite": "t",
        **common,
        "set": top,
        "matrices": [{"suite": "t-wall", "set": wall}, {"suite": "t-sim", "set": {"clock": "simulated", **simulated}}],
    }


def _check(m: dict[str, object]) -> None:
    matrix.check_matrix(m["algorithms"], m["tasks"], m["nodes"], m["procs_per_node"], m["overrides"])


def test_a_matrix_wide_default_that_a_matrixs_clock_ignores_is_left_out_of_its_runs():
    """The top-level ``set`` is every matrix's default: each matrix's runs get the keys their clock reads."""
    top = {"sim_network": "piz_daint", "collective_timeout_s": 120.0, "epochs": 3}
    wall, sim = matrix.matrices(_two_clocks(top, {}, {}))
    assert set(wall["overrides"]) == {"collective_timeout_s=120.0", "epochs=3"}
    assert set(sim["overrides"]) == {"sim_network=piz_daint", "epochs=3", "clock=simulated"}
    assert "sim_network" not in wall["set"] and "collective_timeout_s" not in sim["set"]
    for m in (wall, sim):
        _check(m)
    # a matrix that gives the key itself is refused as a run would be
    wall, _ = matrix.matrices(_two_clocks(top, {"sim_network": "juwels_booster"}, {}))
    with pytest.raises(config.ConfigError, match="sim_network: applies only to clock=simulated"):
        _check(wall)


def test_a_matrixs_own_key_that_its_clock_ignores_is_refused_before_the_workflow_starts():
    _, sim = matrix.matrices(_two_clocks({}, {}, {"collective_timeout_s": 60}))
    with pytest.raises(config.ConfigError, match="collective_timeout_s: applies only to clock=wall"):
        _check(sim)
    # a config's only matrix: its ``set`` is its own
    (only,) = matrix.matrices({**_two_clocks({"sim_step_ms": 5}, {}, {}), "matrices": None})
    with pytest.raises(config.ConfigError, match="sim_step_ms: applies only to clock=simulated"):
        _check(only)
    # a top-level key that no matrix's clock reads
    both_wall = _two_clocks({"sim_step_ms": 5}, {}, {})
    both_wall["matrices"][1]["set"] = {}
    with pytest.raises(config.ConfigError, match=r"sim_step_ms \(clock=simulated only\) at the top level"):
        matrix.matrices(both_wall)


def test_env_json_records_every_library_installed_whether_the_run_imported_it_or_not(monkeypatch):
    """Versions from the installed metadata: wandb is recorded by a run that never imports it; a library
    that is not installed is ``None``; a module imported from where no metadata describes it gives its own."""
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    env = rundir.environment("gloo", "local", ["h"], torch.device("cpu"), None, 1)
    assert "wandb" not in sys.modules  # looked up, not imported
    for name in ("wandb", "torchvision", "torch", "numpy", "pandas", "scikit-learn", "scipy", "snakemake", "pyyaml"):
        assert env[name] == importlib.metadata.version(name), name
    expected = {"mpi4py", "horovod", "mnist1d", "matplotlib", "tqdm", "jinja2", "python", "torch", "numpy"}
    assert expected <= set(env)
    monkeypatch.setitem(rundir.LIBRARIES, "no-such-distribution", "no_such_module")
    monkeypatch.setitem(rundir.LIBRARIES, "no-metadata-here", "module_without_metadata")
    monkeypatch.setitem(sys.modules, "module_without_metadata", SimpleNamespace(__version__="1.2.3"))
    env = rundir.environment("gloo", "local", ["h"], torch.device("cpu"), None, 1)
    assert env["no-such-distribution"] is None and env["no-metadata-here"] == "1.2.3"


def test_lr_schedule_warmup_cosine_and_step():
    h = dict(epochs=4, warmup_epochs=1, schedule="cosine", milestones=[], gamma=0.1)
    f = LRSchedule(h, steps_per_epoch=10, world_size=4)
    assert f(0) == pytest.approx(0.25)  # warm-up starts at lr / world_size
    assert f(5) == pytest.approx(0.25 + 0.75 * 0.5)
    assert f(10) == pytest.approx(1.0)  # end of warm-up: the peak
    assert f(25) == pytest.approx(0.5)  # half-way through the cosine
    assert f(40) == pytest.approx(0.0, abs=1e-12)
    step = LRSchedule(dict(h, schedule="step", warmup_epochs=0, milestones=[2, 3]), 10, 4)
    assert [step(s) for s in (0, 19, 20, 29, 30)] == pytest.approx([1, 1, 0.1, 0.1, 0.01])
    assert LRSchedule(dict(h, schedule="constant", warmup_epochs=0), 10, 4)(33) == 1.0


def test_plateau_schedule_drops_on_the_epoch_after_patience_runs_out():
    """PyTorch's rule, checked by hand: an epoch is good when its loss is below best x (1 - 0.1);
    with patience 1 the second bad epoch in a row multiplies the factor by 0.5, never below
    min_lr / lr = 0.2; warm-up epochs are not fed."""
    h = dict(
        epochs=20,
        warmup_epochs=1,
        schedule="plateau",
        milestones=[],
        gamma=0.5,
        plateau_patience=1,
        plateau_threshold=0.1,
        min_lr=0.02,
        lr=0.1,
    )
    schedule = LRSchedule(h, steps_per_epoch=10, world_size=2)
    assert schedule(0) == pytest.approx(0.5) and schedule(10) == 1.0
    losses = [
        9.0,  # warm-up: ignored
        1.0,  # best 1.0
        0.95,  # not below 0.9: bad 1
        0.92,  # bad 2 > patience: x0.5, bad back to 0
        0.85,  # below 0.9: best 0.85
        0.8,
        0.8,  # not below 0.765: bad 1, bad 2: x0.5 -> 0.25
        0.8,
        0.8,  # x0.5 -> 0.125, clamped to min 0.2
        0.8,
        0.8,
    ]  # at the minimum: no change
    factors, changed = [], []
    for epoch, loss in enumerate(losses):
        changed.append(schedule.end_epoch(epoch, loss))
        factors.append(schedule(10 * (epoch + 1)))
    assert factors == pytest.approx([1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2, 0.2])
    assert changed == [False, False, False, True, False, False, True, False, True, False, False]

    partial = LRSchedule(h, steps_per_epoch=10, world_size=2)
    for epoch, loss in enumerate(losses[:6]):  # ends with best 0.85 and one bad epoch
        partial.end_epoch(epoch, loss)
    resumed = LRSchedule(h, steps_per_epoch=10, world_size=2)  # what a checkpoint restores
    resumed.load_state_dict(partial.state_dict())
    assert resumed(60) == pytest.approx(0.5)
    assert resumed.end_epoch(6, 0.8) and resumed(70) == pytest.approx(0.25), "best and the bad count survive"


def test_inverse_sqrt_schedule_peaks_at_the_end_of_the_warm_up():
    h = dict(epochs=10, warmup_epochs=1, schedule="inverse_sqrt", milestones=[], gamma=0.1)
    f = LRSchedule(h, steps_per_epoch=100, world_size=4)
    assert [f(0), f(50), f(100), f(400), f(900)] == pytest.approx([0.25, 0.625, 1.0, 0.5, 1 / 3])


def test_the_optimizer_is_the_tasks_and_adam_is_refused_where_a_rule_is_sgd():
    wmt = config.resolve("wagma", "wmt17_transformer", 1, 2, 0, Path("x"), [], check_data=False)
    adam = make_optimizer([torch.zeros(2, requires_grad=True)], wmt.hparams)
    assert isinstance(adam, torch.optim.Adam)
    assert adam.defaults["betas"] == (0.9, 0.98) and adam.defaults["eps"] == 1e-9 and adam.defaults["lr"] == 5e-4
    sgd = make_optimizer(
        [torch.zeros(2, requires_grad=True)], config.resolve("ddp", "digits", 1, 2, 0, Path("x"), []).hparams
    )
    assert isinstance(sgd, torch.optim.SGD)
    for algorithm in ("dana_zero", "lap_sgd"):
        with pytest.raises(config.ConfigError, match="own momentum-SGD rule; use optimizer=sgd"):
            config.resolve(algorithm, "navigation_ddppo", 1, 2, 0, Path("x"), [])
    # the virtual cluster runs the run's own optimizer
    assert config.resolve("ddp", "digits", 1, 2, 0, Path("x"), ["optimizer=adam", "clock=simulated"])
    with pytest.raises(config.ConfigError, match="momentum_mode=local"):
        config.resolve("local_sgd", "digits", 1, 2, 0, Path("x"), ["optimizer=adam", "momentum_mode=average"])
    with pytest.raises(config.ConfigError, match="betas"):
        config.resolve("ddp", "digits", 1, 2, 0, Path("x"), ["optimizer=adam", "betas=[0.9, 1.5]"])


@pytest.mark.parametrize(
    "items, message",
    [
        (["schedule=plateau", "gamma=2"], "factor must be in (0, 1)"),
        (["schedule=plateau", "min_lr=1"], "never lowers it"),
        (["schedule=plateau", "plateau_threshold=1.5"], "must be below 1"),
        (["schedule=inverse_sqrt", "warmup_epochs=0"], "at least 1 epoch"),
        (["optimizer=adam", "eps=-1"], "--set eps: must not be negative"),
    ],
)
def test_schedule_and_optimizer_settings_that_cannot_work_name_the_fix(items, message):
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        config.resolve("ddp", "digits", 1, 2, 0, Path("x"), items)


def test_topology_blocks_of_consecutive_ranks_are_nodes():
    t = Topology(rank=5, nodes=2, procs_per_node=4)
    assert (t.world_size, t.node, t.local_rank) == (8, 1, 1)
    assert t.node_ranks(1) == [4, 5, 6, 7] and t.cross_node_ranks(1) == [1, 5]
    with pytest.raises(ValueError, match="``rank``"):
        Topology(rank=8, nodes=2, procs_per_node=4)


def test_summary_is_written_atomically(tmp_path):
    rundir.write_json_atomic(tmp_path / "summary.json", {"status": "completed", "x": math.pi})
    assert json.loads((tmp_path / "summary.json").read_text())["x"] == math.pi
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left behind


def test_scale_lr_applies_the_linear_rule_to_the_run_and_records_it(tmp_path):
    from benchmarks import config

    plain = config.resolve("ddp", "digits", 2, 4, 0, tmp_path, ["lr=0.0125"])
    scaled = config.resolve("ddp", "digits", 2, 4, 0, tmp_path, ["lr=0.0125", "scale_lr=true"])
    assert plain.hparams["lr"] == 0.0125 and scaled.hparams["lr"] == pytest.approx(0.1)  # 0.0125 x 8 workers
    assert scaled.to_json()["settings"]["scale_lr"] is True


def test_scale_lr_counts_the_gradients_one_update_averages(tmp_path):
    """Synchronous and decentralised algorithms average world_size gradients per update; a parameter
    server applies each worker's gradient as its own update, so its lr stays the single-worker one,
    on a real run (world = master + 7 workers) as in the simulator (8 workers)."""
    for algorithm, expected in (
        ("allreduce", 0.16),
        ("lap_sgd", 0.16),
        ("dpsgd", 0.16),
        ("dana_dc", 0.02),
        ("asgd", 0.02),
    ):
        for clock in ("wall", "simulated"):
            if clock == "simulated" and algorithm in ("lap_sgd", "dpsgd"):
                continue  # no simulator
            cfg = config.resolve(algorithm, "digits", 2, 4, 0, tmp_path, ["lr=0.02", "scale_lr=true", f"clock={clock}"])
            assert cfg.hparams["lr"] == pytest.approx(expected), (algorithm, clock)
            assert cfg.to_json()["settings"]["scale_lr"] is True


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_dana_sim_matrix_gives_the_synchronous_reference_the_large_batch_lr(tmp_path, nodes):
    """config/dana-sim.yaml, resolved as the Snakefile does: allreduce averages N gradients per update
    and gets Goyal's lr 0.02 x N (warm-up from 0.02); every parameter-server algorithm gets 0.02."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    matrices = matrix.matrices(yaml.safe_load((root / "config/dana-sim.yaml").read_text()))
    (m,) = [m for m in matrices if m["suite"] == "dana-sim"]
    workers = nodes * m["procs_per_node"]
    assert "allreduce" in m["algorithms"] and len(m["algorithms"]) > 1
    for algorithm in m["algorithms"]:
        cfg = config.resolve(
            algorithm,
            "digits",
            nodes,
            m["procs_per_node"],
            0,
            tmp_path,
            matrix.overrides_for(algorithm, "digits", m["overrides"]),
        )
        expected = 0.02 * workers if algorithm == "allreduce" else 0.02
        assert cfg.hparams["lr"] == pytest.approx(expected), algorithm
        # the warm-up starts at 1 / N of the peak: the single-worker lr for allreduce, lr / N for the others
        start = cfg.hparams["lr"] * LRSchedule(cfg.hparams, 10, workers)(0)
        assert start == pytest.approx(0.02 if algorithm == "allreduce" else 0.02 / workers)


def test_stragglers_are_counted_among_the_workers_not_the_master(tmp_path):
    """A parameter server on 4 ranks has 3 workers: 3 stragglers is the most, 4 names the master too."""
    config.resolve("dana_slim", "digits", 1, 4, 0, tmp_path, ["straggler=fixed", "straggler_ranks=3"])
    with pytest.raises(config.ConfigError, match=r"1\.\.3 \(the workers\)"):
        config.resolve("dana_slim", "digits", 1, 4, 0, tmp_path, ["straggler=fixed", "straggler_ranks=4"])
    config.resolve("ddp", "digits", 1, 4, 0, tmp_path, ["straggler=fixed", "straggler_ranks=4"])


def test_a_simulator_refuses_the_stragglers_it_cannot_draw(tmp_path):
    """The parameter server's simulator draws DANA's gamma times, not a fixed delay on named ranks;
    the virtual cluster draws both."""
    simulated = ["clock=simulated", "straggler=fixed", "straggler_ranks=1"]
    with pytest.raises(config.ConfigError, match="dana_slim's straggler must be one of none, gamma, gamma_het"):
        config.resolve("dana_slim", "digits", 1, 4, 0, tmp_path, simulated)
    config.resolve("dana_slim", "digits", 1, 4, 0, tmp_path, ["clock=simulated", "straggler=gamma"])
    config.resolve("wagma", "digits", 1, 4, 0, tmp_path, simulated)


def test_min_lr_is_checked_against_the_scaled_lr(tmp_path):
    """lr 0.01 x 4 workers = 0.04: a plateau floor of 0.02 is below it, hence allowed."""
    scaled = config.resolve(
        "ddp", "digits", 1, 4, 0, tmp_path, ["lr=0.01", "scale_lr=true", "schedule=plateau", "min_lr=0.02"]
    )
    assert scaled.hparams["lr"] == pytest.approx(0.04)


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in (Path(__file__).resolve().parents[2] / "config").glob("*.yaml") if p.name != "schema.yaml"),
)
def test_every_config_resolves_every_run(name):
    """Every shipped matrix passes the schema and every run of it resolves (its keys, values and routing
    to algorithms), as the Snakefile checks them before the first job; data roots are checked when a
    run starts."""
    import yaml
    from snakemake.utils import validate

    root = Path(__file__).resolve().parents[2]
    loaded = yaml.safe_load((root / "config" / name).read_text())
    validate(loaded, schema=str(root / "config" / "schema.yaml"))  # as the Snakefile does: suite names and all
    matrices = matrix.matrices(loaded)
    for m in matrices:
        for algorithm in matrix.available_algorithms(m["algorithms"]):
            for task in m["tasks"]:
                sets = matrix.overrides_for(algorithm, task, m["overrides"])
                for nodes in m["nodes"]:
                    config.resolve(algorithm, task, nodes, m["procs_per_node"], 0, Path("x"), sets, check_data=False)


def test_a_matrix_files_mistakes_read_as_one_line_with_the_fix():
    base = {"suite": "t", "algorithms": ["ddp"], "tasks": ["digits"], "nodes": [1], "procs_per_node": 2, "seeds": [0]}
    matrix.check_matrix_file(base)  # a good one passes
    cases = {
        "unknown key 'seed' (did you mean 'seeds'?)": {**{k: v for k, v in base.items() if k != "seeds"}, "seed": [0]},
        "tasks must be a list, e.g. [a, b], got 'mnist1d_large'": {**base, "tasks": "mnist1d_large"},
        "unknown key 'node' (did you mean 'nodes'?) in matrices[1]": {
            **base,
            "matrices": [{"suite": "a", "node": [2]}],
        },
    }
    for expected, given in cases.items():
        with pytest.raises(config.ConfigError) as error:
            matrix.check_matrix_file(given)
        message = str(error.value)
        assert expected in message and "\n" not in message and "properties" not in message, message


def test_a_knob_of_another_algorithm_is_refused_naming_its_owner(tmp_path):
    with pytest.raises(
        config.ConfigError, match=r"algorithm 'allreduce' has no knob 'group_size'; it is a knob of wagma"
    ):
        config.resolve("allreduce", "digits", 2, 2, 0, tmp_path, ["group_size=8"])
    with pytest.raises(config.ConfigError, match=r"it is a knob of dc_asgd, dana_dc \(the knobs of asgd: none\)"):
        config.resolve("asgd", "digits", 1, 3, 0, tmp_path, ["dc_lambda=3"])
    # each parameter-server algorithm offers only the knobs its rule reads
    assert algorithms.params("asgd") == {} and list(algorithms.params("nag_asgd")) == ["nag_form"]
    assert set(algorithms.params("dana_dc")) == {"dc_lambda", "dc_mode", "dc_decay", "dc_eps", "dc_anchor"}
    assert config.resolve("dc_asgd", "digits", 1, 3, 0, tmp_path, ["dc_lambda=3"]).algorithm_params["dc_lambda"] == 3.0
