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
