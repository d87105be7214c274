"""Horovod's ``DistributedOptimizer``: the data-parallel baseline of the DASO papers, run as is.

Horovod needs its own rendezvous. Under ``horovodrun`` or ``mpirun`` it has one (the launcher's
variables, or MPI). Under the suite's local launcher, srun or torchrun, ``prepare`` does what
``horovodrun --gloo`` does before it starts the ranks: rank 0 runs Horovod's HTTP rendezvous server
and every rank gets Horovod's variables, exchanged over the suite's own process group. The virtual
nodes become Horovod's hosts, so its local and cross communicators match the suite's topology.
Setting: the DASO papers' Horovod runs (arXiv:2104.05588, Sec. 4: "floating point 16 compression";
``op=hvd.Average`` as in the authors' ``hvd-train.py``, github.com/coquelin77/nvidia-semantic-segmentation).
"""

from __future__ import annotations

import logging
import os
import socket
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from algorithms import comm
from algorithms.base import Algorithm, Plan
from algorithms.topology import Topology

if TYPE_CHECKING:
    from horovod.runner.http.http_server import RendezvousServer

logger = logging.getLogger(__name__)

_OWN_RENDEZVOUS = "DPB_HOROVOD_RENDEZVOUS"  # set where this module, not horovodrun, set HOROVOD_*
BUILD_HINT = "build it with envs/build_horovod.sh (Horovod 0.28.1 against this torch, into .venv)"


