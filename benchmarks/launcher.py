"""The distributed bootstrap: join a job started by srun, torchrun, mpirun or horovodrun, or start one.

``detect()`` reads the launcher's environment (torchrun's ``RANK``/``WORLD_SIZE``, ``horovodrun
--gloo``'s ``HOROVOD_RANK``/``HOROVOD_SIZE``, Open MPI's ``OMPI_COMM_WORLD_*``, MPICH/PMI's ``PMI_*``,
Slurm's ``SLURM_PROCID``/``SLURM_NTASKS`` inside an srun step) and says where the rendezvous is.
Started plainly, the run is its own launcher (``benchmarks/spawn.py``: the N×G processes of a
virtual cluster with torchrun's variables); the device each rank takes is ``benchmarks/devices.py``'s.
Every rank then calls ``init_process_group()``: NCCL when CUDA is
there, else gloo, with a timeout after which a collective that hangs fails the run instead of
hanging it. Horovod needs no launcher of its own: where neither horovodrun nor MPI started the job,
``algorithms/horovod.py`` starts Horovod's rendezvous over that process group.
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import re
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from algorithms import accelerator
from benchmarks import recorder

logger = logging.getLogger(__name__)

# How long the ranks may wait for each other at start-up, where they may drift minutes apart (each
# lists the dataset, ImageNet's 1.28 M files, from a shared file system). Only the start-up barrier
# waits this long; every other collective, the gloo side channel's included, fails within
# ``collective_timeout_s``, so that a hang in training fails the run.
STARTUP_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Launch:
    """What the launcher told this process."""

    rank: int
    world_size: int
    launcher: str  # local | torchrun | srun | mpirun | horovodrun | virtual (a thread of the virtual cluster)
    master_addr: str
    master_port: int
    slurm_job_id: str | None = None
    # Where this process sits among the job's processes on its machine (the physical one, not a
    # virtual node): it picks the GPU and the share of the CPUs. ``detect()`` fills both.
    local_rank: int = 0
    local_size: int = 1


def virtual(rank: int, world_size: int) -> Launch:
    """A rank of the virtual cluster: a thread of this process, with no address of its own."""
    return Launch(rank, world_size, "virtual", "", 0, None, local_rank=0, local_size=1)


def detect(env: Mapping[str, str] | None = None) -> Launch | None:
    """The launch this process belongs to (read from ``env``, default ``os.environ``), or ``None``
    when it was started plainly."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, or this module's own local launcher
        rank, size, launcher = int(env["RANK"]), int(env["WORLD_SIZE"]), env.get("DPB_LAUNCHER", "torchrun")
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500))
        return Launch(rank, size, launcher, addr, port, job, *local_position(launcher, rank, size, env))
    if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:  # horovodrun --gloo (its MPI mode is mpirun)
        rank, size = int(env["HOROVOD_RANK"]), int(env["HOROVOD_SIZE"])
        addr, port = _horovodrun_rendezvous(rank)
        return Launch(rank, size, "horovodrun", addr, port, job, *local_position("horovodrun", rank, size, env))
    # MPI before Slurm: under mpirun inside an allocation the SLURM_* variables describe mpirun's
    # own daemons, not the ranks.
    for rank_key, size_key in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank_key in env and size_key in env:
            rank, size = int(env[rank_key]), int(env[size_key])
            addr, port = _mpi_rendezvous(rank)
            return Launch(rank, size, "mpirun", addr, port, job, *local_position("mpirun", rank, size, env))
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:  # inside an srun step
        rank, size = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        if env.get("MASTER_ADDR"):
            addr = env["MASTER_ADDR"]
        else:
            host = _first_slurm_host()
            addr = host + master_suffix(host, env)
        # One port per job step, so that two runs sharing a node do not collide.
        port = int(env.get("MASTER_PORT") or 20000 + (int(job or 0) * 16 + int(env["SLURM_STEP_ID"])) % 40000)
        return Launch(rank, size, "srun", addr, port, job, *local_position("srun", rank, size, env))
    return None


