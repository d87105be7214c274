"""The GPU paths on a CPU: every algorithm trains and resumes on the strict device (tests/strict_device.py).

The strict device keeps CUDA's and NCCL's rules: a host tensor beside a device tensor fails, the
device's process groups take device tensors only and refuse any-source receives and calls from a
second thread, gloo refuses device tensors. The first tests check the stand-in itself (a stand-in
that accepted everything would make the runs below pass for nothing); then each registered
algorithm runs 44 steps an epoch on 2 ranks, is stopped by SIGTERM in its second epoch and
resumed to the end, all on the strict device.

Horovod is left out: its device path is Horovod's C++ (its own NCCL operations), which refuses a
device it was not built for; it runs on the cluster only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import algorithms
from tests.distributed import run_on, stop_after_first_epoch

ROOT = Path(__file__).resolve().parents[2]


# ---- the stand-in keeps the rules ----------------------------------------------------------------------
# Each check runs in a process of its own: the device must not be registered in pytest's process,
# where autograd would then start a thread for it and refuse later forks (LAP/LPP's updaters).


def test_a_host_tensor_beside_a_device_tensor_fails_as_on_cuda():
    run_on(1, _tensor_rules)


def _tensor_rules(rank: int, world: int) -> None:
    from tests.strict_device import DEVICE, MixedDevices

    on_device = torch.ones(3, device=DEVICE)
    with pytest.raises(MixedDevices):
        on_device + torch.ones(3)
    with pytest.raises(MixedDevices):
        torch.cat([on_device, torch.tensor([1.0])])
    # what CUDA allows: 0-dim host tensors as scalars, copies both ways, reading a value
    assert torch.equal((on_device * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))
    assert torch.equal(torch.zeros(3).to(DEVICE).add_(on_device).cpu(), torch.ones(3))
    assert on_device.sum().item() == 3.0 and on_device.tolist() == [1.0, 1.0, 1.0]
    # device memory is shared in place, as CUDA IPC shares it (never moved while another thread writes)
    assert on_device.inner.is_shared() and torch.ones(2).to(DEVICE).inner.is_shared()
    with pytest.raises(MixedDevices, match="writes a host tensor"):
        torch.zeros(()).add_(on_device.sum())  # a host accumulator cannot take a device result


def test_a_model_trains_on_the_device_and_its_checkpoint_loads_there(tmp_path):
    run_on(1, _model_on_device, str(tmp_path / "m.pt"))


def _model_on_device(rank: int, world: int, path: str) -> None:
    from benchmarks.tasks import digits
    from tests.strict_device import DEVICE, MixedDevices

    torch.manual_seed(0)
    model = digits.make_model().to(DEVICE)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    with pytest.raises(MixedDevices):
        model(x)  # a batch left on the host
    loss = torch.nn.functional.cross_entropy(model(x.to(DEVICE)), y.to(DEVICE))
    loss.backward()
    assert all(p.grad.device == DEVICE for p in model.parameters())
    torch.save(model.state_dict(), path)
    loaded = torch.load(path, weights_only=True)
    assert all(t.device == DEVICE for t in loaded.values())
    on_host = torch.load(path, map_location="cpu", weights_only=True)  # as the checkpoints load
    assert all(type(t) is torch.Tensor and torch.equal(t, d.cpu()) for t, d in zip(on_host.values(), loaded.values()))


def test_the_devices_process_groups_keep_nccls_rules():
    run_on(2, _on_strict_group)


def _on_strict_group(rank: int, world: int) -> None:
    from tests.strict_device import DEVICE, NAME, MixedDevices

    group = dist.new_group(backend=NAME)
    with pytest.raises(MixedDevices, match="NCCL takes device tensors only"):
        dist.all_reduce(torch.ones(2), group=group)
    t = torch.full((2,), float(rank + 1), device=DEVICE)
    dist.all_reduce(t, group=group)
    assert t.tolist() == [3.0, 3.0]
    with pytest.raises(MixedDevices, match="any source"):
        group.recv_anysource([torch.empty(2, device=DEVICE)], 0)
    failures = []

    def second_thread():
        try:
            dist.all_reduce(torch.ones(2, device=DEVICE), group=group)
        except MixedDevices as error:
            failures.append(error)

    thread = threading.Thread(target=second_thread)
    thread.start()
    thread.join()
    assert failures and "second thread" in str(failures[0])
    with pytest.raises(MixedDevices, match="gloo"):
        dist.all_reduce(torch.ones(2, device=DEVICE))  # run_on's default group is gloo
    dist.barrier(group=group)


# ---- every algorithm: stopped in its second epoch, resumed ---------------------------------------------

# Each algorithm with its default knobs, where digits allows them; and the modes with state of their
# own: SGP with a message in flight, WAGMA's blocking butterfly, DASO past its warm-up (sends in flight).
# Not here: Horovod (its own C++ communication), PowerSGD (PyTorch's hook forks the RNG of every
# device, which this stand-in does not provide): tests/benchmarks/test_resume.py resumes both on the CPU.
CASES = {name: [] for name in algorithms.names() if name not in ("horovod", "powersgd")} | {
    "lap_sgd": ["--set", "updaters=2"],
    "lpp_sgd": ["--set", "updaters=2"],  # 4 leave a block empty
    "sgp-overlap": ["--set", "overlap=1"],
    "wagma": ["--set", "group_size=2"],  # groups of 2 (the default on 2 ranks, sqrt(2) -> 1, exchanges nothing)
    "wagma-sync": ["--set", "mode=sync", "--set", "group_size=2"],
    "daso": ["--set", "sync_warmup_epochs=1", "--set", "sync_cooldown_epochs=0"],
    "diloco": ["--set", "inner_steps=8"],  # outer steps in flight of the epoch: theta and its momentum saved
}
# The same numbers as on the CPU, after the stop and the resume: what the strict device may change
# is where tensors live, never a value. The others' timing decides who averages with whom when.
DETERMINISTIC = {
    "ddp",
    "allreduce",
    "local_sgd",
    "post_local_sgd",
    "dpsgd",
    "sgp",
    "sgp-overlap",
    "wagma-sync",
    "daso",
    "diloco",
    "asgd",
    "nag_asgd",
    "multi_asgd",
    "dc_asgd",
    "dana_zero",
    "dana_slim",
    "dana_dc",
}
# 1,438 digits / (2 ranks x 16) = 44 steps an epoch; the SIGTERM goes when the first epoch's row is
# written, and the ranks agree on a stop within 16 steps (checkpoint.StopRequest), so the run stops
# inside its second epoch: a mid-epoch resume, with the runner's loss sum and the algorithms'
# messages in flight in the checkpoint. Rank 1 is slower than rank 0 for the whole run: it sleeps
# 20 ms before every step, about 4x the step's compute (5.2 ms here, batch 16, one thread); every
# algorithm must complete under it, with no collective timeout (60 s here) and no deadlock, and it
# keeps the fast algorithms from running past the SIGTERM. (Ten times slower, who waits:
# tests/algorithms/test_slow_rank.py; here it would cost CI about 3 minutes more.) Algorithms that run their epochs themselves (owns_loop) stop at
# the end of the second of three, of batches of 32.
COMMON = [
    "--task",
    "digits",
    "--nodes",
    "2",
    "--procs-per-node",
    "1",
    "--seed",
    "0",
    "--set",
    "wandb=false",
    "--set",
    "threads=1",
    "--set",
    "straggler=slow",
    "--set",
    "straggler_delay_ms=20",
    "--set",
    "collective_timeout_s=60",
]
# The others' final metric varies from run to run with the timing (who averages with whom when).
# Over 6 uninterrupted runs of each on the CPU under this command, it spread over 0.017 (AD-PSGD),
# 0.053 (WAGMA), 0.114 (LAP-SGD: 0.797-0.911) and 0.008 (LPP-SGD; 0.028 with a random slow rank each
# step). A resumed run must land within that noise of an uninterrupted one: here, within about 1.5-2x
# the spread, so that a resume that lost or mixed up state (an untrained model scores 0.1) fails.
# LPP-SGD is LAP-SGD's Hogwild with partial steps, and its 6 runs undersampled the same timing noise
# (a resumed run 0.056 from an uninterrupted one has been seen): it gets LAP-SGD's bound.
NOISE = {"adpsgd": 0.04, "wagma": 0.08, "lap_sgd": 0.17, "lpp_sgd": 0.17}


def _epochs(case: str) -> int:
    return 3 if algorithms.get(case.split("-")[0]).owns_loop else 2


def _command(server: Path, case: str, out: Path, device: str = "strict") -> list[str]:
    """The run ``python -m tests.strict_run`` would be, started by ``server`` (the strict forkserver)."""
    batch = 32 if _epochs(case) == 3 else 16
    return [
        sys.executable,
        "-m",
        "benchmarks.forkserver",
        "run",
        str(server),
        "--algorithm",
        case.split("-")[0],
        *COMMON,
        *CASES[case],
        "--set",
        f"epochs={_epochs(case)}",
        "--set",
        f"batch_size={batch}",
        "--set",
        f"device={device}",
        "--out",
        str(out),
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_every_algorithm_trains_and_resumes_on_the_strict_device(tmp_path, case, strict_forkserver):
    out = tmp_path / "run"
    code, output = stop_after_first_epoch(_command(strict_forkserver, case, out), out, ROOT)
    assert code == 75, output[-3000:]
    stopped = json.loads((out / "summary.json").read_text())
    assert stopped["status"] == "timeout" and stopped["steps"] >= 2, stopped

    resumed = subprocess.run(
        _command(strict_forkserver, case, out), cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )
    log = (out / "log.txt").read_text()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:] + log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == _epochs(case)
    assert summary["steps"] > stopped["steps"] and "resumed at epoch" in log and "(strict, local)" in log
    if not algorithms.get(case.split("-")[0]).owns_loop:
        assert not re.search(r"resumed at epoch \d+ batch 0\b", log), "stopped at an epoch end, not inside one"

    reference = subprocess.run(
        _command(strict_forkserver, case, tmp_path / "cpu", device="cpu"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    on_cpu = json.loads((tmp_path / "cpu" / "summary.json").read_text())
    if case not in DETERMINISTIC:  # trained (an untrained model scores 0.1), as far as an uninterrupted run
        assert summary["final_metric"] > 0.5, summary
        assert abs(summary["final_metric"] - on_cpu["final_metric"]) <= NOISE[case], (summary, on_cpu)
        return
    for key in ("final_metric", "final_train_loss", "steps"):
        assert summary[key] == pytest.approx(on_cpu[key], rel=1e-6, abs=1e-9), key


# ---- the simulator: P logical workers in one process, on the device ------------------------------------


@pytest.mark.parametrize("name", ["allreduce", "dana_dc"])
def test_the_simulator_runs_on_the_device_to_the_cpus_numbers(tmp_path, name, strict_forkserver):
    summaries = {}
    for device in ("strict", "cpu"):
        out = tmp_path / device
        command = [
            sys.executable,
            "-m",
            "benchmarks.forkserver",
            "run",
            str(strict_forkserver),
            "--algorithm",
            name,
            "--task",
            "digits",
            "--nodes",
            "2",
            "--procs-per-node",
            "4",
            "--seed",
            "0",
            "--set",
            "clock=simulated",
            "--set",
            "straggler=gamma",
            "--set",
            "epochs=2",
            "--set",
            "wandb=false",
            "--set",
            f"device={device}",
            "--out",
            str(out),
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        summaries[device] = json.loads((out / "summary.json").read_text())
        assert json.loads((out / "env.json").read_text())["device"] == device
    assert summaries["strict"]["final_metric"] > 0.5  # it trained
    for key in ("final_metric", "final_train_loss", "steps", "wall_s"):
        assert summaries["strict"][key] == pytest.approx(summaries["cpu"][key], rel=1e-6, abs=1e-9), key