class Horovod(Algorithm):
    """Horovod: gradient all-reduce with tensor fusion, started from backward hooks.

    Paper: Sergeev and Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow",
    arXiv 2018, https://arxiv.org/abs/1802.05799.

    The optimizer is wrapped in ``hvd.DistributedOptimizer``: each gradient's all-reduce starts as
    soon as backward has produced it, Horovod's background thread fuses ready tensors into large
    messages, and ``step()`` waits for the results before the local update. This is the baseline
    DASO is measured against (Coquelin et al. 2022, arXiv:2104.05588, Sec. 4), where
    Horovod ran with ``compression=hvd.Compression.fp16`` and ``op=hvd.Average`` (DASO itself sends
    bfloat16, which Horovod lacks: J. Big Data version, "Results and discussion"). With
    ``fp16_compression=False`` the update is DDP's: parameters agree after every step (to
    floating-point reordering). Communication hides inside backward, so ``comm_s`` stays 0.
    Buffers (batch-norm statistics) are broadcast once at the start and then stay local.

    Args:
        fp16_compression: cast gradients to float16 for the all-reduce and back afterwards, as in
            the DASO papers' Horovod runs (default ``False``: fp32, comparable with DDP).

    Example::

        algo = Horovod(topology, fp16_compression=True)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
            scheduler.step()  # lr changes on ``optimizer`` reach the optimizer Horovod steps

    On the virtual cluster (``--set clock=simulated``), where Horovod's C++ cannot run, its messages
    are modelled by what they do (``_prepare_model``): every gradient averaged by a ring all-reduce
    that starts during backward, in float16 with ``fp16_compression``, overlapping backward as DDP's
    buckets do on the virtual clock. Horovod's tensor fusion sends what each cycle (1 ms) finds
    ready, up to 128 MB a message (the defaults since Horovod 0.21): a finer grain than DDP's 25 MB
    buckets, whose count and latency the link model cannot pin down without the real model's
    tensors. The model gives Horovod DDP's grain (the same overlap, the same number of messages,
    half the bytes in fp16), so that against DDP it differs only in what the papers say it does.
    With fp32 this is the real Horovod's update (tested against a real Horovod run); with fp16 it
    rounds as Horovod does (cast, sum, then scale by 1/p), not bit for bit.

    Warning:
        A real job needs Horovod built with PyTorch support (``envs/build_horovod.sh``);
        ``prepare`` then calls ``hvd.init()``: one Horovod job per process.
    """

    overlaps_comm = True
    broadcast_start = False  # the wrapper broadcasts the initial state itself
    family = "all-reduce"
    simulator = "virtual"
    calibration = "test"  # tools/calibrate.py

    def __init__(self, topology: Topology, *, fp16_compression: bool = False) -> None:
        super().__init__(topology)
        if not isinstance(fp16_compression, bool):
            raise ValueError(f"Arg ``fp16_compression`` must be True or False, got {fp16_compression!r}.")
        self.fp16_compression = fp16_compression
        self.hvd: ModuleType | None = None  # horovod.torch, on a real job
        self.controller = ""  # "gloo" or "mpi", once prepared ("model" on the virtual cluster)
        self._rendezvous: RendezvousServer | None = None  # rank 0's, where this class started one

    @classmethod
    def unavailable(cls, simulated: bool = False) -> str | None:
        if simulated:  # the virtual cluster's model of Horovod needs torch alone
            return None
        try:
            import_horovod()
        except ImportError as error:
            return str(error)
        return None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        if comm.side_backend() == "virtual":
            return self._prepare_model(model, optimizer, plan)
        hvd = self.hvd = import_horovod()
        self.controller, self._rendezvous = init_horovod(hvd, self.topology)
        compression = hvd.Compression.fp16 if self.fp16_compression else hvd.Compression.none
        self.hvd_optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average
        )
        self._share_state(optimizer)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # A fresh optimizer holds no state and needs no broadcast. Horovod would first create it by
        # a step with zero gradients, which with weight decay moves the parameters (p <- p(1 - lr wd))
        # and seeds momentum with wd p: an update no other baseline makes.
        if optimizer.state:
            hvd.broadcast_optimizer_state(self.hvd_optimizer, root_rank=0)
        self._count_start(model, optimizer)
        logger.info(
            "horovod: %d ranks, %s controller, %s gradients",
            hvd.size(),
            self.controller,
            "fp16" if self.fp16_compression else "fp32",
        )
        return super().prepare(model, optimizer, plan)

    def _prepare_model(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        """Horovod's messages on the virtual cluster: DDP's bucketed all-reduce in Horovod's message
        type, averaged as Horovod does (``HorovodModel``), rank 0's state broadcast first as
        ``hvd.broadcast_parameters`` does."""
        dtype = torch.float16 if self.fp16_compression else None
        self.ddp = HorovodModel(model, dtype)
        self.controller = "model"
        self._count_start(model, optimizer)
        super().prepare(model, optimizer, plan)
        return self.ddp

    def _count_start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Count what Horovod sent at the start (``comm``'s rule: its messages leave from its own
        thread, past the suite's collectives), and what it will send each step: every gradient,
        all-reduced in float16 or as it is."""
        p = self.topology.world_size
        state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        comm.count(comm.broadcast_bytes(comm.tensor_bytes([*model.state_dict().values(), *state]), p))
        grads = [q for q in model.parameters() if q.requires_grad]
        size = sum(q.numel() * (2 if self.fp16_compression else q.element_size()) for q in grads)
        self.step_bytes = comm.ring_allreduce_bytes(size, p)

    def _share_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the wrapped optimizer use the runner's ``param_groups`` and ``state`` objects.

        ``DistributedOptimizer`` builds a new optimizer of a subclass of the given one over the same
        group dicts, so an lr scheduler on the original already reaches it; sharing the containers
        too keeps momentum where the runner's ``optimizer.state_dict()`` finds it, and survives an
        ``optimizer.load_state_dict()`` (which rebinds both) through the check in ``step``.
        """
        self.hvd_optimizer.param_groups = optimizer.param_groups
        self.hvd_optimizer.state = optimizer.state

    def step(self) -> None:
        if self.hvd is None:  # the virtual cluster's model: the gradients were averaged during backward
            self.optimizer.step()
            comm.count(self.step_bytes)
            self.step_count += 1
            return
        if self.hvd_optimizer.param_groups is not self.optimizer.param_groups:
            self._share_state(self.optimizer)
        # Horovod's step: wait for the all-reduces started during backward, then the local update.
        self.hvd_optimizer.step()
        comm.count(self.step_bytes)
        # The runner's lr scheduler watches its own optimizer's step() and would warn that it never
        # ran; the update it tracks is the one just made, so set the flag its step() wrapper sets.
        self.optimizer._opt_called = True
        self.step_count += 1

    def close(self) -> None:
        if self.hvd is None:
            return
        # Every rank ends its training loop with no Horovod operation pending, so all of them agree
        # to stop Horovod's background thread; torch.distributed carries the runner on.
        self.hvd.shutdown()
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None


class HorovodModel(DistributedDataParallel):
    """DDP as the virtual cluster's model of Horovod's messages: ``VirtualClock.overlap_backward``
    all-reduces its buckets in ``message_dtype`` (float16 for ``fp16_compression``; ``None``: as
    they are) and averages as Horovod's ``op=hvd.Average`` does: the sum, then scaled by 1/p."""

    sums_then_averages = True  # op=hvd.Average: the virtual clock reads this, not the type

    def __init__(self, module: nn.Module, message_dtype: torch.dtype | None, **kwargs: object) -> None:
        super().__init__(module, **kwargs)
        self.message_dtype = message_dtype


def import_horovod() -> ModuleType:
    """``horovod.torch``, or an ``ImportError`` whose one line says how to build it."""
    try:
        import horovod.torch as hvd
    except ImportError as error:  # not installed, or built against another torch (undefined symbol)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ImportError(
            f"the horovod algorithm needs Horovod with PyTorch support ({reason}); {BUILD_HINT}"
        ) from None
    return hvd


def init_horovod(hvd: ModuleType, topology: Topology) -> tuple[str, RendezvousServer | None]:
    """``hvd.init()`` in the job ``torch.distributed`` already joined.

    Returns the controller (``"gloo"`` or ``"mpi"``) and, on rank 0 where it started one, the
    rendezvous server, which must live as long as Horovod does (process sets rendezvous there too).
    """
    env = os.environ
    # HOROVOD_RANK comes from horovodrun, or from an earlier rendezvous of this module (marked).
    under_horovodrun = "HOROVOD_RANK" in env and _OWN_RENDEZVOUS not in env
    under_mpi = any(k in env for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"))
    server = None
    if not under_horovodrun and not (under_mpi and hvd.mpi_built()):
        server = _gloo_rendezvous(topology)
    hvd.init()
    if (hvd.rank(), hvd.size()) != (topology.rank, topology.world_size):
        raise RuntimeError(
            f"Horovod sees rank {hvd.rank()} of {hvd.size()}, but this is rank "
            f"{topology.rank} of {topology.world_size}: start the job with the suite's "
            "launcher, srun, mpirun or horovodrun --gloo"
        )
    return ("mpi" if hvd.mpi_enabled() else "gloo"), server


def _gloo_rendezvous(topology: Topology) -> RendezvousServer | None:
    """What ``horovodrun --gloo`` does before it starts the ranks, over the suite's process group.

    Rank 0 starts Horovod's rendezvous server with one slot per rank (virtual node = host); every
    rank then sets the variables horovodrun would have set. Returns the server on rank 0.
    """
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousServer

    world, nodes, per_node = topology.world_size, topology.nodes, topology.procs_per_node
    hosts: list[str | None] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    server, port = None, [0]
    if topology.rank == 0:
        server = RendezvousServer()
        port[0] = server.start()
        slots = [
            SlotInfo(f"node{r // per_node}", r, r % per_node, r // per_node, world, per_node, nodes)
            for r in range(world)
        ]
        server.init(slots)
    dist.broadcast_object_list(port, src=0)
    # MASTER_ADDR is rank 0's address for torch.distributed too (the launchers and
    # benchmarks.launcher.init_process_group set it); on one machine gloo stays on the loopback.
    os.environ.update(
        {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": os.environ.get("MASTER_ADDR") or hosts[0],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port[0]),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": f"node{topology.node}",
            "HOROVOD_RANK": str(topology.rank),
            "HOROVOD_SIZE": str(world),
            "HOROVOD_LOCAL_RANK": str(topology.local_rank),
            "HOROVOD_LOCAL_SIZE": str(per_node),
            "HOROVOD_CROSS_RANK": str(topology.node),
            "HOROVOD_CROSS_SIZE": str(nodes),
            _OWN_RENDEZVOUS: "1",
        }
    )
    if len(set(hosts)) == 1:
        os.environ.setdefault("HOROVOD_GLOO_IFACE", "lo")
    return server