# Each launcher's variables for (index on this machine, processes on this machine), per physical node.
_LOCAL_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "torchrun": (("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",)),
    "horovodrun": (("HOROVOD_LOCAL_RANK",), ("HOROVOD_LOCAL_SIZE",)),
    "mpirun": (("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")),
    "srun": (("SLURM_LOCALID",), ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")),
}


def local_position(launcher: str, rank: int, world_size: int, env: Mapping[str, str]) -> tuple[int, int]:
    """``(index, count)`` of this process among the job's processes on its machine (pure).

    The GPU is ``index % GPUs`` and the CPUs are shared among ``count`` processes. The local
    launcher starts every rank on this one machine, whatever its virtual nodes, so the index is the
    global rank (its ``LOCAL_RANK`` is the rank within a virtual node: by that, two virtual nodes
    would share GPUs). The other launchers say it per physical node: torchrun's ``LOCAL_RANK``,
    Slurm's ``SLURM_LOCALID``, Open MPI's, MPICH's and Horovod's local ranks. Slurm's task counts
    may read ``4(x2)``: the first number counts (the suite places G tasks on every node). Where a
    launcher says nothing, the global rank and the world size stand in (GPUs by ``rank % GPUs``,
    right when ranks fill nodes in blocks of the GPU count).
    """
    index_keys, count_keys = _LOCAL_KEYS.get(launcher, ((), ()))
    index = next((int(env[key]) for key in index_keys if key in env), None)
    if index is None:  # the local launcher, or one that does not say
        return rank, world_size
    counts = (re.match(r"\d+", env[key]) for key in count_keys if key in env)
    return index, next((int(count.group()) for count in counts if count), world_size)


def master_suffix(host: str, env: Mapping[str, str]) -> str:
    """What to append to the first host's name so that the ranks meet over the fast network.

    ``DPB_MASTER_SUFFIX`` wins when set, even empty. Otherwise it is ``i`` on JUWELS, where a
    node's plain name (jwb0001) is its Ethernet address and the name with ``i`` (jwb0001i) its
    InfiniBand one, as JSC's PyTorch guide sets ``MASTER_ADDR``; elsewhere nothing. JUWELS is
    recognised by JSC's ``SYSTEMNAME`` (juwels, juwelsbooster) or by its compute nodes' names.
    """
    if "DPB_MASTER_SUFFIX" in env:
        return env["DPB_MASTER_SUFFIX"]
    on_juwels = env.get("SYSTEMNAME", "").startswith("juwels") or JUWELS_NODE.match(host) is not None
    return "i" if on_juwels else ""


JUWELS_NODE = re.compile(r"jw[bc]\d+(n\d+)?$")  # Booster jwb0001, Cluster jwc01n001


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list such as ``jwb[0001-0004,0009],jwc01n001`` (pure text)."""
    prefix, ranges, suffix = re.match(r"([^,\[]*)(\[[^\]]*\])?([^,\[]*)", nodelist).groups()
    first = re.split(r"[-,]", ranges[1:-1], maxsplit=1)[0] if ranges else ""
    return prefix + first + suffix


def _first_slurm_host() -> str:
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
        ).stdout.split()
        return out[0]
    except (OSError, subprocess.SubprocessError, IndexError):  # no scontrol here: read the list
        return first_host(nodelist) or "127.0.0.1"


def _mpi_rendezvous(rank: int) -> tuple[str, int]:
    """Rank 0 picks its host and a free port and broadcasts them with MPI (gloo needs a TCP store)."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    from mpi4py import MPI

    addr_port = (socket.gethostname(), free_port()) if rank == 0 else None
    return MPI.COMM_WORLD.bcast(addr_port, root=0)


