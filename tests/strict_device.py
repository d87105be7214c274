"""The strict device: the CPU plays a GPU, and the collectives keep NCCL's rules.

A machine without a GPU cannot show the bugs that kill a run on its first GPU step: a host tensor
mixed into a device computation, a device tensor handed to gloo, a receive from any source on NCCL,
a collective from a second thread. Importing this module registers a device named ``strict`` that behaves as CUDA does where it matters:

* **Tensors** on ``strict`` are wrappers around CPU tensors (``DeviceTensor``). Every operation
  runs on the wrapped tensors and refuses a plain CPU tensor beside a device one, as CUDA kernels
  do; 0-dim CPU tensors pass (CUDA takes them as scalars); ``copy_`` and ``to`` move between host
  and device. ``torch.strict`` is the device module (``synchronize``, ``set_device``, ...), so
  code written for any accelerator (``torch.get_device_module(device)``) runs here unchanged.
* **Process groups** made for the device (the default group and ``new_group()`` without a backend,
  the NCCL role) take device tensors only, refuse a receive from any source, and refuse calls from
  a thread other than the one that made the group. Groups made with ``backend="gloo"`` are gloo,
  which refuses device tensors.

The run takes its device with ``--set device=strict``. Only the test suite imports this module.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from multiprocessing.reduction import ForkingPickler

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

NAME = "strict"
_COPIES = {
    torch.ops.aten.copy_.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
}


class MixedDevices(RuntimeError):
    """A host tensor met a device tensor in one operation, or a backend got the wrong kind."""


class DeviceTensor(torch.Tensor):
    """A tensor in the strict device's memory: a wrapper whose data is a CPU tensor, ``inner``."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> DeviceTensor:
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=DEVICE,
            requires_grad=False,
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # noqa: D105
        return f"DeviceTensor({self.inner!r})"

    @property
    def data(self) -> torch.Tensor:
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # ``p.data = t`` swaps the C++ tensor under the Python object, whose ``inner`` would then
        # still be the old one (``vector_to_parameters`` writes parameters this way).
        torch.Tensor.data.__set__(self, value)
        if isinstance(value, DeviceTensor):
            self.inner = value.inner

    def tolist(self) -> list:  # as CUDA's: copies to the host (torch refuses it for subclasses)
        return self.inner.tolist()

    def __reduce_ex__(self, protocol):  # torch.save and pickling keep the device
        return _rebuild, (self.inner,)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":  # the device's own groups take their tensors directly (StrictGroup)
            raise MixedDevices(
                f"{func}: a tensor on {NAME} handed to a gloo group; gloo's role is the "
                "host's (stage a CPU copy, or use the device's group)"
            )
        copying = func in _COPIES

        def unwrap(x):
            if isinstance(x, DeviceTensor):
                return x.inner
            if isinstance(x, torch.Tensor) and x.dim() > 0 and not copying:
                raise MixedDevices(
                    f"{func}: a host tensor of shape {tuple(x.shape)} beside a tensor on "
                    f"{NAME} (a CUDA kernel refuses this: move it with .to(device))"
                )
            if isinstance(x, torch.device) and x.type == NAME:
                return torch.device("cpu")
            return x

        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            if written and isinstance(value, torch.Tensor) and not isinstance(value, DeviceTensor) and not copying:
                raise MixedDevices(
                    f"{func}: writes a host tensor of shape {tuple(value.shape)} with a tensor on "
                    f"{NAME} as input (only a device tensor may take a device result)"
                )
        to_host = func is torch.ops.aten._to_copy.default and _host(kwargs.get("device"))
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if func is torch.ops.aten.copy_.default:
            return args[0]
        if to_host:
            return out
        return tree_map(lambda x: DeviceTensor(x) if isinstance(x, torch.Tensor) else x, out)


def _host(device) -> bool:
    return device is not None and torch.device(device).type == "cpu"


def _rebuild(inner: torch.Tensor) -> torch.Tensor:
    """A saved device tensor loads onto the device, or onto the host under ``map_location="cpu"``,
    as a saved CUDA tensor does (the suite's checkpoints are read onto the host)."""
    where = torch.serialization._serialization_tls.map_location
    if isinstance(where, (str, torch.device)) and torch.device(where).type == "cpu":
        return inner
    return DeviceTensor(inner)


def _reduce_for_processes(t: DeviceTensor):
    """Between processes (torch.multiprocessing), a device tensor shares its memory, as CUDA IPC
    does; a parameter stays a parameter."""
    return _rebuild_shared, (t.inner, t.requires_grad, getattr(t, "_is_param", False))


def _rebuild_shared(inner: torch.Tensor, requires_grad: bool, is_param: bool) -> torch.Tensor:
    t = DeviceTensor(inner)
    return torch.nn.Parameter(t, requires_grad) if is_param else t.requires_grad_(requires_grad)


# ---- the device's kernels for factories and cross-device copies ------------------------------------------

_lib = torch.library.Library("aten", "IMPL")


