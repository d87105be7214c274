"""Shared fixtures, and the ``slow`` mark on every test that starts processes.

``pytest -m "not slow"`` runs the quick subset (update rules on tiny tensors, configuration, the
analysis on hand-made runs: about a minute); the full suite adds the multi-process tests (ranks,
runs, launchers, workflows). A test is slow when it, a fixture of its module that it uses, or a
function of its module that either calls, starts processes: ``run_on``, ``train_digits``,
``stop_after_first_epoch``, ``subprocess`` (and the ``run_benchmark`` fixture), a
``multiprocessing`` process or ``mp.spawn``. Marking by
reading the test keeps a new multi-process test from slipping into the quick subset unmarked.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STARTS_PROCESSES = ("run_on", "train_digits", "stop_after_first_epoch", "subprocess", "Process", "spawn")


def _called_names(function: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            target = node.func
            names.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                names.add(target.value.id)  # subprocess.run -> "subprocess"
    return names


def _starts_processes(module: ast.Module, name: str) -> bool:
    """Whether function ``name`` of ``module``, or a module function it calls, starts processes."""
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    seen, pending = set(), [name]  # a depth-first walk of the module's call graph
    while pending:
        current = pending.pop()
        if current in seen or current not in functions:
            continue
        seen.add(current)
        called = _called_names(functions[current])
        if called & set(STARTS_PROCESSES):
            return True
        pending.extend(called)
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    trees: dict[str, ast.Module] = {}
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("slow"):
            continue
        path = str(item.path)
        if path not in trees:
            trees[path] = ast.parse(inspect.getsource(item.module))
        # the test itself, or a fixture of its module that it uses (``suite``, ``seconds``)
        names = [item.originalname, *item.fixturenames]
        if "run_benchmark" in item.fixturenames or any(_starts_processes(trees[path], n) for n in names):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def repo_root() -> Path:
    """The repository's root: the working directory of every command a test runs."""
    return ROOT


def _serve(path: Path, preload: str = ""):
    """A forkserver (``benchmarks/forkserver.py``) at ``path``, with module ``preload`` imported first."""
    code = f"import {preload}; " if preload else ""
    code += f"from benchmarks import forkserver; forkserver.serve({str(path)!r})"
    server = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    # A client that finds no socket runs without the server, which a preloaded module must not allow:
    # wait for the bind (the runner's own imports come after it: early clients wait in the queue).
    deadline = time.monotonic() + 120
    while not path.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"the forkserver did not start (exit {server.poll()})"
    yield path
    server.terminate()
    server.wait(timeout=60)


@pytest.fixture(scope="session")
def forkserver(tmp_path_factory: pytest.TempPathFactory):
    """The path of a forkserver for the session's runs: each then starts without paying torch's
    imports again, as the workflow's runs do. Its own tests start their own."""
    yield from _serve(tmp_path_factory.mktemp("forkserver") / "runs.sock")


@pytest.fixture(scope="session")
def strict_forkserver(tmp_path_factory: pytest.TempPathFactory):
    """A forkserver whose runs have the strict device registered (``tests/strict_run.py``'s runs)."""
    yield from _serve(tmp_path_factory.mktemp("forkserver") / "strict.sock", preload="tests.strict_device")


@pytest.fixture
def run_command(forkserver: Path) -> list[str]:
    """What stands for ``python -m benchmarks.run`` in a test's command line: the same run, started by
    the session's forkserver (SIGTERM to it reaches the run; its exit code is the run's)."""
    return [sys.executable, "-m", "benchmarks.forkserver", "run", str(forkserver)]


@pytest.fixture
def run_benchmark(repo_root: Path, run_command: list[str]):
    """``run_benchmark(*args, timeout=...)``: ``python -m benchmarks.run ARGS`` from the repository
    root (started by the session's forkserver), its output captured; returns the ``CompletedProcess``
    (check ``returncode`` yourself)."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        command = [*run_command, *map(str, args)]
        return subprocess.run(command, cwd=repo_root, capture_output=True, text=True, timeout=timeout, check=False)

    return run
