"""``benchmarks.virtual.flows`` against SimGrid's flow-level network model on small patterns.

Each pattern is a table of links (bandwidth in bytes per second, latency in seconds) and a list of
flows (source host, destination host, bytes, start time, path: the links in the order crossed, each
with its direction). The same pattern is built in SimGrid (hosts in one full zone, a split-duplex
link per table row, an explicit route per host pair) and in ``Fabric`` (one resource per link and
direction, ``("l1", "up")``), and every flow's completion time is compared.

SimGrid's settings, each checked to matter (see the notes at ``SIMGRID_ARGS``):

- ``network/model:CM02``: plain max-min sharing, without LV08's bandwidth and latency factors;
- ``network/crosstraffic:0``: otherwise a flow also loads the reverse route's links with 5 % of its
  rate (TCP acknowledgements): ``star_incast`` ends 24 % late;
- ``network/TCP-gamma:0``: otherwise a flow's rate is capped at gamma / (2 * route latency), the TCP
  window over the round-trip time (4 MiB / 0.1 s = 42 MB/s for ``one_flow``'s 50 ms); 0: no cap;
- ``network/optim:Full``: SimGrid 3.32's default, ``Lazy``, re-solves only the links it marks as
  changed, and when a flow's latency phase ends it can miss the flow's later links: in
  ``three_flows_slow_link`` the flow over l1 then l2 (20 MB/s) got a third of l1, 40 MB/s, and ended
  at 0.751 s instead of 1.501 s (with l2 first on the path, or no latency, Lazy was right). ``Full``
  solves the whole system at every event, as ``Fabric`` does.

One more difference remains, which the patterns avoid rather than configure away: CM02 weighs a flow
by its route's latency (``sharing_penalty_ = latency`` in ``network_cm02.cpp``), so that flows on one
link share it in inverse proportion to their latencies (TCP's RTT unfairness), and a flow over 0.001 s
beside one over 0.101 s gets 101/102 of the link. ``Fabric`` shares max-min fairly, without weights.
So within a pattern every flow's route has the same summed latency: where routes differ in length, a
*pad* link (a latency, and a bandwidth of 1e12 bytes/s that no flow comes near) makes up the
difference. ``_check_latencies`` checks it.

SimGrid allows one ``Engine`` per process (a second one aborts), so each pattern runs in a process of
its own: this file run as a script, the pattern as JSON on stdin, the times as JSON on stdout.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks.virtual.flows import Fabric, Flow, max_min_rates

ROOT = Path(__file__).resolve().parents[2]
DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")  # where Debian's python3-simgrid puts its module
SIMGRID_ARGS = [
    "--cfg=network/model:CM02",
    "--cfg=network/crosstraffic:0",
    "--cfg=network/TCP-gamma:0",
    "--cfg=network/optim:Full",
    "--log=root.thres:critical",  # keep SimGrid's configuration messages off stderr
]
# Both compute the same piecewise-linear schedule in floating point: the errors seen are at most
# 2.2e-16 relative. SimGrid may end a flow within its precision (``precision/work-amount``: 1e-5
# bytes, 1.7e-9 of the 1 KB flow's time); 1e-6 allows for that and still catches any difference of
# sharing, which moves a completion time by a share of a flow's duration (0.24 relative when
# crosstraffic is on, 0.999 with the Lazy update, 0.57 for TCP-gamma in ``one_flow``).
RTOL = 1e-6
PAD = 1e12  # the bandwidth of a link that only adds latency


# --- loading SimGrid -----------------------------------------------------------------------------


def load_simgrid() -> ModuleType:
    """The ``simgrid`` module: installed for this Python, or else Debian's extension module for this
    Python's ABI loaded on its own (not all of dist-packages, whose other packages are built for the
    system's Python). Raises ``ImportError`` when there is none."""
    if "simgrid" in sys.modules:
        return sys.modules["simgrid"]
    if importlib.util.find_spec("simgrid") is not None:
        return importlib.import_module("simgrid")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = DIST_PACKAGES / f"simgrid{suffix}"
        if path.exists():
            spec = importlib.util.spec_from_file_location("simgrid", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # an ImportError here says why (ABI, missing library)
            sys.modules["simgrid"] = module
            return module
    raise ImportError("SimGrid not installed: apt-get install python3-simgrid")


def simgrid_or_skip() -> ModuleType:
    try:
        return load_simgrid()
    except ImportError as error:
        pytest.skip(str(error) if "not installed" in str(error) else f"SimGrid does not import: {error}")


# --- the patterns --------------------------------------------------------------------------------


def flow(src: str, dst: str, nbytes: int, path: list, start: float = 0.0, bundle: str | None = None) -> dict:
    """A transfer of ``nbytes`` from ``src`` to ``dst`` over ``path`` (``(link, "up" | "down")`` in
    order), added at ``start``. Flows with the same ``bundle`` are one ``Fabric`` flow that moves in
    lockstep (its links' multiplicities summed); in SimGrid they are separate transfers."""
    return {
        "src": src,
        "dst": dst,
        "bytes": nbytes,
        "start": start,
        "path": [list(hop) for hop in path],
        "bundle": bundle,
    }


def up(*links: str) -> list[tuple[str, str]]:
    return [(link, "up") for link in links]


def star_path(src: int, dst: int) -> list[tuple[str, str]]:
    """Host ``src`` to host ``dst`` through the switch: up the source's link, down the destination's."""
    return [(f"h{src}", "up"), (f"h{dst}", "down")]


MB = 10**6
PATTERNS: dict[str, dict] = {
    # 100 MB at 100 MB/s after 50 ms: 1.05 s (TCP-gamma would cap it at 42 MB/s: 2.43 s).
    "one_flow": {
        "links": {"l1": (1e8, 0.05)},
        "flows": [flow("a", "b", 100 * MB, up("l1"))],
    },
    # Each gets half: both end at 2 s (plus latency).
    "two_flows_one_link": {
        "links": {"l1": (1e8, 1e-3)},
        "flows": [flow("a", "b", 100 * MB, up("l1")), flow("c", "d", 100 * MB, up("l1"))],
    },
    # l1 (120 MB/s) carries three flows, one of which also crosses l2 (20 MB/s): that one gets 20, the
    # other two 50 each; when they end, it still gets only 20. (l1 before l2 on its path is what
    # SimGrid's Lazy update got wrong: see the module's docstring.)
    "three_flows_slow_link": {
        "links": {"l1": (1.2e8, 1e-3), "l2": (2e7, 0.0)},  # l2 adds no latency: equal routes
        "flows": [
            flow("a", "d", 50 * MB, up("l1")),
            flow("b", "d", 75 * MB, up("l1")),
            flow("c", "e", 30 * MB, up("l1", "l2")),
        ],
    },
    # The parking lot: a long flow over l1, l2, l3 in a row, a short one on each. l2 (60 MB/s) is the
    # bottleneck: the long flow and s2 get 30; s1 gets 70 of l1, s3 90 of l3. Then the ends reshare.
    "parking_lot": {
        "links": {
            "l1": (1e8, 1e-4),
            "l2": (6e7, 1e-4),
            "l3": (1.2e8, 1e-4),
            "pad1": (PAD, 2e-4),
            "pad2": (PAD, 2e-4),
            "pad3": (PAD, 2e-4),
        },
        "flows": [
            flow("h0", "h3", 60 * MB, up("l1", "l2", "l3")),
            flow("h0", "h1", 100 * MB, up("l1", "pad1")),
            flow("h1", "h2", 15 * MB, up("l2", "pad2")),
            flow("h2", "h3", 45 * MB, up("l3", "pad3")),
        ],
    },
    # A second flow joins halfway: the first slows to half, and speeds up again when the second ends
    # (first: 50 MB alone by 0.5 s, 25 MB beside the second by 1 s, the last 25 MB by 1.25 s).
    "staggered": {
        "links": {"l1": (1e8, 1e-3)},
        "flows": [flow("a", "b", 100 * MB, up("l1")), flow("c", "d", 25 * MB, up("l1"), start=0.5)],
    },
    # Four hosts, each with a split-duplex link to a switch. h1, h2, h3 send to h0 (incast: h0's down
    # link shared three ways), and h0 sends to h1 at once: h0's up and h1's down link are other
    # resources than h0's down and h1's up, so that flow runs at the full 100 MB/s.
    "star_incast": {
        "links": {f"h{i}": (1e8, 5e-5) for i in range(4)},
        "flows": [
            flow("h1", "h0", 10 * MB, star_path(1, 0)),
            flow("h2", "h0", 20 * MB, star_path(2, 0)),
            flow("h3", "h0", 30 * MB, star_path(3, 0)),
            flow("h0", "h1", 100 * MB, star_path(0, 1)),
        ],
    },
    # 1 KB beside 100 MB: the small one is done in 20 us at half the link, then the big one has it all.
    "tiny_and_huge": {
        "links": {"l1": (1e8, 1e-4)},
        "flows": [flow("a", "b", 1000, up("l1")), flow("c", "d", 100 * MB, up("l1"))],
    },
    # A ring step as one Fabric bundle (h0 -> h1 -> h2 -> h3 -> h0, each member over its own up and
    # down link) beside a flow h0 -> h2, which halves the members that share h0's up or h2's down link.
    # SimGrid's members that share nothing with it end first; the bundle ends with the slowest member.
    "ring_bundle": {
        "links": {f"h{i}": (1e8, 5e-5) for i in range(4)},
        "flows": [
            *(flow(f"h{i}", f"h{(i + 1) % 4}", 100 * MB, star_path(i, (i + 1) % 4), bundle="ring") for i in range(4)),
            flow("h0", "h2", 25 * MB, star_path(0, 2)),
        ],
    },
    # Two transfers of a bundle into one host (multiplicity 2 on h0's down link) beside a third: a
    # third of the link each, as three separate flows get; the bundle joins after 0.2 s.
    "bundle_shared_link": {
        "links": {f"h{i}": (1e8, 5e-5) for i in range(4)},
        "flows": [
            flow("h1", "h0", 40 * MB, star_path(1, 0), start=0.2, bundle="pair"),
            flow("h2", "h0", 40 * MB, star_path(2, 0), start=0.2, bundle="pair"),
            flow("h3", "h0", 60 * MB, star_path(3, 0)),
        ],
    },
}


def _route_latency(pattern: dict, f: dict) -> float:
    return sum(pattern["links"][link][1] for link, _ in f["path"])


def _check_latencies(pattern: dict) -> float:
    """The routes' summed latency, the same for every flow (see the module's docstring: CM02 weighs a
    flow's share by its route's latency)."""
    latencies = {round(_route_latency(pattern, f), 15) for f in pattern["flows"]}
    assert len(latencies) == 1, f"routes of unequal latency {sorted(latencies)}: SimGrid would weigh the shares"
    return latencies.pop()


# --- the two models ------------------------------------------------------------------------------


def simgrid_times(pattern: dict) -> list[float]:
    """Each flow's completion time in SimGrid (one Engine: call once per process)."""
    sg = load_simgrid()
    engine = sg.Engine(["test_flows_simgrid", *SIMGRID_ARGS])
    zone = sg.NetZone.create_full_zone("zone")
    hosts = {}
    for f in pattern["flows"]:
        for name in (f["src"], f["dst"]):
            if name not in hosts:
                hosts[name] = zone.create_host(name, 1e9)
    links = {
        name: zone.create_split_duplex_link(name, bandwidth).set_latency(latency)
        for name, (bandwidth, latency) in pattern["links"].items()
    }
    direction = {"up": sg.LinkInRoute.Direction.UP, "down": sg.LinkInRoute.Direction.DOWN}
    routes: dict[tuple[str, str], list] = {}
    for f in pattern["flows"]:
        pair = (f["src"], f["dst"])
        if pair in routes:
            assert routes[pair] == f["path"], f"two paths from {pair[0]} to {pair[1]}"
            continue
        routes[pair] = f["path"]
        hops = [sg.LinkInRoute(links[link], direction[way]) for link, way in f["path"]]
        zone.add_route(hosts[pair[0]].netpoint, hosts[pair[1]].netpoint, None, None, hops, False)
    zone.seal()

    done: list[float | None] = [None] * len(pattern["flows"])

    def transfer(i: int, f: dict):
        def run() -> None:
            if f["start"] > 0:
                sg.this_actor.sleep_for(f["start"])
            sg.Comm.sendto_async(hosts[f["src"]], hosts[f["dst"]], int(f["bytes"])).wait()
            done[i] = sg.Engine.clock

        return run

    for i, f in enumerate(pattern["flows"]):
        sg.Actor.create(f"flow{i}", hosts[f["src"]], transfer(i, f))
    engine.run()
    return done


def simgrid_times_in_process(pattern: dict) -> list[float]:
    """``simgrid_times`` in a process of its own (this file as a script)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(pattern),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"SimGrid's run failed ({result.returncode}):\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def fabric_times(pattern: dict) -> list[float]:
    """Each flow's completion time in ``Fabric`` (a bundle's members: the bundle's)."""
    capacity = {(name, way): bandwidth for name, (bandwidth, _) in pattern["links"].items() for way in ("up", "down")}
    fabric = Fabric(capacity.__getitem__)
    groups: dict[object, list[int]] = {}
    for i, f in enumerate(pattern["flows"]):
        groups.setdefault(f["bundle"] if f["bundle"] is not None else i, []).append(i)
    members_of: list[tuple[float, list[int]]] = []
    for members in groups.values():
        first = pattern["flows"][members[0]]
        assert all(pattern["flows"][i]["bytes"] == first["bytes"] for i in members), "a bundle's members differ"
        assert all(pattern["flows"][i]["start"] == first["start"] for i in members), "a bundle's members differ"
        members_of.append((first["start"], members))
    flows: dict[int, Flow] = {}
    for start, members in sorted(members_of, key=lambda item: item[0]):  # added in time order
        first = pattern["flows"][members[0]]
        links = Counter((link, way) for i in members for link, way in pattern["flows"][i]["path"])
        added = fabric.add(start, first["bytes"], dict(links), latency=_route_latency(pattern, first))
        flows.update(dict.fromkeys(members, added))
    while (event := fabric.next_event()) is not None:
        fabric.reach(event)
    return [flows[i].done_at for i in range(len(pattern["flows"]))]


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PATTERNS))
def test_fabric_matches_simgrid(name: str) -> None:
    simgrid_or_skip()
    pattern = PATTERNS[name]
    _check_latencies(pattern)
    expected = simgrid_times_in_process(pattern)
    got = fabric_times(pattern)
    assert None not in got, f"flows never ended in Fabric: {got}"
    bundles: dict[object, list[int]] = {}
    for i, f in enumerate(pattern["flows"]):
        bundles.setdefault(f["bundle"] if f["bundle"] is not None else i, []).append(i)
    errors = {}
    for members in bundles.values():
        # a bundle ends with its slowest transfer, in SimGrid as in a ring's step
        reference = max(expected[i] for i in members)
        errors[tuple(members)] = abs(got[members[0]] - reference) / reference
    worst = max(errors.values())
    assert worst <= RTOL, f"{name}: Fabric {got} against SimGrid {expected} (relative errors {errors})"


