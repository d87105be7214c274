"""Handwritten digits (scikit-learn's bundled 8×8 UCI digits): the task that converges in seconds.

1,797 real scans of handwritten digits ship inside scikit-learn, so this task runs anywhere with no
download. A small CNN passes 95 % validation accuracy within a few epochs of milliseconds each,
so a run measures mostly start-up and per-step communication: the smoke test of every algorithm.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.tasks import Task
from benchmarks.tasks.cache import cached_arrays

VAL_FRACTION = 0.2
SPLIT_SEED = 0  # the split is fixed across runs so every run is scored on the same images


def _build() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return {"images": digits.images, "target": digits.target}


def make_datasets(data_root: Path | None = None) -> tuple[TensorDataset, TensorDataset]:
    a = cached_arrays("digits-v1", _build)
    x = torch.tensor(a["images"], dtype=torch.float32).unsqueeze(1) / 16.0  # pixel range 0..16
    x = (x - 0.5) / 0.5
    y = torch.tensor(a["target"], dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_val = int(len(y) * VAL_FRACTION)
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def make_model() -> nn.Module:
    """Two 3×3 convolutions and a linear head (about 44k parameters), no batch norm."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8×8 -> 4×4
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 24),
        nn.ReLU(),
        nn.Linear(24, 10),
    )


TASK = Task(
    name="digits",
    description="scikit-learn handwritten digits 8x8 (1,438 train / 359 val), small CNN; seconds to target",
    make_datasets=make_datasets,
    make_model=make_model,
    target=0.95,
    hparams={
        "batch_size": 16,
        "lr": 0.05,
        "nesterov": False,
        "weight_decay": 0.0,
        "epochs": 10,
        "schedule": "cosine",
        "warmup_epochs": 0,
        "milestones": [],
        "gamma": 0.1,
    },
)
