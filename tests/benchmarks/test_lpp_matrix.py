"""The LPP-SGD paper's matrix (config/lpp.yaml) resolves to the paper's settings, run by run.

Every run is resolved as the workflow resolves it (``benchmarks.matrix.matrices``, then each run's
``overrides_for`` and ``resolve``), and checked against numbers read by hand from the paper
(arXiv:2203.06638) and its code (github.com/bapi/LPP-SGD): the K = 1 phase ends at T/2 for post-local
SGD as for LAP/LPP-SGD (Sec. 3, Synchronization Frequency Scheme; Table 1's caption), ImageNet runs
with Nesterov (the code's ``--nesterov``), weight decay 5e-5 (Table 13) and Table 8's local batches,
and ResNet-20 with Table 1's recipe (Table 13).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml

import algorithms
from algorithms.topology import Topology
from benchmarks import config as run_config
from benchmarks import matrix

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = {"lap_sgd", "lpp_sgd", "ddp", "allreduce", "post_local_sgd"}
DATA_PARALLEL = {"ddp", "allreduce", "post_local_sgd"}  # the paper's MB-SGD and PL-SGD
# Epoch at which K = 1 ends, T/2 (Sec. 3, Synchronization Frequency Scheme: 150 of 300, 100 of 200, 45 of 90).
SWITCH = {
    "cifar10_resnet20": 150,
    "cifar100_resnet20": 150,
    "cifar10_squeezenet": 100,
    "cifar100_squeezenet": 100,
    "cifar10_wrn16_8": 100,
    "cifar100_wrn16_8": 100,
    "imagenet_resnet50": 45,
}
TRAIN_IMAGES = {"cifar": 50_000, "imagenet": 1_281_167}


@functools.cache
def _runs() -> list[run_config.RunConfig]:
    """Every run of config/lpp.yaml at seed 0, resolved as the Snakefile does (``check_data`` off)."""
    runs = []
    for m in matrix.matrices(yaml.safe_load((ROOT / "config/lpp.yaml").read_text())):
        for algorithm in matrix.available_algorithms(m["algorithms"]):
            for task in m["tasks"]:
                sets = [f"suite={m['suite']}", *matrix.overrides_for(algorithm, task, m["overrides"])]
                runs += [
                    run_config.resolve(
                        algorithm, task, n, m["procs_per_node"], 0, Path("unused"), sets, check_data=False
                    )
                    for n in m["nodes"]
                ]
    return runs


def _steps_per_epoch(cfg: run_config.RunConfig) -> int:
    """The runner's batches per worker and epoch: the sampler and the loader both drop the remainder."""
    images = TRAIN_IMAGES["imagenet" if cfg.task.startswith("imagenet") else "cifar"]
    return images // cfg.world_size // cfg.hparams["batch_size"]


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group: ``prepare`` broadcasts rank 0's parameters."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_every_task_and_algorithm_runs_once_per_layout():
    seen = [(cfg.task, cfg.algorithm, cfg.nodes) for cfg in _runs()]
    assert len(seen) == len(set(seen))
    assert {(task, algorithm) for task, algorithm, _ in seen} == {(t, a) for t in SWITCH for a in ALGORITHMS}
    assert {(cfg.nodes, cfg.procs_per_node) for cfg in _runs()} == {(1, 2), (2, 2), (4, 2)}


