"""One workflow controller per directory, and a restart that continues where a killed one stopped.

A snakemake process killed outright (SIGKILL, a closed login shell, an out-of-memory kill) leaves its
lock in ``.snakemake/locks`` and marks the runs it had started as incomplete, while those runs go on
and finish without it. Snakemake would then refuse to start until unlocked, and with
``--rerun-incomplete`` delete and train again runs that had finished. A run's own files say better
what happened to it: ``summary.json`` is written last and atomically, so a run that has one is
finished (or stopped at a time limit, resumable from its checkpoint), and one without it resumes
from its checkpoint or starts again.

The Snakefile calls ``take_over`` while it is read, before snakemake looks at its locks:

- it holds ``.snakemake/controller.lock`` (an ``flock``, dropped by the OS when its process ends,
  however it ends) for the life of the controller; a second controller on the same directory
  finds it held and stops with a line that says so, before writing anything;
- holding it, any snakemake lock left in ``.snakemake/locks`` is stale (its owner is gone): cleared,
  with a line;
- an incomplete mark on a run's ``summary.json`` that exists is cleared: the run finished after its
  controller died, and its record decides. Other rules' outputs (tables, figures, the report) keep
  their marks and are made again.

The marks are Snakemake's file persistence (``.snakemake/incomplete/``, one file per output, named
by the urlsafe base64 of its path, split in ``@``-prefixed folders where long); the workflow's tests
kill a controller and restart it, which catches a change of that format.
"""

from __future__ import annotations

import base64
import fcntl
import os
import socket
import sys
from pathlib import Path
from typing import IO

from benchmarks import naming

LOCK = "controller.lock"


def _is_dry_run(argv: list[str]) -> bool:
    for arg in argv:
        if arg in ("-n", "--dry-run", "--dryrun", "--dry_run"):
            return True
        if arg.startswith("-") and not arg.startswith("--") and "n" in arg[1:] and arg[1:].isalpha():
            return True  # -np and the like
    return False


def _incomplete_outputs(incomplete: Path) -> dict[Path, str]:
    """The outputs snakemake marked incomplete under ``incomplete``: mark file -> output path."""
    marks = {}
    for mark in incomplete.rglob("*"):
        if mark.is_dir() or mark.name == "migration_underway":
            continue
        parts = [p.removeprefix("@") for p in mark.relative_to(incomplete).parts]
        try:
            marks[mark] = base64.urlsafe_b64decode("".join(parts)).decode()
        except (ValueError, UnicodeDecodeError):
            continue  # not a mark of this format: left alone
    return marks


def take_over(root: Path, argv: list[str], runs_under: str = "results/runs") -> IO[str] | None:
    """Become the directory's controller (see the module's docstring). Returns the held lock's file,
    to keep open for the controller's life, or None for a dry run (which takes nothing over)."""
    state = Path(root) / ".snakemake"
    dry = _is_dry_run(argv)
    if dry:
        return None
    state.mkdir(parents=True, exist_ok=True)
    handle = open(state / LOCK, "a+")  # noqa: SIM115 - held open for the controller's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        sys.exit(
            f"error: another snakemake is running this workflow in {Path(root).resolve()} ({holder}); "
            "wait for it to end or stop it, then run the same command again"
        )
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    stale = sorted((state / "locks").glob("*.lock")) if (state / "locks").is_dir() else []
    for lock in stale:
        lock.unlink(missing_ok=True)
    if stale:
        print("cleared the lock of a snakemake that no longer runs here (killed or crashed)", file=sys.stderr)
    kept = 0
    for mark, output in _incomplete_outputs(state / "incomplete").items():
        path = Path(root) / output if not os.path.isabs(output) else Path(output)
        inside = Path(root).resolve() / runs_under
        if path.name == naming.SUMMARY and path.is_file() and path.resolve().is_relative_to(inside):
            mark.unlink(missing_ok=True)
            kept += 1
    if kept:
        print(f"runs that finished after their controller stopped, kept as they are: {kept}", file=sys.stderr)
    return handle
