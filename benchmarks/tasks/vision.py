"""Import torchvision on CPU-only torch builds.

PyPI's torchvision 0.28.0 is a CUDA build: its compiled operators cannot load beside the CPU build
of torch 2.13.0, and ``import torchvision`` then fails in ``_meta_registrations.py`` with
``operator torchvision::nms does not exist``. Defining the two operator schemas it registers fake
kernels for lets the pure-Python parts (models, transforms, datasets, PIL decoding) import. The
compiled ops (``torchvision.ops``, ``torchvision.io`` JPEG decoding) stay unavailable; the suite does
not use them. On a cluster whose torchvision loads normally, nothing is changed.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library: torch.library.Library | None = None  # kept alive: the schemas vanish with it


def torchvision() -> ModuleType:
    """Return the ``torchvision`` module, defining the missing schemas first when needed."""
    global _library
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as error:
        if "torchvision::nms" not in str(error):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        _library.define(schema)
    return importlib.import_module("torchvision")
