"""An on-disk cache of the embedded tasks' arrays, so ranks do not rebuild (or re-import) them.

Building MNIST-1D takes seconds and importing scikit-learn for the digits over a second per
process; with four ranks per run and dozens of runs per workflow that dominates a short run. The
cache lives in ``$XDG_CACHE_HOME/dp-bench`` (``~/.cache/dp-bench``) and is written atomically, so
ranks that race to build it each write their own file and one of them wins.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "dp-bench"


def cached_arrays(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays saved as ``name``.npz, built by ``build()`` the first time."""
    path = cache_dir() / f"{name}.npz"
    if path.exists():
        with np.load(path) as cached:
            return dict(cached)
    arrays = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return arrays
