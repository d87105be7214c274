"""The device a rank trains on, from the ``device`` setting and the rank's place on its machine."""

from __future__ import annotations

import torch

from algorithms import accelerator


def pick_device(setting: str, local_rank: int) -> torch.device:
    """``auto`` picks CUDA when present, else the CPU; ``cuda`` (or another accelerator's name) asks
    for it. ``local_rank`` is ``Launch.local_rank``, the process's index on its machine: one GPU each
    while there are enough."""
    kind = "cuda" if setting == "auto" and torch.cuda.is_available() else setting
    if kind in ("auto", "cpu"):
        return torch.device("cpu")
    module = torch.get_device_module(kind)
    if not module.is_available():
        raise RuntimeError(f"--set device={kind}, but {kind} is not available here; use device=cpu")
    device = torch.device(kind, local_rank % module.device_count())
    accelerator.set_device(device)
    return device