# The device allocates in shared memory. CUDA memory can be handed to another process in place (CUDA
# IPC); a private CPU tensor is moved to shared memory when first pickled, and torch.multiprocessing's
# queues pickle in a background thread, so a write made meanwhile by the producer would be lost, a
# race that CUDA does not have (LAP/LPP's batch slots, written by the feed thread right after set-up,
# lost their first labels this way). An op's result is still private and moves at its first sharing.


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return DeviceTensor(torch.empty(size, dtype=dtype, memory_format=memory_format).share_memory_())


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return DeviceTensor(torch.empty_strided(size, stride, dtype=dtype).share_memory_())


def _copy_from(src, dst, non_blocking=False):
    host_src = src.inner if isinstance(src, DeviceTensor) else src
    if isinstance(dst, DeviceTensor):
        dst.inner.copy_(host_src)
    else:
        dst.copy_(host_src)
    return dst


class _DeviceModule:
    """``torch.strict``: what code written for ``torch.cuda`` asks of a device module."""

    _current = threading.local()

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @classmethod
    def current_device(cls) -> int:
        return getattr(cls._current, "index", 0)

    @classmethod
    def set_device(cls, device) -> None:
        cls._current.index = (
            torch.device(NAME, device).index if isinstance(device, int) else torch.device(device).index or 0
        )

    @staticmethod
    def synchronize(device=None) -> None:
        return None

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        return None

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.uint8)

    @staticmethod
    def set_rng_state(state, device=None) -> None:
        return None

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]


# ---- NCCL's rules on the device's process groups ---------------------------------------------------------


def _inner(tensors):
    out = []
    for t in tensors:
        if not isinstance(t, DeviceTensor):
            raise MixedDevices(
                f"a host tensor of shape {tuple(t.shape)} on a {NAME} (NCCL-role) process group; "
                "NCCL takes device tensors only"
            )
        out.append(t.inner)
    return out


class StrictGroup(dist.ProcessGroup):
    """A process group with NCCL's rules, carried out by a gloo group on the wrapped CPU tensors."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.thread = threading.get_ident()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return NAME

    @property
    def _device_types(self) -> list[torch.device]:  # where object collectives put their bytes, as NCCL's
        return [torch.device(NAME)]

    def _check_thread(self, op: str) -> None:
        # A thread that Python started (a gossip or progress thread) must not share the group with
        # the main thread; autograd's device thread, where DDP's hooks run while the main thread
        # waits in backward, is a C++ thread (a dummy to ``threading``) and may.
        current = threading.current_thread()
        if current.ident != self.thread and not isinstance(current, threading._DummyThread):
            raise MixedDevices(
                f"{op} on an NCCL-role group from a second thread: NCCL communicators are not "
                "safe across threads; give the thread its own (gloo) group"
            )

    def allreduce(self, tensors, opts=None):
        self._check_thread("allreduce")
        return self.gloo.allreduce(_inner(tensors), opts or dist.AllreduceOptions())

    def allreduce_coalesced(self, tensors, opts=None):
        self._check_thread("allreduce_coalesced")
        return self.gloo.allreduce_coalesced(_inner(tensors), opts or dist.AllreduceCoalescedOptions())

    def broadcast(self, tensors, opts=None):
        self._check_thread("broadcast")
        return self.gloo.broadcast(_inner(tensors), opts or dist.BroadcastOptions())

    def allgather(self, output_lists, inputs, opts=None):
        self._check_thread("allgather")
        return self.gloo.allgather([_inner(o) for o in output_lists], _inner(inputs), opts or dist.AllgatherOptions())

    def _allgather_base(self, output, input, opts=None):
        self._check_thread("all_gather_into_tensor")
        return self.gloo._allgather_base(_inner([output])[0], _inner([input])[0], opts or dist.AllgatherOptions())

    def reduce(self, tensors, opts=None):
        self._check_thread("reduce")
        return self.gloo.reduce(_inner(tensors), opts or dist.ReduceOptions())

    def barrier(self, opts=None):
        self._check_thread("barrier")
        return self.gloo.barrier(opts or dist.BarrierOptions())

    def send(self, tensors, dst: int, tag: int):
        self._check_thread("send")
        return self.gloo.send(_inner(tensors), dst, tag)

    def recv(self, tensors, src: int, tag: int):
        self._check_thread("recv")
        return self.gloo.recv(_inner(tensors), src, tag)

    def recv_anysource(self, tensors, tag: int):
        raise MixedDevices("a receive from any source on an NCCL-role group: NCCL has none; name the sender")


def _create_group(store, rank, size, timeout):
    return StrictGroup(store, rank, size, timeout)


def install() -> None:
    """Register the device, its kernels, its device module and its process-group backend (once)."""
    if getattr(torch, NAME, None) is not None:
        return
    _setup_privateuseone_for_python_backend(NAME, backend_module=_DeviceModule())
    _lib.impl("empty.memory_format", _empty, "PrivateUse1")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    ForkingPickler.register(DeviceTensor, _reduce_for_processes)
    torch.serialization.add_safe_globals([_rebuild])  # checkpoints load with weights_only=True
    dist.Backend.register_backend(NAME, _create_group, devices=[NAME])


install()
DEVICE = torch.device(NAME, 0)