@pytest.mark.parametrize("task", sorted(SWITCH))
def test_post_local_sgd_goes_local_at_half_the_epochs_as_lap_and_lpp(task, one_rank):
    mine = [cfg for cfg in _runs() if cfg.task == task]
    for cfg in mine:
        assert cfg.hparams["epochs"] == 2 * SWITCH[task], cfg.run_id
        if cfg.algorithm in ("lap_sgd", "lpp_sgd"):  # -1 is half the epochs (algorithms/lpp_sgd.py)
            switch = cfg.algorithm_params["switch_epoch"]
            assert (cfg.hparams["epochs"] // 2 if switch == -1 else switch) == SWITCH[task], cfg.run_id
    for cfg in (c for c in mine if c.algorithm == "post_local_sgd"):
        h = cfg.hparams
        topology = Topology(0, nodes=cfg.nodes, procs_per_node=cfg.procs_per_node)
        algo = algorithms.build("post_local_sgd", topology, **cfg.algorithm_params)
        plan = algorithms.Plan(
            _steps_per_epoch(cfg),
            h["epochs"],
            tuple(h["milestones"]) if h["schedule"] == "step" else (),
            h["warmup_epochs"],
        )
        model = torch.nn.Linear(2, 1)
        algo.prepare(model, torch.optim.SGD(model.parameters(), lr=h["lr"]), plan)
        assert algo.switch_step == SWITCH[task] * plan.steps_per_epoch, cfg.run_id
        assert algo.period == (8 if task == "imagenet_resnet50" else 16), cfg.run_id


def test_imagenet_runs_use_the_papers_optimizer_batches_and_lr():
    imagenet = [cfg for cfg in _runs() if cfg.task == "imagenet_resnet50"]
    assert {cfg.algorithm for cfg in imagenet} == ALGORITHMS
    for cfg in imagenet:
        h, q = cfg.hparams, cfg.world_size
        assert h["nesterov"] is True and h["weight_decay"] == 5e-5 and h["momentum"] == 0.9, cfg.run_id
        assert h["epochs"] == 90 and h["milestones"] == [30, 60, 80] and h["gamma"] == 0.1, cfg.run_id
        # Table 8: B_loc 128 for MB/PL-SGD, 32 for LAP/LPP-SGD (4 updaters each).
        assert h["batch_size"] == (128 if cfg.algorithm in DATA_PARALLEL else 32), cfg.run_id
        if cfg.algorithm not in DATA_PARALLEL:
            assert cfg.algorithm_params["updaters"] == 4 and cfg.algorithm_params["period"] == 8, cfg.run_id
        # alpha_w = 0.0125 x B_loc x Q / 32 (Table 13's caption): at Q = 8, 0.4 for MB/PL and 0.1 for LAP.
        assert h["lr"] == pytest.approx(0.0125 * h["batch_size"] * q / 32), cfg.run_id
    at_8 = {cfg.algorithm: cfg for cfg in imagenet if cfg.world_size == 8}
    assert at_8["ddp"].hparams["lr"] == pytest.approx(0.4)
    assert at_8["lap_sgd"].hparams["lr"] == pytest.approx(0.1)  # Table 13's alpha^w_LAP
    lpp = at_8["lpp_sgd"]
    assert lpp.hparams["lr"] * lpp.algorithm_params["lr_boost"] == pytest.approx(0.125)  # alpha^w_LPP


def test_cifar10_resnet20_has_table_1s_recipe():
    resnet20 = [cfg for cfg in _runs() if cfg.task == "cifar10_resnet20"]
    assert {cfg.algorithm for cfg in resnet20} == ALGORITHMS
    for cfg in resnet20:
        h = cfg.hparams
        recipe = (h["epochs"], h["milestones"], h["gamma"], h["weight_decay"])
        assert recipe == (300, [150, 225], 0.1, 5e-4), cfg.run_id
        assert h["batch_size"] == 128 and h["nesterov"] is True, cfg.run_id
        assert h["lr"] == pytest.approx(0.1 * cfg.world_size), cfg.run_id  # Table 1: 0.2 at Q = 2


def test_cifar_periods_and_lr_follow_table_13():
    for cfg in _runs():
        if cfg.task.startswith("cifar"):
            assert cfg.hparams["batch_size"] == 128, cfg.run_id
            assert cfg.hparams["lr"] == pytest.approx(0.1 * cfg.world_size), cfg.run_id  # 0.2, 0.4, 0.8
            if cfg.algorithm not in ("ddp", "allreduce"):
                assert cfg.algorithm_params["period"] == 16, cfg.run_id
            if cfg.algorithm in ("lap_sgd", "lpp_sgd"):
                assert cfg.algorithm_params["updaters"] == 4, cfg.run_id
