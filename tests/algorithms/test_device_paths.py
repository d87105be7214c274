"""The device paths of the gossip and wait-avoiding algorithms (SGP, WAGMA, AD-PSGD, DASO), without a GPU.

On the cluster the model lives on ``cuda:k`` and the default process group is NCCL's, while the
progress threads talk over gloo. Three stand-ins make those rules fail here as they would there:

- the ``meta`` device: ``torch.cat`` and arithmetic refuse to mix it with CPU tensors, as they
  refuse to mix CUDA and CPU ones, so a tensor made without the parameters' device raises;
- NCCL's point-to-point ordering, emulated on gloo (``_nccl_like_point_to_point``): a send posted
  alone returns only once the peer has posted the matching receive, while ``batch_isend_irecv``
  posts its operations together;
- a model in float64: a thread buffer made without the parameters' dtype no longer matches.

Not testable without a GPU: that WAGMA's and AD-PSGD's gloo calls get host copies of CUDA tensors
(on the CPU the copy is the tensor itself, and a ``meta`` tensor cannot be copied to the host), and
that AD-PSGD's thread sets the rank's CUDA device.
"""

from __future__ import annotations

import datetime
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

import algorithms
from algorithms.adpsgd import ADPSGD
from algorithms.daso import DASO, Event, Pending
from algorithms.sgp import SGP
from algorithms.topology import Topology
from algorithms.wagma import WAGMA
from tests.distributed import run_on

PLAN = algorithms.Plan(steps_per_epoch=10, epochs=1)


class Vector(nn.Module):
    """One parameter vector, set by the tests to hand-checkable values."""

    def __init__(self, size: int = 3, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(size, dtype=dtype))

    def forward(self, x):
        return (x * self.w).sum()


# ---- tensors made on the parameters' device (meta stands in for CUDA) ---------------------------------


def test_meta_refuses_cpu_tensors_as_cuda_does():
    """The stand-in itself: if meta accepted CPU tensors, the tests below could not fail."""
    with pytest.raises(RuntimeError):
        torch.cat([torch.zeros(3, device="meta"), torch.tensor([1.0])])
    with pytest.raises(RuntimeError):
        torch.zeros(3, device="meta") + torch.zeros(3)


def _meta_items(monkeypatch) -> list[torch.Tensor]:
    """Let ``.item()`` read a meta tensor as 1.0, so that the code after it runs on meta too (a CUDA
    tensor's value is copied to the host; meta holds none); returns every tensor read, whose device
    and dtype say where the value was made."""
    read = []
    item = torch.Tensor.item

    def meta_item(tensor: torch.Tensor) -> float:
        read.append(tensor)
        return 1.0 if tensor.is_meta else item(tensor)

    monkeypatch.setattr(torch.Tensor, "item", meta_item)
    return read


def test_sgp_hands_the_backend_its_messages_on_the_parameters_device(monkeypatch):
    """NCCL takes device tensors only: the pushed (x, w) of a step and the all-reduced one of eval_model,
    and the weights read back from them (the kept state's after the step, the total's in eval_model)."""
    sent = []

    def p2p_op(op, tensor, peer):
        if op is dist.isend:
            sent.append(tensor)
        return SimpleNamespace(op=op, tensor=tensor)  # what comm.batch_isend_irecv reads to count the sends

    monkeypatch.setattr(dist, "P2POp", p2p_op)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [])
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *args, **kwargs: sent.append(tensor))
    read = _meta_items(monkeypatch)
    algo = SGP(Topology(0, nodes=2, procs_per_node=1))
    algo.model = Vector(4, dtype=torch.float64).to("meta")
    algo.optimizer = torch.optim.SGD(algo.model.parameters(), lr=0.1)  # no gradients: the step moves nothing
    monkeypatch.setattr(algo, "averaged_model", lambda: algo.model)
    algo.step()
    algo.eval_model()
    assert [(t.device.type, t.dtype, t.numel()) for t in sent] == [("meta", torch.float64, 5)] * 2
    assert [(t.device.type, t.dtype) for t in read] == [("meta", torch.float64)] * 2


def _sgp_on_meta(monkeypatch):
    _meta_items(monkeypatch)  # the consumed state's weight
    algo = SGP(Topology(0, nodes=2, procs_per_node=1), overlap=1)
    algo.model = nn.Linear(2, 2, device="meta")  # 6 parameters: messages of 7
    state = {**algo.state_dict(), "in_flight": [(0, [torch.arange(7.0)])]}  # as a shard is read: on the CPU

    def restored():
        return algo.in_flight[0][2][0]

    return algo, state, restored, lambda: algo.end_epoch(0.0)  # consumes the message: x w + message


def _daso_on_meta(monkeypatch):
    algo = DASO(Topology(0, nodes=2, procs_per_node=1))
    algo.params = list(nn.Linear(2, 2, device="meta").parameters())
    state = {**algo.state_dict(), "in_flight": {5: torch.arange(6.0)}, "pending": (0, 5, 1)}

    def restored():
        return algo.in_flight[5][1]

    return algo, state, restored, lambda: algo._merge(Event("merge", 0, pending=Pending(0, 5, 1)))


