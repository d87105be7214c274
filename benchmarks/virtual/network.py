"""The virtual cluster's network: nodes of GPUs, the links between them, and what a communication
crosses.

A message of n bytes over a link, alone, costs ``latency + n / bandwidth`` (the alpha-beta model of
Hockney, "The communication challenge for MPP", Parallel Computing 20(3), 1994). Each GPU has a port
into its node's fabric (NVLink: ``intra``), each node has ``rails`` adapters into the network
(``inter``, per adapter and direction). Messages that cross one port or adapter at once share its
bandwidth (``flows.py``, max-min), so the closed forms below are what a communication costs alone.

Collective costs alone follow Thakur, Rabenseifner and Gropp, "Optimization of collective
communication operations in MPICH" (IJHPCA 19(1), 2005): the ring all-reduce (reduce-scatter then
all-gather, 2(p-1) steps of n/p bytes, bandwidth-optimal: Patarasuk and Yuan, JPDC 69(2), 2009, the
algorithm of NCCL and Horovod), the binomial-tree broadcast, and point-to-point messages (gossip,
push-sum, WAGMA's butterfly, the parameter server). ``ring``, ``gather_ring``, ``tree`` and
``message`` give the same communications as the transfers they make, for the shared network.

The presets give each number with its source. Bandwidths are per direction.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from algorithms import comm


@dataclass(frozen=True)
class Link:
    """One kind of link: a message of ``n`` bytes takes ``latency_s + n / bandwidth_bps`` seconds."""

    latency_s: float
    bandwidth_bps: float  # bytes per second

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_bps


@dataclass(frozen=True)
class Network:
    """A two-level network: ``intra`` between the GPUs of a node, ``inter`` between nodes.

    ``sync_s`` is what the first communication after a compute phase waits beyond its link time,
    where ranks share processor cores: the OS runs some ranks' compute after the others', so the
    first message or collective after it waits for the last of them, and the next ones, with no
    compute between, do not. 0 on a cluster, where each rank has its own device; the calibration
    measures it on the machine it runs on (``tools/calibrate.py``).
    """

    name: str
    intra: Link
    inter: Link
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    sync_s: float = 0.0
    # gloo's ring cuts a buffer into at least 2p segments of whole elements and sends none for an
    # empty one (gloo/allreduce.cc, ``ring``). With the flag, an all-reduce of c < 2p elements is
    # charged c/2p of the ring's latencies: what such all-reduces cost back to back among 4 processes
    # that share 2 cores (means of 200: 1, 2, 3, 4, 6, 8 floats in 1.0, 1.4, 2.7, 3.4, 4.6, 5.5 ms, 16
    # and 64 in 5.3 and 5.8, where c/8 of 5.5 ms gives 0.7, 1.4, 2.1, 2.8, 4.1, 5.5). It is a fit of
    # that measurement, not an isolated call's latency: worked out message by message, gloo's schedule
    # still passes each of the c values through 2(p-1) messages in a row (at p = 4 and c = 1 the
    # ranks leave after 3, 6, 5 and 4 message times). Back to back, the ranks that leave first start
    # the next call, and fewer busy ranks wait less for a shared core. Next to a batch and the model's
    # all-reduce, a 1-float all-reduce costs 3.5-4.2 ms here (README, calibration). False in the
    # presets, whose NCCL rings do not skip; a gloo machine's calibration sets it.
    skips_empty_segments: bool = False
    # A node's network adapters (rails), each of ``inter``'s bandwidth per direction: a rank sends
    # and receives through adapter (its local rank mod rails), and a collective whose group has
    # several ranks on a node spreads its rings over that many adapters, as NCCL's channels do.
    rails: int = 1
    # Where MPI carries a group's traffic at its own pace (Heat's DASO: ``comm.carried_by_mpi``): each
    # of its transfers moves at most at ``mpi``'s bandwidth, through the same adapters, and a
    # non-blocking one that compute hides still costs that compute ``mpi_overlap`` of its time
    # (the host's progress of the MPI call). None: MPI goes as fast as the links.
    mpi: Link | None = None
    mpi_overlap: float = 0.0
    # True: every group whose ranks span nodes goes at MPI's pace, with its overlap cost, whichever
    # algorithm made it: DASO's claims with every method on Heat's transport (``tools.daso_sweep``,
    # the "fair" variant). False: only the groups an algorithm marks (``comm.carried_by_mpi``).
    mpi_for_all: bool = False
    # The nodes of one cell of the fabric, inside which the network between the adapters is not a
    # bottleneck (a dragonfly's group, a DragonFly+ cell's full fat tree); the links between cells
    # are not modelled, so a job on more nodes is told so (``spans_cells``). 0: one cell, any size.
    cell_nodes: int = 0

    def spans_cells(self, nodes: int) -> str | None:
        """A line saying what the model leaves out for a job on ``nodes`` nodes, or None."""
        if self.cell_nodes and nodes > self.cell_nodes:
            return (
                f"{self.name}: {nodes} nodes span more than one cell of {self.cell_nodes}; the links "
                "between cells are not modelled, so traffic between them is charged as if inside one"
            )
        return None

    def link(self, ranks: list[int] | tuple[int, ...], procs_per_node: int) -> Link:
        """The slowest link among ``ranks`` (global ranks, ``procs_per_node`` to a node)."""
        return self.intra if len({r // procs_per_node for r in ranks}) <= 1 else self.inter

    # -- what a communication costs alone: its transfers on otherwise idle links ------------------
    def alone(self, transfer: Transfer) -> float:
        """``transfer``'s time with nothing else on its links: its latency, then its bytes at the
        share of its most contended link (what ``flows.Fabric`` gives it when it is the only flow)."""
        if transfer.nbytes <= 0 or not transfer.links:
            return transfer.latency
        rate = min(self.capacity(link) / members for link, members in transfer.links.items())
        return transfer.latency + transfer.nbytes / rate

    def p2p(self, src: int, dst: int, procs_per_node: int, nbytes: float) -> float:
        return self.alone(self.message(src, dst, procs_per_node, nbytes))

    def ring_allreduce(self, ranks, procs_per_node: int, nbytes: float, elements: int | None = None) -> float:
        """Reduce-scatter then all-gather around a ring, alone: 2(p-1) steps of n/p bytes over the
        slowest link (one rail), or spread over a node's rails; with ``skips_empty_segments``, c/2p
        of the latencies for c < 2p ``elements`` (see the field)."""
        return self.alone(self.ring(ranks, procs_per_node, nbytes, elements))

    def broadcast(self, ranks, procs_per_node: int, nbytes: float) -> float:
        """A binomial tree, alone: ceil(log2 p) rounds of the whole message."""
        return self.alone(self.tree(ranks, procs_per_node, nbytes))

    # -- the links a communication crosses, for the shared network (``flows.Fabric``) -------------
    def capacity(self, link: tuple) -> float:
        """Bytes per second of ``link``: a GPU's port into its node's fabric, ``("gpu", direction,
        rank)``, at ``intra``'s bandwidth; or a node's adapter, ``("nic", direction, node, rail)``,
        at ``inter``'s. The network between the adapters is not a bottleneck inside one cell of
        the fabric (``cell_nodes``); the links between cells are not modelled."""
        if link[0] == "mpi":  # a transfer's own cap, at MPI's pace
            return self.mpi.bandwidth_bps
        return self.intra.bandwidth_bps if link[0] == "gpu" else self.inter.bandwidth_bps

    def over_mpi(self, transfer: Transfer, key: object) -> Transfer:
        """``transfer`` carried by MPI: capped at ``mpi``'s bandwidth (a link of its own, ``key``)."""
        if self.mpi is None or not transfer.links:
            return transfer
        return Transfer(transfer.nbytes, {**transfer.links, ("mpi", key): 1}, transfer.latency)

    def route(self, src: int, dst: int, procs_per_node: int, rail: int | None = None) -> tuple[tuple, tuple]:
        """The links a message from rank ``src`` to ``dst`` crosses: their GPU ports inside a node,
        else the sender's and the receiver's adapters (``rail``, or each rank's own)."""
        a, b = divmod(src, procs_per_node), divmod(dst, procs_per_node)
        if a[0] == b[0]:
            return ("gpu", "out", src), ("gpu", "in", dst)
        ra, rb = (a[1] % self.rails, b[1] % self.rails) if rail is None else (rail, rail)
        return ("nic", "out", a[0], ra), ("nic", "in", b[0], rb)

    def message(self, src: int, dst: int, procs_per_node: int, nbytes: float) -> Transfer:
        """A point-to-point message: one transfer over its route, after its link's latency."""
        links = dict.fromkeys(self.route(src, dst, procs_per_node), 1)
        return Transfer(nbytes, links, self.link((src, dst), procs_per_node).latency_s)

    def ring(self, ranks, procs_per_node: int, nbytes: float, elements: int | None = None) -> Transfer:
        """A ring all-reduce as the transfers it makes (what ``ring_allreduce`` charges it alone):
        each rank sends 2(p-1)/p of the bytes to its successor, spread over the channels."""
        p = len(ranks)
        if p <= 1:
            return Transfer(0.0, {}, 0.0)
        channels, links = _ring(self, tuple(ranks), procs_per_node)
        share = min(elements / (2 * p), 1.0) if self.skips_empty_segments and elements is not None else 1.0
        latency = 2 * (p - 1) * self.link(ranks, procs_per_node).latency_s * share
        return Transfer(comm.ring_allreduce_bytes(nbytes, p) / channels, links, latency)

    def gather_ring(self, ranks, procs_per_node: int, nbytes: float) -> Transfer:
        """An all-gather of ``nbytes`` a rank: the all-gather half of a ring all-reduce of p times as much."""
        p = len(ranks)
        if p <= 1:
            return Transfer(0.0, {}, 0.0)
        channels, links = _ring(self, tuple(ranks), procs_per_node)
        return Transfer((p - 1) * nbytes / channels, links, (p - 1) * self.link(ranks, procs_per_node).latency_s)

    def tree(self, ranks, procs_per_node: int, nbytes: float) -> Transfer:
        """A binomial-tree broadcast: ceil(log2 p) rounds of the whole message, one after another,
        over the links the tree's messages cross."""
        p = len(ranks)
        if p <= 1:
            return Transfer(0.0, {}, 0.0)
        rounds = math.ceil(math.log2(p))
        links = {}
        for k in range(rounds):
            for i in range(min(2**k, p - 2**k)):
                links.update(dict.fromkeys(self.route(ranks[i], ranks[i + 2**k], procs_per_node), 1))
        return Transfer(rounds * nbytes, links, rounds * self.link(ranks, procs_per_node).latency_s)


