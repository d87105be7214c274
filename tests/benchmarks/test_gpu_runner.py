"""What the first GPU run needs of the runner, checked without a GPU: the GPU each rank takes, DDP's
``device_ids`` for a CPU model, DataLoader workers sized from the rank's CPUs (and the augmentations
they draw surviving a resume), a clock and straggler sleeps that wait for the queued GPU work, and a
resumed loss sum on the run's device. CUDA calls are replaced by recorders."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import algorithms.ddp
from algorithms.base import Plan
from algorithms.topology import Topology
from benchmarks import checkpoint, clock, devices, launcher, spawn, tasks
from benchmarks.stragglers import Stragglers


@pytest.fixture
def gpus(monkeypatch):
    """A machine with 4 "GPUs": ``set_device`` calls are recorded in the returned list."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(d if isinstance(d, int) else d.index))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: chosen[-1])
    return chosen


def test_two_virtual_nodes_on_one_machine_take_four_distinct_gpus(gpus):
    # The local launcher's 2 nodes x 2 processes: LOCAL_RANK is 0, 1, 0, 1 (the rank in its virtual node).
    launches = [launcher.detect(spawn.rank_environment(rank, 2, 2, port=29999, threads=1)) for rank in range(4)]
    assert [launch.launcher for launch in launches] == ["local"] * 4
    picked = [devices.pick_device("auto", launch.local_rank) for launch in launches]
    assert [d.index for d in picked] == [0, 1, 2, 3] and gpus == [0, 1, 2, 3]
    assert {launch.local_size for launch in launches} == {4}  # all four share this machine's CPUs


def test_srun_ranks_take_the_gpu_of_their_local_id(gpus):
    """Node 1 of a 2 x 4 job step: global ranks 4..7, Slurm's local ids 0..3."""
    for rank in range(4, 8):
        env = {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": str(rank - 4),
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
            "MASTER_ADDR": "jwb0001i",
        }
        launch = launcher.detect(env)
        assert (launch.launcher, launch.rank, launch.local_rank, launch.local_size) == ("srun", rank, rank - 4, 4)
        assert devices.pick_device("cuda", launch.local_rank).index == (rank - 4) % 4
    assert gpus == [0, 1, 2, 3]


def test_local_position_per_launcher():
    env = {
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "SLURM_LOCALID": "2",
        "SLURM_NTASKS_PER_NODE": "4",
    }
    assert launcher.local_position("local", 5, 8, env) == (5, 8)  # one machine: the global rank
    assert launcher.local_position("torchrun", 5, 8, env) == (1, 2)
    assert launcher.local_position("mpirun", 5, 8, env) == (3, 4)
    assert launcher.local_position("srun", 5, 8, env) == (2, 4)
    assert launcher.local_position("srun", 5, 8, {"SLURM_LOCALID": "1"}) == (1, 8)  # count unknown: the job's
    assert launcher.local_position("mpirun", 5, 8, {}) == (5, 8)  # nothing said: the global rank


def test_ddp_gets_no_device_ids_for_a_cpu_model_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    given = {}

    def fake_ddp(module, **kwargs):  # what DistributedDataParallel would be built with
        given.update(kwargs)
        return module

    monkeypatch.setattr(algorithms.ddp, "DistributedDataParallel", fake_ddp)
    model = nn.Linear(3, 2)
    algorithms.ddp.DDP(Topology(0, 1, 1)).prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), Plan(1, 1))
    assert given["device_ids"] is None  # DDP rejects any device id for a CPU module, [None] included
    assert algorithms.ddp.device_ids(nn.Linear(3, 2, device="meta")) is None


def _cpus(monkeypatch, bound: int, machine: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(bound)))
    monkeypatch.setattr(os, "cpu_count", lambda: machine)


def test_loader_workers_are_the_ranks_cpus_less_its_training_threads(monkeypatch):
    imagenet, cityscapes, cifar = map(tasks.get, ("imagenet_resnet50", "cityscapes_deeplabv3", "cifar10_resnet20"))
    _cpus(monkeypatch, bound=8, machine=48)  # srun --cpus-per-task=8
    assert [tasks.loader_workers(t, threads=1) for t in (imagenet, cityscapes, cifar)] == [7, 7, 7]
    assert [tasks.loader_workers(tasks.get(n), threads=1) for n in ("digits", "mnist1d")] == [0, 0]  # tensors in memory
    assert tasks.loader_workers(imagenet, threads=8) == 0
    # On a GPU the rank keeps one torch thread; its other CPUs decode.
    threads = tasks.default_threads(4, torch.device("cuda", 0), imagenet)
    assert threads == 1 and tasks.loader_workers(imagenet, threads, ranks_here=4) == 7
    assert tasks.default_threads(4, torch.device("cpu"), imagenet) == 8  # on the CPU, as before
    _cpus(monkeypatch, bound=16, machine=16)  # the local launcher: 4 ranks see the whole machine
    assert tasks.loader_workers(imagenet, threads=1, ranks_here=4) == 3
    _cpus(monkeypatch, bound=2, machine=2)  # this test machine
    assert tasks.loader_workers(imagenet, threads=1) <= 1
    assert tasks.loader_workers(imagenet, tasks.default_threads(1, torch.device("cpu"), imagenet)) == 0
    assert tasks.loader_workers(imagenet, threads=1, ranks_here=2) == 0


