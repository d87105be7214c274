"""ImageNet (ILSVRC 2012) with torchvision's ResNet-50, the large workload of DANA, DASO, WAGMA, LPP-SGD.

Data: the ``ImageFolder`` layout, ``data_root/train/<wnid>/*.JPEG`` and ``data_root/val/<wnid>/*.JPEG``
with the 50,000 validation images already sorted into the same class folders as the training set.
Images are decoded with PIL (``ImageFolder``'s default loader; ``torchvision.io`` cannot decode on
the CPU-only build). Train: RandomResizedCrop(224) and a horizontal flip; validation: Resize(256) and
CenterCrop(224), "1-crop validation"; both normalised with the ImageNet mean and std (our reading of
DANA, arXiv:1907.11612 App. A.3; LPP-SGD's code, github.com/bapi/LPP-SGD
dataloaders/data_loader_imagenet.py).

Recipe: Goyal et al. (arXiv:1706.02677), our reading for all four papers. Per-worker batch 32 (Goyal;
LPP-SGD's standard batch, arXiv:2203.06638 App. D Table 13). ``lr`` is the single-worker rate
0.1 x 32 / 256 = 0.0125 (the base rate of LPP-SGD, Table 13, and of Heat's examples/nn/imagenet-DASO.py;
DASO, arXiv:2104.05588 Table 1, only says "scaled by number of GPUs"); a run with global batch B sets
``lr = 0.1 * B / 256`` (WAGMA-SGD's code, github.com/Shigangli/WAGMA-SGD
official/resnet/imagenet_main_wagma_sgd.py; the paper gives none), and the 5-epoch warm-up starts from
``lr / world_size``. Momentum 0.9 without Nesterov (WAGMA's TF code, DASO's PyTorch example), weight
decay 1e-4 (Goyal, DANA, WAGMA, DASO; LPP-SGD uses 5e-5), 90 epochs, x0.1 at epochs 30, 60 and 80
(WAGMA, LPP-SGD; DANA decays at 30 and 60 only).

Target: 75.9% top-1, MLPerf's (WAGMA-SGD, arXiv:2005.00124 Section 5.2, Fig. 5: Allreduce-SGD reaches
75.9%; LPP-SGD Table 8: MB-SGD 76.07%). DANA's single-worker baseline, 75.64% (arXiv:1907.11612
Table 5), stays below it.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn
from torch.utils.data import Dataset

from benchmarks.tasks import DataRootError, Task, require_data_root
from benchmarks.tasks.vision import torchvision

NAME = "imagenet_resnet50"
_HINT = "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (validation images sorted into the class folders)"
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _class_folders(folder: Path) -> list[str]:
    with os.scandir(folder) as entries:
        return sorted(entry.name for entry in entries if entry.is_dir())


def check_data(data_root: Path | None) -> None:
    """Raise ``DataRootError`` unless ``data_root`` holds ``train/`` and ``val/`` with the same classes.

    Only folder names are compared here (cheap, before any process starts); the image files are
    listed when the datasets are built.
    """
    train = require_data_root(NAME, data_root, "train")
    val = require_data_root(NAME, data_root, "val")
    train_classes, val_classes = _class_folders(train), _class_folders(val)
    if not train_classes:
        raise DataRootError(f"task {NAME!r}: {train} holds no class folders; --set data_root=DIR must hold {_HINT}")
    if not val_classes:
        raise DataRootError(
            f"task {NAME!r}: {val} holds no class folders; sort the validation images into "
            f"val/<wnid>/ folders named as in train/ (--set data_root=DIR must hold {_HINT})"
        )
    if train_classes != val_classes:
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise DataRootError(
            f"task {NAME!r}: the class folders of {train} and {val} differ: {len(only_train)} only in "
            f"train/ {only_train[:3]}, {len(only_val)} only in val/ {only_val[:3]}; labels would not "
            f"match. --set data_root=DIR must hold {_HINT}"
        )


def make_datasets(data_root: Path | None) -> tuple[Dataset, Dataset]:
    """Build the (augmented train, centre-cropped validation) ``ImageFolder`` datasets."""
    check_data(data_root)
    tv = torchvision()
    transforms = tv.transforms
    normalize = transforms.Normalize(_MEAN, _STD)
    train_transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    val_transform = transforms.Compose(
        [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]
    )
    assert data_root is not None  # check_data rejects None
    root = Path(data_root)
    try:
        train = tv.datasets.ImageFolder(str(root / "train"), transform=train_transform)
        val = tv.datasets.ImageFolder(str(root / "val"), transform=val_transform)
    except FileNotFoundError as error:  # a class folder without any image
        raise DataRootError(f"task {NAME!r}: {error}; --set data_root=DIR must hold {_HINT}") from error
    return train, val


def make_model() -> nn.Module:
    """torchvision's ResNet-50 (v1.5: stride 2 in the 3x3 convs), 1000 classes, random init."""
    return torchvision().models.resnet50(weights=None)


TASK = Task(
    name=NAME,
    description=("ResNet-50 on ImageNet, Goyal et al. recipe (90 epochs, lr x0.1 at 30/60/80); target 75.9% top-1"),
    make_datasets=make_datasets,
    make_model=make_model,
    target=0.759,
    hparams={
        "batch_size": 32,  # per worker
        "lr": 0.0125,  # 0.1 per 256 images at one worker; scale to the global batch
        "nesterov": False,
        "weight_decay": 1e-4,
        "epochs": 90,
        "schedule": "step",
        "warmup_epochs": 5,
        "milestones": [30, 60, 80],
        "gamma": 0.1,
    },
    data_hint=_HINT,
    check_data=check_data,
    decodes=True,  # JPEG decoding and random crops: DataLoader workers
)
