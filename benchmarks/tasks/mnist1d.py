"""MNIST-1D (Greydanus 2020): the harder embedded task, for throughput and time-to-accuracy studies.

The ``mnist1d`` package generates the benchmark offline from its ten 1-D digit templates (4,000 train
/ 1,000 test signals of length 40), so no download happens at run time. It separates models and
optimisers far better than MNIST while a step still takes milliseconds; the model here is a
1-D CNN with about 0.2 M parameters so that a step's communication is a visible share of its time.
Generation takes a few seconds, so the arrays are cached (``benchmarks.tasks.cache``).

``mnist1d_large`` is the same benchmark drawn five times larger (20,000 / 5,000 signals, the
package's own generator with ``num_samples=25000``): the virtual cluster's runs at the papers'
worker counts need an epoch of at least 10 steps at 256 workers (batch 4: 19 steps), which 4,000
training signals cannot give.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.tasks import Task
from benchmarks.tasks.cache import cached_arrays


def _build(samples: int | None = None) -> dict[str, np.ndarray]:
    import mnist1d.data

    args = mnist1d.data.get_dataset_args()  # the paper's default args (5,000 samples, 80 % to train)
    if samples is not None:
        args.num_samples = samples
    data = mnist1d.data.make_dataset(args)
    return {k: np.asarray(data[k]) for k in ("x", "y", "x_test", "y_test")}


def make_datasets(data_root: Path | None = None) -> tuple[TensorDataset, TensorDataset]:
    return _datasets(cached_arrays("mnist1d-default-v1", _build))


def make_large_datasets(data_root: Path | None = None) -> tuple[TensorDataset, TensorDataset]:
    return _datasets(cached_arrays("mnist1d-25000-v1", lambda: _build(25_000)))


def _datasets(a: dict[str, np.ndarray]) -> tuple[TensorDataset, TensorDataset]:
    x, x_test = (torch.tensor(a[k], dtype=torch.float32).unsqueeze(1) for k in ("x", "x_test"))
    mean, std = x.mean(), x.std()  # statistics of the training split only
    train = TensorDataset((x - mean) / std, torch.tensor(a["y"], dtype=torch.long))
    val = TensorDataset((x_test - mean) / std, torch.tensor(a["y_test"], dtype=torch.long))
    return train, val


def make_model() -> nn.Module:
    """Three 1-D convolutions (64 channels) and a two-layer head, no batch norm."""
    return nn.Sequential(
        nn.Conv1d(1, 64, 5, padding=2),
        nn.ReLU(),
        nn.Conv1d(64, 64, 3, padding=1, stride=2),
        nn.ReLU(),  # 40 -> 20
        nn.Conv1d(64, 64, 3, padding=1, stride=2),
        nn.ReLU(),  # 20 -> 10
        nn.Flatten(),
        nn.Linear(64 * 10, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


TASK = Task(
    name="mnist1d",
    description="MNIST-1D generated offline (4,000 train / 1,000 test), 1-D CNN 0.2M params; harder",
    make_datasets=make_datasets,
    make_model=make_model,
    target=0.88,
    hparams={
        "batch_size": 32,
        "lr": 0.1,
        "nesterov": False,
        "weight_decay": 1e-4,
        "epochs": 20,
        "schedule": "cosine",
        "warmup_epochs": 1,
        "milestones": [],
        "gamma": 0.1,
    },
)

LARGE_TASK = dataclasses.replace(
    TASK,
    name="mnist1d_large",
    description="MNIST-1D drawn 5x larger (20,000 train / 5,000 test), the same 1-D CNN; the virtual cluster's scale runs",
    make_datasets=make_large_datasets,
)