def test_loader_options_pin_only_for_cuda():
    loader = tasks.get("digits").train_loader(list(range(8)), None, 2, None, torch.device("cuda", 0), workers=2)
    assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (2, True, True)
    loader = tasks.get("digits").train_loader(list(range(8)), None, 2, None, torch.device("cpu"), workers=0)
    assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (0, False, False)


class _Augmented(Dataset):
    """Each read draws a "random crop" from torch's generator, as the image tasks' transforms do."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.rand(()), index


def _loader(workers: int) -> tuple[checkpoint.ResumableSampler, object]:
    sampler = checkpoint.ResumableSampler(_Augmented(), num_replicas=1, rank=0, shuffle=True, seed=5, drop_last=True)
    loader = tasks.get("digits").train_loader(_Augmented(), sampler, 4, None, torch.device("cpu"), workers=workers)
    return sampler, loader


def _epoch(sampler: checkpoint.ResumableSampler, loader: object, epoch: int, skip_batches: int = 0) -> list:
    """``(draw, index)`` of every item of ``epoch``, read after ``skip_batches`` batches."""
    sampler.set_epoch(epoch)
    sampler.skip = skip_batches * 4
    return [(round(r.item(), 7), int(i)) for x, y in loader for r, i in zip(x, y)]


def test_a_resume_with_loader_workers_replays_the_data_order_and_the_augmentations():
    sampler, loader = _loader(workers=2)
    whole, second = _epoch(sampler, loader, 1), _epoch(sampler, loader, 2)  # the same (persistent) workers
    assert sorted(i for _, i in whole) == list(range(24))
    assert _epoch(*_loader(workers=2), 1, skip_batches=3) == whole[12:]  # resumed after 3 batches
    assert _epoch(*_loader(workers=2), 2, skip_batches=5) == second[20:]  # resumed in a later epoch
    assert _epoch(*_loader(workers=1), 1) == whole  # whatever the number of workers
    draws = [{i: r for r, i in items} for items in (whole, second)]
    assert all(draws[0][i] != draws[1][i] for i in range(24))  # each epoch draws anew for every item


def test_the_clock_waits_for_the_gpu(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    clock.WallClock(torch.device("cpu"))()
    assert synced == []
    clock.WallClock(torch.device("cuda", 1))()
    assert synced == [torch.device("cuda", 1)]


@pytest.mark.parametrize("kind", ["fixed", "gamma"])
def test_a_delayed_rank_waits_for_its_gpu_work_before_it_sleeps(monkeypatch, kind):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: events.append(("sync", device.index)))
    monkeypatch.setattr("benchmarks.stragglers.time", SimpleNamespace(sleep=lambda s: events.append(("sleep",))))
    stragglers = Stragglers(kind, 0, [0, 1, 2, 3], 1, 5.0, 3, torch.device("cuda", 0))
    delayed = [step for step in range(20) if kind == "gamma" or 0 in stragglers.delayed(step)]
    if kind == "fixed":  # 1 of the 4 workers per step: this rank on some steps only
        assert 0 < len(delayed) < 20
    for step in range(20):
        stragglers.before_step(step)
    assert events == [("sync", 0), ("sleep",)] * len(delayed)  # each sleep after a sync, no sync without one
    events.clear()
    on_cpu = Stragglers(kind, 0, [0, 1, 2, 3], 1, 5.0, 3, torch.device("cpu"))
    for step in range(20):
        on_cpu.before_step(step)
    assert ("sync", 0) not in events and len(events) == len(delayed)


def test_a_resumed_loss_sum_lands_on_the_runs_device():
    saved = torch.tensor(3.5, dtype=torch.float64)  # as checkpoint.load gives it: on the CPU
    resumed = clock.loss_accumulator(saved, torch.device("meta"))
    assert resumed.device.type == "meta" and resumed.dtype == torch.float64 and resumed.shape == ()
    assert clock.loss_accumulator(None, torch.device("meta")).device.type == "meta"
    assert clock.loss_accumulator(saved, torch.device("cpu")).item() == 3.5
