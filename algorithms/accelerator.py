"""The rank's accelerator, whichever it is: CUDA on the cluster, the tests' strict device on a CPU.

The suite asks three things of a device: is it an accelerator (tensors there need a host copy for
gloo, and the clock must wait for it), wait for its queued work, make it current in this thread.
``torch.get_device_module`` answers them for any device PyTorch knows, so the same lines serve CUDA
and the CPU-backed device with which the tests check the GPU paths (tests/strict_device.py).
"""

from __future__ import annotations

import torch


def is_accelerator(device: torch.device | None) -> bool:
    """True for a device whose work runs asynchronously in its own memory (not the CPU)."""
    return device is not None and device.type not in ("cpu", "meta")


def registered() -> tuple[str, ...]:
    """An accelerator registered in this process beside CUDA (PyTorch's one out-of-tree slot,
    PrivateUse1, once given a name: the tests' strict device)."""
    name = torch._C._get_privateuse1_backend_name()
    return () if name == "privateuseone" else (name,)


def synchronize(device: torch.device | None) -> None:
    """Wait until ``device`` has run the work queued on it (nothing to wait for on the CPU)."""
    if is_accelerator(device):
        torch.get_device_module(device).synchronize(device)


def set_device(device: torch.device | None) -> None:
    """Make ``device`` this thread's current one: each thread (and spawned process) starts on index 0."""
    if is_accelerator(device):
        torch.get_device_module(device).set_device(device)
