"""Where each rank sits in the (virtual or real) cluster, and the process groups that follow from it.

The suite numbers ranks in blocks: ranks ``node * procs_per_node ... + procs_per_node - 1`` form one
node, as Slurm's block distribution does on JUWELS (4 GPUs per node). On one machine the same
numbering gives a virtual cluster, so hierarchical algorithms see the groups they would see there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    """The position of this rank.

    Args:
        rank: global rank, ``0 <= rank < world_size``.
        nodes: number of (virtual) nodes N.
        procs_per_node: processes per node G (GPUs per node on the cluster).
    """

    rank: int
    nodes: int
    procs_per_node: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.procs_per_node < 1:
            raise ValueError(f"``nodes`` and ``procs_per_node`` must be >= 1, got {self.nodes}, {self.procs_per_node}.")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"``rank`` must be in [0, {self.world_size}), got {self.rank}.")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def node(self) -> int:
        return self.rank // self.procs_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.procs_per_node

    def node_ranks(self, node: int) -> list[int]:
        """The global ranks on ``node``."""
        start = node * self.procs_per_node
        return list(range(start, start + self.procs_per_node))

    def cross_node_ranks(self, local_rank: int) -> list[int]:
        """The ranks with local index ``local_rank`` on every node (one per node)."""
        return [node * self.procs_per_node + local_rank for node in range(self.nodes)]


def mixing_matrix(name: str, world_size: int) -> list[list[float]]:
    """A symmetric, doubly stochastic mixing matrix W (rows sum to 1) for D-PSGD-style gossip.

    ``ring``: each worker averages itself with its two ring neighbours, weight 1/3 each (Lian et al.
    2017; WAGMA's D-PSGD baseline). With 2 workers the two neighbours coincide (weights 1/3, 2/3).
    ``complete``: every worker takes the plain average, which makes D-PSGD per-step model averaging.
    """
    p = world_size
    if name == "ring":
        w = [[0.0] * p for _ in range(p)]
        for i in range(p):
            for j in (i - 1, i, i + 1):
                w[i][j % p] += 1.0 / 3.0
        return w
    if name == "complete":
        return [[1.0 / p] * p for _ in range(p)]
    raise ValueError(f"Arg ``mixing`` must be 'ring' or 'complete', got {name!r}.")


def exponential_peers(rank: int, world_size: int, step: int, num_peers: int) -> tuple[list[int], list[int]]:
    """Out- and in-peers at ``step`` on the time-varying directed exponential graph (SGP).

    The offsets are powers of two, 2^0 .. 2^(R-1) with R = ceil(log2 P); at step t a worker sends to
    ``rank + 2^((t + j) mod R)`` for j < ``num_peers`` and receives from ``rank - 2^(...)``, so one
    peer rotates through every offset and information crosses the whole graph in R steps
    (Assran et al. 2019, section 5; the reference code's ``NPeerDynamicDirectedExponentialGraph``).
    """
    offsets = exponential_offsets(world_size)
    chosen = [offsets[(step + j) % len(offsets)] for j in range(min(num_peers, len(offsets)))]
    return ([(rank + o) % world_size for o in chosen], [(rank - o) % world_size for o in chosen])


def exponential_offsets(world_size: int) -> list[int]:
    """Distinct offsets 1, 2, 4, ... below ``world_size`` (empty for a single worker)."""
    offsets, o = [], 1
    while o < world_size:
        offsets.append(o)
        o *= 2
    return offsets


def bipartite_neighbours(rank: int, world_size: int) -> list[int]:
    """AD-PSGD's neighbours on a bipartite graph: even ranks are active, odd ranks passive.

    Only active workers start an exchange, and only with passive ones, so two workers never wait on
    each other (no deadlock). The neighbours sit at odd offsets 1 and 2^r + 1 in both directions,
    as in the AD-PSGD reference code, so each exchange crosses the two halves.
    """
    if world_size % 2:
        raise ValueError(f"AD-PSGD's bipartite graph needs an even number of workers, got {world_size}.")
    odd = {1} | {2**r + 1 for r in range(1, max(1, (world_size - 1).bit_length())) if 2**r + 1 < world_size}
    return sorted({(rank + s * o) % world_size for o in odd for s in (1, -1)} - {rank})


def wagma_phase_masks(world_size: int, group_size: int, step: int, printed: bool = False) -> list[int]:
    """The butterfly masks of WAGMA-SGD's dynamic grouping (Algorithm 1) at iteration ``step``.

    The corrected reading (default) takes log2(S) consecutive bits starting at
    ``(step * log2 S) mod log2 P``, one per phase: ``mask_r = 1 << ((shift + r) mod log2 P)``. It
    reproduces the paper's own example (P=8, S=4: {0,1,2,3},{4,5,6,7} then {0,1,4,5},{2,3,6,7}).
    ``printed=True`` follows the algorithm as printed (``mask <<= shift``, cumulative), which does not
    reproduce the example (WAGMA-SGD, Sec. 3.2, line 6); masks that overflow past P are dropped.
    """
    gp, sp = world_size.bit_length() - 1, group_size.bit_length() - 1
    if gp == 0:
        return []
    shift = (step * sp) % gp
    if not printed:
        return [1 << ((shift + r) % gp) for r in range(sp)]
    masks, mask = [], 1
    for _ in range(sp):
        mask <<= shift
        if mask < world_size:
            masks.append(mask)
        shift = (shift + 1) % gp
    return masks


def wagma_group(rank: int, world_size: int, group_size: int, step: int, printed: bool = False) -> list[int]:
    """The members of ``rank``'s group at iteration ``step`` (the closure under the step's masks)."""
    group = {rank}
    for mask in wagma_phase_masks(world_size, group_size, step, printed):
        group |= {q ^ mask for q in group}
    return sorted(group)
