"""The local launcher: started plainly, a run starts the N×G ranks of its virtual cluster here.

``spawn_local()`` forks the ranks with torchrun's variables (``rank_environment``), watches them,
and takes the whole job down as soon as one rank fails, so no process is left behind; a time-limit
signal is forwarded, and the ranks checkpoint. ``run_locally()`` wraps it for one run: the emulated
network of ``link_mbit`` around it, and a summary that says how the run ended even where its ranks
died before writing one. Each rank then joins the job as any launcher's would (``launcher.detect``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import EXIT_TIMEOUT, naming, netns, recorder, rundir
from benchmarks.checkpoint import STOP_SIGNALS
from benchmarks.launcher import exit_process, free_port


class _ForkedRank:
    """One rank forked from the launcher, which has already imported torch and the suite.

    Forking instead of starting ``python -m benchmarks.run`` per rank saves each rank the imports of
    torch and the suite, which on a small machine cost more than a small run's training. The launcher has run no
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
    # The first optimizer a rank makes imports torch._dynamo (hundreds of modules): once here, before
    # the fork, instead of once in every rank at the same time, where the ranks would contend for the
    # cores at the start of a small run. The import starts no thread.
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
    before = _stamp(cfg.out / naming.SUMMARY)
    made = (
        netns.for_run(cfg.nodes, cfg.settings.link_mbit, cfg.settings.link_queue_ms)
        if network is None
        else contextlib.nullcontext(network)
    )
    with made as network:
        code, reason = spawn_local(entry, argv, cfg.nodes, cfg.procs_per_node, cfg.settings.threads, network)
    summary = rundir.read_summary(cfg.out)
    ended = summary is not None and summary.get("status") != "failed" and _stamp(cfg.out / naming.SUMMARY) != before
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
