"""The workload registry: a task is data, model, loss, metric, target and default hyper-parameters.

As in AlgoPerf, a workload owns everything but the update: the algorithm sees only the model and the
optimizer, the runner owns the clock. Each task lives in its own module and is registered here by
module path, so that ``--list`` and argument checks do not import every model and dataset.
"""

from __future__ import annotations

import difflib
import importlib
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from algorithms import accelerator

REGISTRY: dict[str, str] = {
    "digits": "benchmarks.tasks.digits:TASK",
    "mnist1d": "benchmarks.tasks.mnist1d:TASK",
    "mnist1d_large": "benchmarks.tasks.mnist1d:LARGE_TASK",
    "cifar10_resnet20": "benchmarks.tasks.cifar:CIFAR10_RESNET20",
    "cifar10_wrn16_4": "benchmarks.tasks.cifar:CIFAR10_WRN16_4",
    "cifar10_wrn16_8": "benchmarks.tasks.cifar:CIFAR10_WRN16_8",
    "cifar10_squeezenet": "benchmarks.tasks.cifar:CIFAR10_SQUEEZENET",
    "cifar100_resnet20": "benchmarks.tasks.cifar:CIFAR100_RESNET20",
    "cifar100_wrn16_4": "benchmarks.tasks.cifar:CIFAR100_WRN16_4",
    "cifar100_wrn16_8": "benchmarks.tasks.cifar:CIFAR100_WRN16_8",
    "cifar100_squeezenet": "benchmarks.tasks.cifar:CIFAR100_SQUEEZENET",
    "imagenet_resnet50": "benchmarks.tasks.imagenet:TASK",
    "cityscapes_deeplabv3": "benchmarks.tasks.cityscapes:TASK",
    "wmt17_transformer": "benchmarks.tasks.wmt17:TASK",
    "navigation_ddppo": "benchmarks.tasks.navigation:TASK",
}

# Hyper-parameters every task defines; ``--set`` reaches each of them, type-checked against these.
HPARAM_KEYS = (
    "optimizer",  # "sgd" (momentum, nesterov, weight_decay) | "adam" | "adamw" (betas, eps, weight_decay)
    "batch_size",  # per worker
    "lr",  # peak learning rate for the whole job (already scaled to the global batch)
    "momentum",
    "nesterov",
    "weight_decay",
    "betas",  # Adam's (beta1, beta2)
    "eps",  # Adam's epsilon
    "epochs",
    "schedule",  # "constant" | "cosine" | "step" | "plateau" | "inverse_sqrt" (benchmarks/schedule.py)
    "warmup_epochs",  # linear warm-up from lr / world_size
    "milestones",  # epochs at which "step" multiplies the lr by ``gamma``
    "gamma",  # the factor of "step" and "plateau"
    "plateau_patience",  # "plateau": bad epochs tolerated; the lr drops on the next one
    "plateau_threshold",  # "plateau": relative improvement of the best loss that counts
    "min_lr",  # "plateau": the lr never drops below it
    "eval_every",  # epochs between evaluations
    "evals_per_epoch",  # evaluations within each epoch, the last at its end (benchmarks/parts.py)
)
# Keys a task need not give, with the value it gets: SGD (Adam's keys keep PyTorch's defaults), and
# the plateau schedule's settings of the DASO papers' ImageNet runs (patience 5: "stable for 5 epochs",
# arXiv v1 Sec. 4.1 / J. Big Data Table 1; threshold and min_lr: Heat's examples/nn/imagenet-DASO.py).
HPARAM_DEFAULTS = {
    "optimizer": "sgd",
    "momentum": 0.9,
    "eval_every": 1,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "plateau_patience": 5,
    "plateau_threshold": 0.05,
    "min_lr": 1e-4,
    "evals_per_epoch": 1,
}


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
        hparams: defaults for every key of ``HPARAM_KEYS`` (those of ``HPARAM_DEFAULTS`` may be left out).
        metric: name of the validation metric (top-1 accuracy for classification).
        data_hint: for tasks that read a data root, what the root must hold; empty for embedded tasks.
        check_data: ``(data_root) -> None``, raises ``DataRootError`` naming the fix when the data is
            missing; called before any process is launched.
        loss: the training loss, ``loss(model(x), y)``; ``x`` and ``y`` may be tensors or tuples of them.
        evaluate: ``(model, loader, device) -> (val_loss, val_metric)`` over this rank's slice of the
            validation set, reduced across the job inside (every rank gets the job-wide numbers).
            Default: cross-entropy and top-1 accuracy.
        make_loader: ``(train_set, sampler, batch_size, model, device) -> batches`` with ``len()``
            equal on every rank; default a ``DataLoader``. Tasks whose data depends on the model (the
            RL task's rollouts) override it.
        decodes: reading an item decodes or augments it (JPEG or PNG decoding, random crops and
            flips): the loaders then get worker processes (``loader_workers``). False (default)
            for data held in memory as tensors, which a worker would only copy.
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
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=nn.functional.cross_entropy)
    evaluate: Callable[[nn.Module, Iterable, torch.device], tuple[float, float]] | None = None
    make_loader: Callable[..., Iterable] | None = None
    decodes: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "hparams", {**HPARAM_DEFAULTS, **self.hparams})
        missing = set(HPARAM_KEYS) - set(self.hparams)
        extra = set(self.hparams) - set(HPARAM_KEYS)
        if missing or extra:
            raise ValueError(f"Task {self.name!r}: hparams missing {sorted(missing)}, unknown {sorted(extra)}.")

    @property
    def embedded(self) -> bool:
        """True when the task needs no data root (its data ships with a package)."""
        return not self.data_hint

    def validate(self, model: nn.Module, loader: Iterable, device: torch.device) -> tuple[float, float]:
        """Job-wide ``(val_loss, val_metric)`` of ``model``; every rank calls it with its own slice."""
        was_training = model.training
        model.eval()
        with torch.no_grad():
            result = (self.evaluate or classification_eval)(model, loader, device)
        model.train(was_training)
        return result

    def train_loader(
        self,
        train_set: Dataset,
        sampler: Sampler,
        batch_size: int,
        model: nn.Module,
        device: torch.device,
        workers: int = 0,
    ) -> Iterable:
        """This rank's training batches for one epoch (``sampler`` shards and shuffles), read by
        ``workers`` processes (``loader_workers``; 0: in this process)."""
        if self.make_loader is not None:
            return self.make_loader(train_set, sampler, batch_size, model, device)
        if workers == 0:
            return DataLoader(
                train_set, batch_size=batch_size, sampler=sampler, drop_last=True, **loader_options(0, device)
            )
        return _EpochLoader(
            _SeededItems(train_set, getattr(sampler, "seed", 0)),
            batch_size=batch_size,
            sampler=sampler,
            drop_last=True,
            **loader_options(workers, device),
        )