def test_max_min_rates_parking_lot() -> None:
    """The parking lot: a long flow over l1, l2, l3 in a row, and a short one on each link, with
    capacities l1 = 10, l2 = 6, l3 = 12 (bytes/s).

    Progressive filling, by hand:

    1. Every link carries two flows; fair shares l1 10/2 = 5, l2 6/2 = 3, l3 12/2 = 6. The lowest,
       3, fills l2: the long flow and s2 freeze at 3.
    2. l1 has 10 - 3 = 7 left for s1 alone, l3 12 - 3 = 9 for s3 alone. The lower, 7, fills l1:
       s1 freezes at 7.
    3. l3's 9 fills it: s3 freezes at 9.

    Rates: long 3, s1 7, s2 3, s3 9; l1 carries 10, l2 6, l3 12, all full (no flow can gain without
    taking from one with no more than it has).
    """
    capacity = {"l1": 10.0, "l2": 6.0, "l3": 12.0}
    long = Flow(1.0, {"l1": 1, "l2": 1, "l3": 1}, 0.0)
    s1, s2, s3 = (Flow(1.0, {link: 1}, 0.0) for link in ("l1", "l2", "l3"))
    max_min_rates([long, s1, s2, s3], capacity.__getitem__)
    assert [f.rate for f in (long, s1, s2, s3)] == pytest.approx([3.0, 7.0, 3.0, 9.0], rel=1e-12)


if __name__ == "__main__":  # a SimGrid run: the pattern on stdin, its completion times on stdout
    print(json.dumps(simgrid_times(json.load(sys.stdin))))
