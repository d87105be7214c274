"""The distributed bootstrap: join a job started by srun, torchrun, mpirun or horovodrun, or start one.

``detect()`` reads the launcher's environment (torchrun's ``RANK``/``WORLD_SIZE``, ``horovodrun
--gloo``'s ``HOROVOD_RANK``/``HOROVOD_SIZE``, Open MPI's ``OMPI_COMM_WORLD_*``, MPICH/PMI's ``PMI_*``,
Slurm's ``SLURM_PROCID``/``SLURM_NTASKS`` inside an srun step) and says where the rendezvous is.
Started plainly, ``spawn_local()`` is the launcher: it starts the N×G processes of a virtual cluster
with torchrun's variables, watches them, and takes the whole job down as soon as one rank fails, so
no process is left behind. Every rank then calls ``init_process_group()``: NCCL when CUDA is
there, else gloo, with a timeout after which a collective that hangs fails the run instead of
hanging it. Horovod needs no launcher of its own: where neither horovodrun nor MPI started the job,
``algorithms/horovod.py`` starts Horovod's rendezvous over that process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from algorithms import accelerator
from benchmarks import EXIT_TIMEOUT, netns, recorder, rundir
from benchmarks.checkpoint import STOP_SIGNALS

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


def pick_device(setting: str, local_rank: int) -> torch.device:
    """``auto`` picks CUDA when present, else the CPU; ``cuda`` (or another accelerator's name) asks
    for it. ``local_rank`` is ``Launch.local_rank``, the process's index on its machine: one GPU each
    while there are enough."""
    kind = "cuda" if setting == "auto" and torch.cuda.is_available() else setting
    if kind in ("auto", "cpu"):
        return torch.device("cpu")
    module = torch.get_device_module(kind)
    if not module.is_available():
        raise RuntimeError(f"--set device={kind}, but {kind} is not available here; use device=cpu")
    device = torch.device(kind, local_rank % module.device_count())
    accelerator.set_device(device)
    return device


def host_names() -> list[str]:
    """Every rank's host name, by rank (a collective)."""
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts


class _ForkedRank:
    """One rank forked from the launcher, which has already imported torch and the suite.

    Forking instead of starting ``python -m benchmarks.run`` per rank saves each rank the imports
    (about 2.5 CPU-seconds, most of a small run's cost on a 2-core machine). The launcher has run no
    torch operation, so no thread pool or lock is inherited in use; the child calls ``entry(argv)``
    in the torchrun-style environment, and never returns. Given a network namespace (its virtual
    node's, ``benchmarks/netns.py``), the child enters it first, before it opens any socket.
    The interface is ``subprocess.Popen``'s, as far as the launcher uses it.
    """

    def __init__(
        self, entry: Callable[[list[str]], int], argv: list[str], env: dict[str, str], namespace: str | None = None
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid, self.returncode = os.fork(), None
        if self.pid == 0:
            code = 1
            try:
                _die_with_parent()
                if namespace is not None:
                    netns.enter(namespace)
                os.environ.clear()
                os.environ.update(env)
                code = entry(argv)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:  # noqa: BLE001 - a rank that crashes must not return into the launcher
                traceback.print_exc()
            finally:
                exit_process(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def exit_process(code: int) -> None:
    """End this process with ``code`` once its work is done, without the interpreter's teardown.

    A rank's work ends when its entry point returns: summary written, process group destroyed. What
    the interpreter tears down after that (C++ threads of gloo, Horovod, the autograd engine,
    destroyed in no fixed order) has aborted finished runs now and then ("terminate called without
    an active exception", signal 6), which srun and Snakemake take for a failed run. What the
    skipped exit handlers did that matters is done here: the log's flush, and MPI's finalize.

    A process that initialised MPI ends through the C library's ``exit`` (its exit handlers, not the
    interpreter's teardown): MPICH (4 and later) ends its connection to the process manager in
    such a handler. Without it, hydra's ``mpirun`` takes the first rank to end for a crashed one
    and SIGKILLs the ranks still running, which then end with signal 9: a finished Horovod job
    failed so in 1 of 103 runs, and hydra killed the ranks at the end of every run.
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


def _die_with_parent() -> None:
    """In a child: ask Linux to SIGKILL us when the launcher dies, so no rank outlives it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # no glibc (not Linux): the launcher's own SIGTERM/SIGKILL still ends the ranks
        return


def spawn_local(
    entry: Callable[[list[str]], int],
    argv: list[str],
    nodes: int,
    procs_per_node: int,
    threads: int,
    network: netns.Network | None = None,
) -> tuple[int, str | None]:
    """Run ``entry(argv)`` (the runner's ``main``) as N×G local ranks; return (exit code, failure reason).

    The first rank to exit non-zero takes the job down: the others get SIGTERM, then SIGKILL after
    5 s. SIGINT to the launcher does the same. SIGTERM or SIGUSR1 (a time limit) is forwarded to the
    ranks, which checkpoint and exit with ``EXIT_TIMEOUT``; the launcher then returns it too (also
    when a rank was still starting and died of the signal: no checkpoint, the next run starts afresh).

    With an emulated ``network`` (``netns.emulated(nodes, rate_mbit)``), node i's ranks run in its
    namespace and share its shaped link; the rendezvous is at node 0's address.
    """
    if network is not None and network.nodes != nodes:
        raise ValueError(f"an emulated network of {network.nodes} nodes for a run of {nodes}")
    world = nodes * procs_per_node
    if threads <= 0:
        threads = max(1, len(os.sched_getaffinity(0)) // procs_per_node)
    # The first optimizer a rank makes imports torch._dynamo (800 modules, 1.5 CPU-s): once here,
    # before the fork, instead of once in every rank at the same time (5-7 s of a small run's start
    # on 2 cores). The import starts no thread.
    import torch._dynamo  # noqa: F401, PLC0415

    port = free_port()
    procs: list[subprocess.Popen] = []
    for rank in range(world):
        env = dict(os.environ, **rank_environment(rank, nodes, procs_per_node, port, threads, network))
        namespace = None if network is None else network.namespaces[rank // procs_per_node]
        procs.append(_ForkedRank(entry, argv, env, namespace))

    stop = {"signal": None}

    def forward(signum, _frame):
        stop["signal"] = signum

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, *STOP_SIGNALS)}
    reason, stopping = None, False
    try:
        while True:
            if stop["signal"] in STOP_SIGNALS:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(stop["signal"])
                stop["signal"], stopping = None, True
            codes = [p.poll() for p in procs]
            stopped = {EXIT_TIMEOUT} | ({-s for s in STOP_SIGNALS} if stopping else set())
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0, *stopped)]
            if stop["signal"] is not None:
                reason = f"launcher received {signal.Signals(stop['signal']).name}"
            elif failed:
                rank, code = min(failed, key=lambda rc: (rc[1] > 0, rc[0]))  # a killed rank is the cause
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                reason = f"rank {rank} ended with {how}"
            if reason or None not in codes:
                break
            time.sleep(0.1)
    finally:
        _terminate(procs)
        for s, handler in old.items():
            signal.signal(s, handler)
    if reason:
        return 1, reason
    return (EXIT_TIMEOUT if any(codes) else 0), None


def run_locally(entry: Callable[[list[str]], int], argv: list[str], cfg, network: netns.Network | None = None) -> int:
    """Be the launcher of ``cfg``'s virtual cluster (``spawn_local``), and leave its summary right.

    A run whose ranks died before rank 0 wrote a summary gets a ``failed`` one with the launcher's
    reason (rank 0 may have seen only its consequence, a closed connection: the cause is added), and
    one stopped at start-up by a time limit a ``timeout`` one, so that every ended run says how.
    ``network`` is an emulated network for the ranks (``spawn_local``); by default the run's
    ``link_mbit`` setting makes one for the run's life (none at 0).
    """
    cfg.out.mkdir(parents=True, exist_ok=True)
    before = _stamp(cfg.out / "summary.json")
    made = (
        netns.for_run(cfg.nodes, cfg.settings.link_mbit, cfg.settings.link_queue_ms)
        if network is None
        else contextlib.nullcontext(network)
    )
    with made as network:
        code, reason = spawn_local(entry, argv, cfg.nodes, cfg.procs_per_node, cfg.settings.threads, network)
    summary = rundir.read_summary(cfg.out)
    ended = summary is not None and summary.get("status") != "failed" and _stamp(cfg.out / "summary.json") != before
    if reason and ended:  # every rank was past its last collective: a crash in teardown, not the run's
        recorder.setup_logging(cfg.out / "log.txt")
        recorder.logger.warning(
            "%s after the run's summary was written; the run stands (%s)", reason, summary["status"]
        )
        return EXIT_TIMEOUT if summary["status"] == "timeout" else 0
    if reason and summary is None:
        rundir.write_summary(cfg, "failed", error=reason)
    elif reason and summary.get("status") == "failed" and reason not in str(summary.get("error")):
        summary["error"] = f"{reason}; rank 0 then reported: {summary.get('error')}"
        rundir.put_summary(cfg.out, summary)
    if code == EXIT_TIMEOUT and rundir.read_summary(cfg.out) is None:  # stopped before training
        rundir.write_summary(cfg, "timeout", error="stopped at start-up")
    if reason:
        print(f"error: run failed: {reason}", file=sys.stderr)
    return code


def _stamp(path: Path) -> int | None:
    """When ``path`` was last written (ns), or None: tells this launch's summary from an earlier one's."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def rank_environment(
    rank: int, nodes: int, procs_per_node: int, port: int, threads: int, network: netns.Network | None = None
) -> dict[str, str]:
    """The variables the local launcher gives ``rank``: torchrun's, with the virtual node as the node.

    On an emulated network the rendezvous is node 0's address, and gloo takes the node's adapter
    (``GLOO_SOCKET_IFNAME``): by default it takes the host name's address, which is not in the
    node's namespace, or else loopback, which other nodes cannot reach.
    """
    if network is not None:
        return dict(
            rank_environment(rank, nodes, procs_per_node, port, threads),
            MASTER_ADDR=network.addresses[0],
            GLOO_SOCKET_IFNAME=network.interface,
        )
    return dict(
        RANK=str(rank),
        WORLD_SIZE=str(nodes * procs_per_node),
        LOCAL_RANK=str(rank % procs_per_node),
        LOCAL_WORLD_SIZE=str(procs_per_node),
        GROUP_RANK=str(rank // procs_per_node),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DPB_LAUNCHER="local",
        OMP_NUM_THREADS=str(threads),
    )


def _terminate(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
