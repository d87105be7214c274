"""A warm start for a workflow's runs: one process imports torch once, then forks every run.

A run's own work on the embedded task is 1-2 s; starting it cost more: ``import torch`` and the
``torch._dynamo`` that the first optimizer imports are 2.7 CPU-seconds on an idle 2-core machine, and
5 on a busy one, paid again by each of a workflow's hundred runs. Here the Snakefile starts one
server when the workflow starts (``onstart``), which imports them once; each run job then calls the
client, a plain Python with no torch, which hands the server its arguments, environment, working
directory and standard streams, and waits. The server forks; the child is the run's process, as
``python -m benchmarks.run`` would have been (the same ``main``, files, log and exit code), and the
local launcher inside it forks the ranks as it does anyway. Forking after the import is what the
local launcher already does for its ranks: the server runs no torch operation, so no thread pool
or lock is inherited in use.

    python -m benchmarks.forkserver serve SOCKET        # the server (the Snakefile starts it)
    python -m benchmarks.forkserver run SOCKET ARGS...   # one run: python -m benchmarks.run ARGS...

Without a server (none started, or it is gone), the client becomes ``python -m benchmarks.run
ARGS...`` itself, so a job never depends on it. Signals to the client (Snakemake stopping a job, a
time limit) go to the run; a client that dies takes its run down with SIGTERM, which checkpoints.
Only runs started on this machine use it: a Slurm job's runs start with srun on their own nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)  # stop, interrupt, Slurm's time-limit warning
MAX_REQUEST = 1 << 20  # bytes: the arguments and the environment


def serve(path: str) -> None:
    """Bind ``path``, import the runner, then fork a run for every connection, until killed.

    The socket is bound before the imports, so that a run asked for while they are under way waits
    for them in the listen queue instead of paying them a second time beside them.
    """
    _die_with_parent()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    Path(path).unlink(missing_ok=True)  # a socket left by a server that was killed
    server.bind(path)
    server.listen(64)
    import torch._dynamo  # noqa: F401, PLC0415 - what the first optimizer of every run imports

    from benchmarks import run  # noqa: F401, PLC0415 - the runner and its imports, without running anything

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the finished runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            conn, _ = server.accept()
            if os.fork() == 0:
                server.close()
                _run_child(conn)  # never returns
            conn.close()
    finally:
        os.unlink(path)


def _run_child(conn: socket.socket) -> None:
    """In the forked child: become the run the client asked for, and send its exit code back."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the local launcher waits for its ranks
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        payload, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        request = json.loads(payload)
        for target, fd in enumerate(fds):  # the client's stdin, stdout and stderr: the job's log
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [sys.argv[0], *request["argv"]]
        conn.send(json.dumps({"pid": os.getpid()}).encode())
        threading.Thread(target=_stop_when_client_goes, args=(conn,), daemon=True).start()

        from benchmarks import run  # noqa: PLC0415 - imported already, in the server

        code = run.main(request["argv"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - a run that crashes must not return into the server's loop
        import traceback  # noqa: PLC0415

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(json.dumps({"code": code}).encode())
        finally:
            os._exit(code)


def _stop_when_client_goes(conn: socket.socket) -> None:
    """The client sends nothing more: an empty read means it has died, and its run must stop (SIGTERM
    checkpoints, as a time limit does)."""
    try:
        conn.recv(1)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def run_client(path: str, argv: list[str]) -> int:
    """Have the server at ``path`` run ``python -m benchmarks.run ARGV``; without one, run it here."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        client.connect(path)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(client, [json.dumps(request).encode()], [0, 1, 2])
        reply = client.recv(MAX_REQUEST)
    except OSError:  # no server, or it died before forking the run
        reply = b""
    if not reply:  # run it here, as the plain command
        client.close()
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.run", *argv])
    pid = json.loads(reply)["pid"]

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):  # the run has just ended: its code is on its way
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    reply = client.recv(MAX_REQUEST)
    if not reply:  # the run's process died without a word (a signal): its summary says how it ended
        print(f"error: the run's process {pid} ended without an exit code", file=sys.stderr)
        return 1
    return json.loads(reply)["code"]


def _die_with_parent() -> None:
    """Ask Linux to end the server when the process that started it (Snakemake) ends."""
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # no glibc: the Snakefile's onsuccess/onerror still stops it
        return


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        return run_client(argv[1], argv[2:])
    print(__doc__.split("\n\n")[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