def cpu_share(ranks_here: int) -> int:
    """The CPUs this rank may use: those it is bound to (srun's ``--cpus-per-task``), or, where every
    rank sees the whole machine (the local launcher), an equal share among the ``ranks_here`` on it."""
    available, total = len(os.sched_getaffinity(0)), os.cpu_count() or 1
    return max(1, available if available < total else total // max(1, ranks_here))


def default_threads(ranks_here: int, device: torch.device, task: Task) -> int:
    """Torch threads per rank: the CPUs this rank may use (srun's ``--cpus-per-task`` binds them),
    or, where every rank sees the whole machine (the local launcher), an equal share of it among the
    ``ranks_here`` on it. On a GPU a task that decodes its items keeps one: the GPU computes, the
    rank's other CPUs decode (``loader_workers``)."""
    if accelerator.is_accelerator(device) and task.decodes:
        return 1
    return cpu_share(ranks_here)


def loader_workers(task: Task, threads: int, ranks_here: int = 1) -> int:
    """DataLoader worker processes for this rank: its CPUs (``cpu_share``) less its ``threads``
    training threads, for a task that ``decodes`` its items; 0 for data in memory (digits, mnist1d).

    Both the training and the validation loader get them; they persist from epoch to epoch, idle
    while the other loader runs. On a 2-core machine this is 0 or 1.
    """
    return max(0, cpu_share(ranks_here) - threads) if task.decodes else 0


def loader_options(workers: int, device: torch.device) -> dict[str, object]:
    """DataLoader arguments for ``workers`` worker processes feeding ``device``."""
    # Pinned host memory makes the copy to the GPU asynchronous (``to_device``'s non_blocking);
    # on the CPU it would only cost a copy. Persistent workers are not forked again every epoch.
    return {"num_workers": workers, "pin_memory": device.type == "cuda", "persistent_workers": workers > 0}


class _SeededItems(Dataset):
    """``dataset`` whose items, read in a DataLoader worker, draw from generators seeded per item.

    Read in the training process, an item's random crop and flip draw from the rank's generator,
    which a checkpoint saves and a resume restores. A worker process's generators are seeded once,
    when it starts, and then follow whichever batches that worker was dealt: no checkpoint holds
    them, and a resumed run's workers could not replay them. Seeded per item, the crops and flips of
    a resumed epoch are the uninterrupted run's, whatever the number of workers.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        # Written by the training process at each epoch's start; shared with the (persistent) workers.
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> object:
        if get_worker_info() is not None:
            entropy = np.random.SeedSequence([self.seed, int(self.epoch), index])  # (seed, epoch, index)
            item_seed = int(entropy.generate_state(1, np.uint64)[0])
            torch.default_generator.manual_seed(item_seed)  # the generators a DataLoader seeds in its workers
            random.seed(item_seed)
            np.random.seed(item_seed % 2**32)
        return self.dataset[index]


class _EpochLoader(DataLoader):
    """A DataLoader over ``_SeededItems`` that tells the workers the sampler's epoch as each epoch starts."""

    def __iter__(self):
        self.dataset.epoch.fill_(getattr(self.sampler, "epoch", 0))
        return super().__iter__()


def to_device(batch: object, device: torch.device) -> object:
    """Move a tensor, or a tuple/list of them, to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


def classification_eval(model: nn.Module, loader: Iterable, device: torch.device) -> tuple[float, float]:
    """Cross-entropy and top-1 accuracy; each rank scores its slice, the sums are all-reduced."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for x, y in loader:
        x, y = to_device(x, device), to_device(y, device)
        logits = model(x)
        sums[0] += nn.functional.cross_entropy(logits, y, reduction="sum").double()
        sums[1] += (logits.argmax(1) == y).sum()
        sums[2] += len(y)
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss, correct, count = sums.tolist()
    return loss / count, correct / count


class DataRootError(ValueError):
    """A task's data is missing or malformed; the message says which setting to change."""


def require_data_root(task_name: str, data_root: Path | None, must_hold: str) -> Path:
    """Return ``data_root / must_hold`` or raise a ``DataRootError`` naming ``--set data_root``."""
    if data_root is None:
        raise DataRootError(
            f"task {task_name!r} reads its data from disk: pass --set data_root=DIR, where DIR holds {must_hold}"
        )
    path = Path(data_root) / must_hold
    if not path.exists():
        raise DataRootError(
            f"task {task_name!r}: {path} does not exist; --set data_root=DIR must point at a folder holding {must_hold}"
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
