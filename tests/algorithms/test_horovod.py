"""Horovod's DistributedOptimizer is DDP's update, under every way the suite starts a Horovod job.

The Horovod runs start the way Horovod needs: ``mpirun`` (Horovod's MPI controller), ``horovodrun
--gloo`` (its own rendezvous), and plain processes that joined ``torch.distributed`` (the suite's
launcher, srun, torchrun: the algorithm starts Horovod's gloo rendezvous itself). Run as
``python -m tests.algorithms.test_horovod OUT`` it is the worker those launchers start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import algorithms
from algorithms.ddp import DDP
from algorithms.horovod import Horovod, import_horovod
from algorithms.topology import Topology
from benchmarks import config as run_config
from benchmarks import launcher
from benchmarks.config import ConfigError
from benchmarks.tasks import digits
from tests.distributed import run_on

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STEPS, WORLD = 6, 4
CLASSES = {"ddp": DDP, "horovod": Horovod}  # not through algorithms.REGISTRY: the classes themselves
try:
    import horovod.torch  # noqa: F401

    MISSING = None
except ImportError as error:
    MISSING = f"horovod does not import ({error}); build it with envs/build_horovod.sh"
needs_horovod = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _train(rank: int, world: int, name: str, out: str, knobs: dict[str, object]) -> None:
    """The loop of tests/algorithms/test_ddp_allreduce.py, with an lr scheduler on the runner's optimizer."""
    torch.manual_seed(0)
    model = digits.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    algo = CLASSES[name](Topology(rank, nodes=2, procs_per_node=world // 2), **knobs)
    train_model = algo.prepare(model, optimizer, algorithms.Plan(steps_per_epoch=STEPS, epochs=1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank sees its own batches
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. "lr_scheduler.step() before optimizer.step()"
        for _ in range(STEPS):
            x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(train_model(x), y).backward()
            algo.step()
            scheduler.step()
    # Momentum lives in the runner's optimizer, where its state_dict() finds it.
    assert len(optimizer.state) == len(list(model.parameters()))
    algo.close()  # for Horovod: shutdown; a later Horovod in the same process initialises again
    if rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], g) for g in gathered), "ranks hold different parameters"


def _worker(out: str) -> None:
    """One rank under mpirun or horovodrun: join as the runner does, then train."""
    launch = launcher.detect()
    assert launch is not None, "started without a launcher"
    torch.set_num_threads(1)
    launcher.init_process_group(launch, timeout_s=60, device=torch.device("cpu"))
    try:
        _train(launch.rank, launch.world_size, "horovod", out, {})
        if launch.rank == 0:
            Path(out + ".launcher").write_text(launch.launcher)
    finally:
        dist.destroy_process_group()


def _train_each(rank: int, world: int, runs: list[tuple[str, str, dict[str, object]]]) -> None:
    for name, out, knobs in runs:  # one set of processes for all: start-up dominates the time
        _train(rank, world, name, out, knobs)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict[str, list[torch.Tensor]]:
    """DDP, Horovod and Horovod with fp16 compression, in processes started as the suite starts them."""
    tmp = tmp_path_factory.mktemp("suite")
    runs = [
        ("ddp", str(tmp / "ddp.pt"), {}),
        ("horovod", str(tmp / "horovod.pt"), {}),
        ("horovod", str(tmp / "fp16.pt"), {"fp16_compression": True}),
    ]
    run_on(WORLD, _train_each, runs)
    return {
        "ddp": torch.load(tmp / "ddp.pt"),
        "horovod": torch.load(tmp / "horovod.pt"),
        "fp16": torch.load(tmp / "fp16.pt"),
    }


def _launched(launcher: str, out: Path) -> list[torch.Tensor]:
    """Horovod on WORLD ranks started by ``mpirun`` or ``horovodrun --gloo``; rank 0's parameters."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", OMP_NUM_THREADS="1")
    # A rank that dies of a signal prints its Python stack (faulthandler), and mpirun names every
    # rank's exit code, not only the first: a failure here says which rank died, and of what.
    worker = [sys.executable, "-X", "faulthandler", "-m", "tests.algorithms.test_horovod", str(out)]
    if launcher == "mpirun":
        command = [str(BIN / "mpirun"), "-print-all-exitcodes", "-n", str(WORLD), *worker]
    else:
        command = [str(BIN / "horovodrun"), "--gloo", "-np", str(WORLD), "-H", f"localhost:{WORLD}", *worker]
    result = subprocess.run(
        command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"{launcher} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    assert Path(f"{out}.launcher").read_text() == launcher
    return torch.load(out)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@needs_horovod
def test_horovod_and_ddp_agree_after_k_steps(suite):
    torch.manual_seed(0)
    initial = list(digits.make_model().parameters())
    assert _max_diff(suite["ddp"], initial) > 1e-3, "the parameters did not train"
    diff = _max_diff(suite["ddp"], suite["horovod"])
    assert diff <= 1e-6, f"ddp and horovod differ by {diff}"


@needs_horovod
def test_fp16_compression_stays_close_to_ddp(suite):
    diff = _max_diff(suite["ddp"], suite["fp16"])
    assert 0 < diff < 1e-3, f"fp16-compressed horovod and ddp differ by {diff}"


@needs_horovod
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_horovod_under_its_own_launchers_agrees_with_ddp(launcher, suite, tmp_path):
    if shutil.which(launcher, path=str(BIN)) is None:
        pytest.skip(f"no {launcher} in the environment")
    diff = _max_diff(suite["ddp"], _launched(launcher, tmp_path / "horovod.pt"))
    assert diff <= 1e-6, f"ddp and horovod started by {launcher} differ by {diff}"


@needs_horovod
def test_runner_reaches_the_target_with_horovod(tmp_path, run_command):
    if "horovod" not in algorithms.REGISTRY:
        pytest.skip('algorithms.REGISTRY has no "horovod": "algorithms.horovod:Horovod" entry')
    out = tmp_path / "run"
    command = [
        *run_command,
        "--algorithm",
        "horovod",
        "--task",
        "digits",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--seed",
        "0",
        "--out",
        str(out),
        "--set",
        "wandb=false",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["time_to_target_s"] is not None, summary
    assert summary["comm_share"] is None  # communication overlaps backward: not timed apart
    assert json.loads((out / "env.json").read_text())["launcher"] == "local"


def test_knob_is_checked_and_a_missing_horovod_says_how_to_build(monkeypatch):
    if MISSING is None:
        assert Horovod.unavailable() is None
    with pytest.raises(ValueError, match="``fp16_compression``"):
        Horovod(Topology(0, 1, 1), fp16_compression="yes")
    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # as if it were not installed
    with pytest.raises(ImportError, match="envs/build_horovod.sh") as caught:
        import_horovod()
    assert "\n" not in str(caught.value)
    assert Horovod.unavailable() == str(caught.value)
    assert Horovod.unavailable(simulated=True) is None  # the virtual cluster's model needs torch alone
    with pytest.raises(ConfigError, match="envs/build_horovod.sh"):  # refused before any process starts
        run_config.resolve("horovod", "digits", 1, 2, 0, Path("unused"), [])


if __name__ == "__main__":
    _worker(sys.argv[1])
    launcher.exit_process(0)  # as the suite's ranks end (an error above exits 1 on its own)