def _horovodrun_rendezvous(rank: int, timeout_s: float = 120.0) -> tuple[str, int]:
    """Rank 0 picks a free port and posts it in horovodrun's key-value store; the others read it.

    ``horovodrun --gloo`` starts an HTTP rendezvous server and tells every rank its address; its
    ad-hoc scopes are free for other keys, so ``torch.distributed`` needs no variables of its own.
    """
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    url = (
        f"http://{os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']}"
        f"/dpbench_{os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']}/master"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy
    if rank == 0:
        # The name horovodrun reached this host by (-H), so every rank can resolve it.
        value = f"{os.environ.get('HOROVOD_HOSTNAME', socket.gethostname())}:{free_port()}".encode()
        request = urllib.request.Request(url, data=value, method="PUT")
        opener.open(request, timeout=30).close()
    else:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with opener.open(url, timeout=30) as response:
                    value = response.read()
                break
            except urllib.error.HTTPError as error:  # 404 until rank 0 has posted
                if error.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    addr, port = value.decode().rsplit(":", 1)
    return addr, int(port)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_process_group(launch: Launch, timeout_s: float, device: torch.device) -> str:
    """Initialise ``torch.distributed`` with the device's backend (NCCL on CUDA, gloo on the CPU, the
    virtual cluster's groups for its ranks); returns the backend name."""
    if launch.launcher == "virtual":  # a thread of benchmarks/virtual/: no rendezvous to make
        dist.init_process_group(
            backend="virtual", rank=launch.rank, world_size=launch.world_size, store=dist.HashStore()
        )
        return "virtual"
    if not accelerator.is_accelerator(device):
        backend = "gloo"
    else:  # another accelerator's (the tests' strict device) from its registration, torch >= 2.6
        backend = "nccl" if device.type == "cuda" else dist.get_default_backend_for_device(device)
    # Exported as torchrun does, for libraries with a rendezvous of their own (Horovod under srun).
    os.environ.setdefault("MASTER_ADDR", launch.master_addr)
    os.environ.setdefault("MASTER_PORT", str(launch.master_port))
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{launch.master_addr}:{launch.master_port}",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return backend


def host_names() -> list[str]:
    """Every rank's host name, by rank (a collective)."""
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts


def exit_process(code: int) -> None:
    """End this process with ``code`` once its work is done, without the interpreter's teardown.

    A rank's work ends when its entry point returns: summary written, process group destroyed. What
    the interpreter tears down after that (C++ threads of gloo, Horovod, the autograd engine,
    destroyed in no fixed order) can abort a finished run ("terminate called without an active
    exception", signal 6), which srun and Snakemake would take for a failed run. What the skipped
    exit handlers did that matters is done here: the log's flush, and MPI's finalize.

    A process that initialised MPI ends through the C library's ``exit`` (its exit handlers, not the
    interpreter's teardown): MPICH (4 and later) ends its connection to the process manager in
    such a handler. Without it, hydra's ``mpirun`` takes the first rank to end for a crashed one
    and SIGKILLs the ranks still running, which then end with signal 9: a finished job would be
    reported as failed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized():
            if not mpi.Is_finalized():  # Open MPI's mpirun wants it before the end
                mpi.Finalize()
            ctypes.PyDLL(None).exit(code)  # never returns; holds the GIL: no Python thread runs on
    except Exception as error:  # noqa: BLE001 - after the run's end: a warning, never its exit code
        print(f"warning: MPI_Finalize failed after the run ended: {error}", file=sys.stderr)
    os._exit(code)


def end_rank(rank: int) -> None:
    """Tear down a rank whose run has ended (summary written, or ``timeout`` with a checkpoint).

    The run's outcome is its files: a failure from here on (the process group's shutdown, or the
    crash that ``DPB_CRASH_AFTER_SUMMARY=RANK:raise|abort`` injects for the tests) is a warning in the
    run's log and changes neither its status nor its exit code. A rank that dies of a signal here
    cannot choose its exit code: the local launcher and the Snakefile then go by the summary.
    """
    try:
        crash = os.environ.get("DPB_CRASH_AFTER_SUMMARY", "")
        if crash.partition(":")[0] == str(rank):
            if crash.endswith(":abort"):
                os.abort()
            raise RuntimeError(f"crash injected after the summary (DPB_CRASH_AFTER_SUMMARY={crash})")
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        recorder.logger.warning(
            "rank %d: teardown failed after the run ended; the run stands: %s", rank, traceback.format_exc()
        )