def _wagma_on_meta(monkeypatch):
    algo = WAGMA(Topology(0, nodes=1, procs_per_node=2), group_size=2, mode="sync")
    # As prepare() leaves it in sync mode: on the model's device.
    algo.send_buf, algo.send_iter = torch.zeros(6, device="meta"), -1
    state = {**algo.state_dict(), "send_buf": torch.arange(6.0)}
    return algo, state, lambda: algo.send_buf, lambda: None  # never consumed in sync mode, only saved


@pytest.mark.parametrize("build", [_sgp_on_meta, _daso_on_meta, _wagma_on_meta], ids=["sgp", "daso", "wagma"])
def test_load_state_dict_puts_restored_tensors_on_the_parameters_device(monkeypatch, build):
    """A checkpoint is read onto the CPU; the restored messages and buffers must join the model."""
    algo, state, restored, consume = build(monkeypatch)
    algo.load_state_dict(state)
    assert restored().device.type == "meta"
    consume()


# ---- DASO: DDP's device ids follow the model, not the machine --------------------------------------------


def _daso_cpu_model_on_a_gpu_machine(rank: int, world: int) -> None:
    torch.cuda.is_available = lambda: True  # a GPU machine running a gloo job (or these tests) on the CPU
    model = Vector()
    algo = DASO(Topology(rank, nodes=1, procs_per_node=1))
    assert algo.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), PLAN).device_ids is None


def test_daso_wraps_a_cpu_model_on_a_machine_with_cuda():
    run_on(1, _daso_cpu_model_on_a_gpu_machine)


# ---- WAGMA sync mode under NCCL's point-to-point rules ---------------------------------------------------

_FakeP2POp = namedtuple("_FakeP2POp", "op tensor peer group tag")


class _Done:
    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _nccl_like_point_to_point() -> None:
    """NCCL's ordering rules on gloo. NCCL's send of a message larger than its buffers waits for the
    peer's receive: here an ungrouped ``isend`` returns once the peer has posted its receive (a gloo
    send completes only then), failing after 20 s instead of hanging. ``batch_isend_irecv`` posts its
    operations together (``ncclGroupStart``/``End``): receives first, then sends, none waiting."""
    isend, irecv = dist.isend, dist.irecv

    def blocking_isend(tensor, dst=None, group=None, tag=0):
        isend(tensor, dst, group, tag).wait(timeout=datetime.timedelta(seconds=20))
        return _Done()

    def grouped(ops):
        return [irecv(o.tensor, o.peer, o.group, o.tag) for o in ops if o.op is irecv] + [
            isend(o.tensor, o.peer, o.group, o.tag) for o in ops if o.op is not irecv
        ]

    def p2p_op(op, tensor, peer, group=None, tag=0):
        return _FakeP2POp(op, tensor, peer, group, tag)

    dist.isend, dist.P2POp, dist.batch_isend_irecv = blocking_isend, p2p_op, grouped


def _sync_round(rank: int, world: int) -> None:
    model = Vector()
    algo = WAGMA(Topology(rank, nodes=1, procs_per_node=2), group_size=2, global_period=10, mode="sync")
    algo.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0), PLAN)
    with torch.no_grad():
        model.w.fill_(float(rank))
    _nccl_like_point_to_point()
    algo.step()  # iteration 0: the group {0, 1} averages the fresh models 0 and 1
    assert torch.equal(model.w.data, torch.full((3,), 0.5)), (rank, model.w.data)


def test_sync_wagma_exchanges_without_deadlock_under_nccl_point_to_point_rules():
    run_on(2, _sync_round)


# ---- AD-PSGD's thread: its buffers follow the model, and its failure reaches the main thread -------------


def _adpsgd_float64(rank: int, world: int) -> None:
    model = Vector(dtype=torch.float64)
    algo = ADPSGD(Topology(rank, nodes=1, procs_per_node=2))
    algo.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0), PLAN)
    with torch.no_grad():
        model.w.fill_(float(rank))
    deadline = time.monotonic() + 30
    while algo.exchanges == 0 and time.monotonic() < deadline:
        algo.step()
        time.sleep(0.02)
    assert algo.exchanges > 0, f"rank {rank}: no exchange in 30 s ({algo.__dict__.get('error')!r})"
    algo.close()
    assert torch.equal(model.w.data, torch.full((3,), 0.5, dtype=torch.float64)), (rank, model.w.data)


def test_adpsgd_exchanges_a_float64_model():
    run_on(2, _adpsgd_float64)


def _adpsgd_thread_failure(rank: int, world: int) -> None:
    model = Vector()
    algo = ADPSGD(Topology(rank, nodes=1, procs_per_node=2))  # rank 0 of the pair: the active side
    algo.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0), PLAN)
    failure = ConnectionError("injected: the gloo send failed")

    def failing_send(*args, **kwargs):
        raise failure

    dist.send = failing_send
    algo.step()  # wakes the thread, whose exchange fails
    algo.thread.join(timeout=30)
    assert not algo.thread.is_alive()
    with pytest.raises(RuntimeError, match="gossip thread failed") as raised:
        algo.step()
    assert raised.value.__cause__ is failure
    with pytest.raises(RuntimeError, match="gossip thread failed"):
        algo.close()


def test_adpsgd_thread_failure_raises_in_the_main_thread():
    run_on(1, _adpsgd_thread_failure)
