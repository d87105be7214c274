"""The workload registry: a task is data, model, loss, metric, target and default hyper-parameters.

As in AlgoPerf, a workload owns everything but the update: the algorithm sees only the model and the
optimizer, the runner owns the clock. Each task lives in its own module and is registered here by
module path, so that ``--list`` and argument checks do not import every model and dataset.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

REGISTRY: dict[str, str] = {
    "digits": "benchmarks.tasks.digits:TASK",
    "mnist1d": "benchmarks.tasks.mnist1d:TASK",
    "cifar10_resnet20": "benchmarks.tasks.cifar:CIFAR10_RESNET20",
    "cifar10_wrn16_4": "benchmarks.tasks.cifar:CIFAR10_WRN16_4",
    "cifar10_wrn16_8": "benchmarks.tasks.cifar:CIFAR10_WRN16_8",
    "cifar10_squeezenet": "benchmarks.tasks.cifar:CIFAR10_SQUEEZENET",
    "cifar100_resnet20": "benchmarks.tasks.cifar:CIFAR100_RESNET20",
    "cifar100_wrn16_8": "benchmarks.tasks.cifar:CIFAR100_WRN16_8",
    "cifar100_squeezenet": "benchmarks.tasks.cifar:CIFAR100_SQUEEZENET",
    "imagenet_resnet50": "benchmarks.tasks.imagenet:TASK",
}

# Hyper-parameters every task defines; ``--set`` reaches each of them, type-checked against these.
HPARAM_KEYS = (
    "batch_size",  # per worker
    "lr",  # peak learning rate for the whole job (already scaled to the global batch)
    "momentum",
    "nesterov",
    "weight_decay",
    "epochs",
    "schedule",  # "constant" | "cosine" | "step"
    "warmup_epochs",  # linear warm-up from lr / world_size
    "milestones",  # epochs at which "step" multiplies the lr by ``gamma``
    "gamma",
    "eval_every",  # epochs between evaluations
)


@dataclass(frozen=True)
class Task:
    """One workload.

    Args:
        name: registry name.
        description: one line for ``--list``.
        make_datasets: ``(data_root) -> (train, val)``; each item is ``(input, label)``. Datasets are
            built identically on every rank; the runner shards the training set.
        make_model: builds the model (the runner seeds torch first, so every rank builds the same).
        target: validation metric that counts as reaching the target (time to target stops there).
        hparams: defaults for every key of ``HPARAM_KEYS``.
        metric: name of the validation metric (top-1 accuracy for classification).
        data_hint: for tasks that read a data root, what the root must hold; empty for embedded tasks.
        check_data: ``(data_root) -> None``, raises ``DataRootError`` naming the fix when the data is
            missing; called before any process is launched.
        loss: the training loss.
    """

    name: str
    description: str
    make_datasets: Callable[[Path | None], tuple[Dataset, Dataset]]
    make_model: Callable[[], nn.Module]
    target: float
    hparams: dict[str, object]
    metric: str = "accuracy"
    data_hint: str = ""
    check_data: Callable[[Path | None], None] | None = None
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default=nn.functional.cross_entropy
    )

    def __post_init__(self) -> None:
        missing = set(HPARAM_KEYS) - set(self.hparams)
        extra = set(self.hparams) - set(HPARAM_KEYS)
        if missing or extra:
            raise ValueError(f"Task {self.name!r}: hparams missing {sorted(missing)}, unknown {sorted(extra)}.")

    @property
    def embedded(self) -> bool:
        """True when the task needs no data root (its data ships with a package)."""
        return not self.data_hint


class DataRootError(ValueError):
    """A task's data is missing or malformed; the message says which setting to change."""


def require_data_root(task_name: str, data_root: Path | None, must_hold: str) -> Path:
    """Return ``data_root / must_hold`` or raise a ``DataRootError`` naming ``--set data_root``."""
    if data_root is None:
        raise DataRootError(
            f"task {task_name!r} reads its data from disk: pass --set data_root=DIR, "
            f"where DIR holds {must_hold}"
        )
    path = Path(data_root) / must_hold
    if not path.exists():
        raise DataRootError(
            f"task {task_name!r}: {path} does not exist; --set data_root=DIR must point at a "
            f"folder holding {must_hold}"
        )
    return path


def names() -> list[str]:
    return sorted(REGISTRY)


def get(name: str) -> Task:
    """Load a task by registry name; an unknown name lists the valid ones."""
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown task {name!r}.{hint} Valid tasks: {', '.join(names())}.")
    module_name, attr = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), attr)
