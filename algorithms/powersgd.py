"""PowerSGD: DDP whose buckets go through PyTorch's own PowerSGD communication hook."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

from algorithms import comm
from algorithms.base import Plan
from algorithms.ddp import DDP, BucketBytes, device_ids
from algorithms.topology import Topology

_SLOTS = [slot for slot in powersgd.PowerSGDState.__slots__ if slot not in ("process_group", "rng")]


class PowerSGD(DDP):
    """PowerSGD: rank-r gradient compression with error feedback, as PyTorch ships it as a DDP hook.

    Paper: Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
    Distributed Optimization", NeurIPS 2019, https://arxiv.org/abs/1905.13727 (Algorithm 1, with the
    error feedback of Algorithm 2 and the warm start of Sec. 3).

    ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`` runs as is on DDP's buckets: each
    gradient matrix M is sent as P = M Q and Q = M^T P (one power iteration, orthogonalised P,
    warm-started Q), vectors uncompressed, and what compression lost is added to the next step's
    gradient. The first ``start_powerSGD_iter`` iterations are DDP's plain all-reduce (PyTorch needs
    at least 2: DDP lays its buckets out anew after the first, in the order the gradients came).
    PyTorch keeps the hook's state (error feedback, warm-start Q) per bucket; a resumed process
    starts again from DDP's first layout, then lays its buckets out anew after its own first
    iteration. So the state is cut into the parameters' pieces whenever the layout changes and for
    the checkpoint (with the iteration and the generator of the random Q), and put together again
    in the order of the bucket that asks for it: a resumed run follows the uninterrupted one bit
    for bit (tested). On the virtual cluster the hook's messages start after the batch's whole
    backward pass: they do not overlap it, as a bucket's would on a GPU (the embedded models fill one
    bucket, which is sent at the end of backward anyway).

    Args:
        matrix_approximation_rank: r (the paper's ResNet-18/CIFAR-10 choice: 2; PyTorch's default 1).
        start_powerSGD_iter: iterations of plain all-reduce first (PyTorch's default: 1000).
        min_compression_rate: a matrix is compressed only if it shrinks at least this much (2).
        bucket_cap_mb: DDP's bucket size in MiB (25).

    Example::

        algo = PowerSGD(topology, matrix_approximation_rank=2, start_powerSGD_iter=10)
        model = algo.prepare(model, optimizer, plan)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    family = "all-reduce"
    simulator = "virtual"
    calibration = "test"  # tools/calibrate.py
    short_run_knobs = {"start_powerSGD_iter": 10}  # compressed from the 10th step (default: the 1000th)

    def __init__(
        self,
        topology: Topology,
        *,
        matrix_approximation_rank: int = 1,
        start_powerSGD_iter: int = 1000,  # noqa: N803 - PyTorch's name
        min_compression_rate: float = 2.0,
        bucket_cap_mb: float = 25.0,
    ) -> None:
        super().__init__(topology, bucket_cap_mb=bucket_cap_mb)
        if not isinstance(matrix_approximation_rank, int) or matrix_approximation_rank < 1:
            raise ValueError(
                f"Arg ``matrix_approximation_rank`` must be a positive integer, got {matrix_approximation_rank}."
            )
        if not isinstance(start_powerSGD_iter, int) or start_powerSGD_iter < 2:
            raise ValueError(f"Arg ``start_powerSGD_iter`` must be an integer >= 2, got {start_powerSGD_iter}.")
        self.rank_r, self.start_iter, self.min_rate = (
            matrix_approximation_rank,
            start_powerSGD_iter,
            min_compression_rate,
        )

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, plan: Plan) -> nn.Module:
        self.ddp = DistributedDataParallel(model, device_ids=device_ids(model), bucket_cap_mb=self.bucket_cap_mb)
        self.sent = BucketBytes(model, self.topology.world_size, buckets=False)  # the hook counts what it sends
        self.shapes = [p.shape for p in model.parameters()]
        self.index = {p: k for k, p in enumerate(model.parameters())}
        self.layout: dict[int, list[int]] = {}  # bucket index -> its parameters' indices, as last seen
        self.pending: tuple[dict, dict] | None = None  # a loaded state, per parameter, not yet in a bucket
        self.state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=self.rank_r,
            start_powerSGD_iter=self.start_iter,
            min_compression_rate=self.min_rate,
            random_seed=plan.seed,
        )
        self.ddp.register_comm_hook(self.state, self._hook)
        super(DDP, self).prepare(model, optimizer, plan)
        return self.ddp

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP checks the annotations' objects, not strings
        """PyTorch's ``powerSGD_hook``, with its state laid out for this bucket's parameters."""
        i, params = bucket.index(), [self.index[p] for p in bucket.parameters()]
        if state.iter >= state.start_powerSGD_iter:
            if self.layout.get(i, params) != params:  # DDP laid its buckets out anew: cut the state up
                self.pending = self._cut()
                state.error_dict.clear()
                state.p_memory_dict.clear()
                state.q_memory_dict.clear()
                self.layout = {}
            if self.pending is not None:
                self._lay_out(i, params, bucket.buffer())
        self.layout[i] = params
        # What the hook sends, all of it by ring all-reduce: the bucket whole before PowerSGD starts;
        # after, the low-rank P and Q and the tensors it leaves uncompressed, which it counts itself.
        whole, before = state.iter < state.start_powerSGD_iter, state.total_numel_after_compression
        future = powersgd.powerSGD_hook(state, bucket)
        numel = bucket.buffer().numel() if whole else state.total_numel_after_compression - before
        comm.count(comm.ring_allreduce_bytes(numel * bucket.buffer().element_size(), self.sent.p))
        return future

    def _rank(self, k: int) -> int:
        """The rank parameter ``k``'s gradient is compressed to, 0 if it is sent whole: as
        ``powerSGD_hook``'s step I decides, with its own test (the gradient as a matrix of shape[0] rows)."""
        n, m = (self.shapes[k][0] if self.shapes[k] else 1), self._columns(k)
        r = min(n, m, self.rank_r)
        return r if powersgd._should_compress(n, m, r, self.min_rate)[0] else 0

    def _cut(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """The state of every bucket (error feedback, warm-start Q) cut into its parameters' pieces,
        with any pieces not yet laid out."""
        error, q = ({**part} for part in self.pending) if self.pending is not None else ({}, {})
        state = self.state
        for i, params in self.layout.items():
            if i in state.error_dict:
                sizes = [self.shapes[k].numel() for k in params]
                error.update(zip(params, (t.clone() for t in state.error_dict[i].split(sizes))))
            compressed = [k for k in params if self._rank(k)]
            if compressed and i in state.q_memory_dict:
                sizes = [self._columns(k) * self._rank(k) for k in compressed]
                q.update(zip(compressed, (t.clone() for t in state.q_memory_dict[i].split(sizes))))
        return error, q

    def _columns(self, k: int) -> int:
        return self.shapes[k].numel() // (self.shapes[k][0] if self.shapes[k] else 1)

    def _lay_out(self, i: int, params: list[int], buffer: torch.Tensor) -> None:
        """Put the loaded pieces of ``params`` together in this bucket's order, which need not be the
        order they were saved in: DDP lays its buckets out anew after a process's first iteration."""
        error, q = self.pending
        state = self.state
        if params[0] in error:
            state.error_dict[i] = torch.cat([error.pop(k) for k in params]).to(buffer)
        compressed = [k for k in params if self._rank(k)]
        if compressed and compressed[0] in q:
            state.q_memory_dict[i] = torch.cat([q.pop(k) for k in compressed]).to(buffer)
            rows = sum((self.shapes[k][0] if self.shapes[k] else 1) * self._rank(k) for k in compressed)
            state.p_memory_dict[i] = buffer.new_empty(rows)  # P is recomputed from Q: only its size matters
        if not error and not q:
            self.pending = None

    def state_dict(self) -> dict[str, object]:
        """The hook's state per parameter (error feedback, warm-start Q), its iteration and counters, and
        the generator of the random Q (as tensors: checkpoints load with ``weights_only``)."""
        hook = {slot: getattr(self.state, slot) for slot in _SLOTS if not slot.endswith("_dict")}
        error, q = self._cut()
        _, keys, pos, has_gauss, cached = self.state.rng.get_state()
        rng = {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "gauss": [has_gauss, cached]}
        return {**super().state_dict(), "powersgd": hook, "error": error, "q": q, "rng": rng}

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        for slot, value in state["powersgd"].items():
            setattr(self.state, slot, value)
        rng = state["rng"]
        keys = rng["keys"].numpy().astype(np.uint32)
        self.state.rng.set_state(("MT19937", keys, int(rng["pos"]), int(rng["gauss"][0]), float(rng["gauss"][1])))
        error, q = dict(state["error"]), dict(state["q"])
        self.pending = (error, q) if error or q else None