def _gbs(gigabytes_per_s: float) -> float:
    return gigabytes_per_s * 1e9


PRESETS: dict[str, Network] = {
    "juwels_booster": Network(
        "juwels_booster",
        intra=Link(latency_s=3e-6, bandwidth_bps=_gbs(300.0)),
        inter=Link(latency_s=5e-6, bandwidth_bps=_gbs(25.0)),
        rails=4,
        cell_nodes=48,
        sources={
            "node": "4x NVIDIA A100 40 GB per node, NVLink 3 between them, 4x Mellanox HDR200 InfiniBand "
            "ConnectX-6 adapters per node, one per GPU (JSC, JUWELS Booster overview, "
            "apps.fz-juelich.de/jsc/hps/juwels/booster-overview.html)",
            "rails": "4 adapters a node, one per GPU (same page); NCCL runs one ring per adapter, so a ring "
            "alone across nodes gets 4 x 25 = 100 GB/s (about 86 GB/s bus bandwidth is measured on "
            "4x HDR200 nodes: NVIDIA/nccl-tests issue 175; not fitted here)",
            "intra bandwidth": "NVLink 3: 12 links x 25 GB/s per direction = 300 GB/s per GPU per direction "
            "(600 GB/s bidirectional; NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020)",
            "inter bandwidth": "HDR200: 200 Gb/s = 25 GB/s per direction per adapter, one adapter per GPU",
            "latencies": "order of magnitude of NCCL's per-message latency on NVLink (a few us) and over "
            "InfiniBand HDR (about 5 us end to end including the NIC); not measured on JUWELS by this suite",
            "fabric": "DragonFly+ of 48-node cells, a full fat tree inside each (same page): a job of at most "
            "48 nodes placed in one cell shares only its adapters (the DASO paper's 8 and 32 nodes); the "
            "links between cells are not modelled",
        },
    ),
    # JUWELS Booster as the DASO paper ran it: NCCL (Horovod, DDP, DASO inside a node) on the
    # hardware's links, and Heat's MPI for DASO's global syncs at the pace the paper's own Table 2
    # implies (J. Big Data 2022, arXiv:2104.05588 v2; ResNet-50, ImageNet, 90 epochs, phases off).
    # It trains in 4.5606 h with a blocking global sync every batch (B=1, S=0) and in 3.2224 h with
    # one every 32 (B=32, S=0) at 32 GPUs, 1.2064 h and 0.8231 h at 128. At a per-GPU batch of 256
    # (Heat's example default; the papers state none) the difference is 0.353 s (8 nodes) and
    # 0.405 s (32 nodes) per global sync of the parameters, which the cycling phase sends in fp32
    # (102.2 MB; Heat and algorithms/daso.py cast to bfloat16 only in the blocking warm-up and
    # cool-down): a ring all-reduce across the nodes at 507 and 489 MB/s, one rate for both node
    # counts. Another batch size scales this rate and the compute time alike, so a simulated run's
    # ratio of communication to compute is Table 2's whatever the batch. A non-blocking sync is
    # not free: at 32 GPUs, B=1 S=1 (4.2545 h) saves only 22 % of what B=1 S=0 adds over the
    # compute alone (3.1792 h, B=32 S=0 less its 1/31 of B=1's extra), so compute pays 0.78 of a
    # hidden sync. tests/virtual/test_virtual.py recomputes the fit; results/tables/validation.csv marks
    # those rows ``fit``.
    "juwels_booster_heat": Network(
        "juwels_booster_heat",
        intra=Link(latency_s=3e-6, bandwidth_bps=_gbs(300.0)),
        inter=Link(latency_s=5e-6, bandwidth_bps=_gbs(25.0)),
        rails=4,
        mpi=Link(latency_s=5e-6, bandwidth_bps=_gbs(0.5)),
        mpi_overlap=0.78,
        cell_nodes=48,
        sources={
            "node": "as juwels_booster: 4x A100 per node, NVLink 3 inside, 4 HDR200 InfiniBand adapters",
            "intra bandwidth": "NVLink 3, as juwels_booster (DASO's node-local syncs are NCCL)",
            "inter bandwidth": "HDR200, as juwels_booster: NCCL's links (Horovod, DDP)",
            "rails": "4 adapters a node, as juwels_booster",
            "mpi": "0.5 GB/s a transfer: the effective rate of DASO's global synchronisation (Heat over "
            "ParaStation MPI) fitted to the DASO paper's Table 2 (J. Big Data 2022; arXiv:2104.05588 v2): "
            "B=1 against B=32 at S=0 gives 0.353 s per sync at 32 GPUs and 0.405 s at 128, a ring "
            "all-reduce of 102.2 MB of fp32 parameters (the cycling phase's type) at 507 and 489 MB/s, "
            "assuming 256 images per GPU per batch (the papers state none; the ratio of communication to "
            "compute does not depend on it)",
            "mpi_overlap": "0.78: at 32 GPUs Table 2's B=1 S=1 row (4.2545 h) against B=1 S=0 (4.5606 h) "
            "and the compute alone (3.1792 h): a hidden non-blocking sync still costs 0.78 of its time",
            "latencies": "as juwels_booster",
            "fabric": "as juwels_booster: 48-node cells",
        },
    ),
    "piz_daint": Network(
        "piz_daint",
        intra=Link(latency_s=1.3e-6, bandwidth_bps=_gbs(10.0)),  # one GPU per node: never used between GPUs
        inter=Link(latency_s=1.3e-6, bandwidth_bps=_gbs(10.0)),
        cell_nodes=384,
        sources={
            "node": "Cray XC50, one NVIDIA P100 16 GB per node (CSCS, Piz Daint; WAGMA-SGD's testbed, "
            "arXiv:2005.00124 Sec. 5)",
            "inter bandwidth": "Aries Dragonfly: about 10 GB/s injection bandwidth per node (Alverson et al., "
            "'Cray XC Series Network', Cray Inc. white paper WP-Aries01-1112, 2012)",
            "latencies": "Aries MPI point-to-point latency about 1.3 us (same white paper)",
            "fabric": "Aries dragonfly groups of 384 nodes (2 cabinets of 3 chassis, 16 four-node blades a "
            "chassis; same white paper): WAGMA-SGD's 64 and 256 nodes fit in one group, whose links are "
            "not modelled as a bottleneck; the optical global links between groups are not modelled",
        },
    ),
}


EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "networks" / "example.json"  # every field, units


def load(spec: str, inter_speed: float = 1.0) -> Network:
    """The network ``sim_network`` names: a preset, or a JSON file of a ``Network`` (``save``; the
    calibration writes this machine's, ``python -m tools.calibrate``; a user can write their
    own cluster's). ``inter_speed`` (the ``sim_inter_speed`` setting) multiplies the inter-node
    bandwidth and divides its latency: the least certain numbers of a preset, which the claims'
    verdicts are re-checked against at half and twice the speed."""
    if inter_speed != 1.0:
        net = load(spec)
        inter = Link(net.inter.latency_s / inter_speed, net.inter.bandwidth_bps * inter_speed)
        return dataclasses.replace(net, name=f"{net.name} (inter-node link x{inter_speed:g})", inter=inter)
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(
            f"unknown network {spec!r}: choose one of {', '.join(PRESETS)}, or give a JSON file of the "
            f"form of {EXAMPLE.relative_to(EXAMPLE.parents[2])} (seconds, and bytes per second)"
        )
    try:
        d = json.loads(path.read_text())
        links = Link(**d["intra"]), Link(**d["inter"])
        skips = bool(d.get("skips_empty_segments", False))
        sources, sync_s, rails = dict(d.get("sources", {})), float(d.get("sync_s", 0.0)), int(d.get("rails", 1))
        mpi = Link(**d["mpi"]) if d.get("mpi") else None
        overlap, cells = float(d.get("mpi_overlap", 0.0)), int(d.get("cell_nodes", 0))
        for_all = bool(d.get("mpi_for_all", False))
        return Network(d["name"], *links, sources, sync_s, skips, rails, mpi, overlap, for_all, cells)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"network file {spec}: {error!r}; expected the form of {EXAMPLE.relative_to(EXAMPLE.parents[2])}: "
            '"name", "intra" and "inter" as {"latency_s": seconds, "bandwidth_bps": bytes per second}, '
            'and optionally "sources", "sync_s", "skips_empty_segments", "rails", "mpi", "mpi_overlap", "mpi_for_all", "cell_nodes"'
        ) from None


def looks_like_bits(net: Network) -> list[str]:
    """The links of ``net`` whose bandwidth is beyond any machine's in bytes per second and looks
    like bits per second (8x a byte rate): ``bandwidth_bps`` counts bytes, a unit that is easy to miss."""
    fastest = {"intra": 2e12, "inter": 1e11}  # bytes/s: NVLink 5's 1.8 TB/s a GPU; an 800 Gbit/s adapter
    links = {"intra": net.intra, "inter": net.inter, **({"mpi": net.mpi} if net.mpi else {})}
    return [
        f"{name}: bandwidth_bps {link.bandwidth_bps:.3g} is {link.bandwidth_bps / 1e9:.0f} GB/s; it counts bytes "
        f"per second: if it is bits per second, divide it by 8 ({link.bandwidth_bps / 8:.3g})"
        for name, link in links.items()
        if link.bandwidth_bps > fastest.get(name, fastest["inter"])
    ]


def save(net: Network, path: Path) -> None:
    """Write ``net`` as the JSON file that ``network`` reads."""
    path.write_text(json.dumps(dataclasses.asdict(net), indent=2) + "\n")


@dataclass(frozen=True)
class Transfer:
    """What a communication puts on the network: ``nbytes`` for each of the transfers it makes in
    lockstep, the links they cross (link -> how many of them), and its latency before bytes move."""

    nbytes: float
    links: dict
    latency: float


@functools.lru_cache(maxsize=4096)
def _ring(net: Network, ranks: tuple[int, ...], procs_per_node: int) -> tuple[int, dict]:
    """A ring's channels and the links its neighbour transfers cross (link -> how many), over all
    channels: a group with g ranks on a node runs min(g, rails) rings, channel c crossing between
    nodes on adapter c (NCCL's channels); one rank a node uses its own adapter."""
    nodes: dict[int, int] = {}
    for r in ranks:
        nodes[r // procs_per_node] = nodes.get(r // procs_per_node, 0) + 1
    channels = min(net.rails, max(nodes.values())) if len(nodes) > 1 else 1
    links: dict[tuple, int] = {}
    for c in range(channels):
        for j, src in enumerate(ranks):
            for link in net.route(src, ranks[(j + 1) % len(ranks)], procs_per_node, c if channels > 1 else None):
                links[link] = links.get(link, 0) + 1
    return channels, links
