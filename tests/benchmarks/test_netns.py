"""The emulated two-level network (``benchmarks/netns.py``): made and removed whole, shaped to its
rate, and the local launcher's ranks each in their node's namespace.

Every test needs root and ``ip netns``; elsewhere they skip and say why. The multi-process ones run
in a subprocess: the launcher forks its ranks, which a pytest process that has run torch must not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import launcher, netns

ROOT = Path(__file__).resolve().parents[2]
OK, WHY = netns.available()
needs_netns = pytest.mark.skipif(not OK, reason=f"no emulated network here: {WHY}")


def test_unavailable_says_why(monkeypatch):
    """Without root, no namespace is tried: ``available()`` says why, and the callers skip with it."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns.available() == (False, "emulated networks need root (ip netns, tc)")


def _mine() -> list[str]:
    """This process's namespaces (other sessions' tests may have theirs at the same time)."""
    return [n for n in netns.ours() if n.startswith(f"{netns.PREFIX}-{os.getpid()}-")]


def _ip_json(namespace: str, *args: str) -> list[dict]:
    return json.loads(subprocess.run(["ip", "-n", namespace, "-j", *args], capture_output=True, check=True).stdout)


@needs_netns
def test_made_and_removed():
    with netns.emulated(3, 100.0) as net:
        assert len(net.namespaces) == 3 and set(net.namespaces) | {net.bridge} <= set(_mine())
        for name, address in zip(net.namespaces, net.addresses, strict=True):
            links = {link["ifname"]: link for link in _ip_json(name, "addr", "show")}
            assert set(links) == {"lo", netns.INTERFACE}  # no way out of the namespace
            assert "UP" in links["lo"]["flags"]
            assert [a["local"] for a in links[netns.INTERFACE]["addr_info"] if a["family"] == "inet"] == [address]
        qdiscs = subprocess.run(
            ["tc", "-n", net.namespaces[1], "qdisc", "show", "dev", netns.INTERFACE], capture_output=True, text=True
        ).stdout
        toward = subprocess.run(["tc", "-n", net.bridge, "qdisc", "show", "dev", "n1"], capture_output=True, text=True)
        assert "tbf" in qdiscs and "100Mbit" in qdiscs  # the node's upload
        assert "tbf" in toward.stdout and "100Mbit" in toward.stdout  # and its download
    assert _mine() == []

    with pytest.raises(RuntimeError, match="in the body"), netns.emulated(2, 100.0) as net:
        assert set(net.namespaces) <= set(_mine())
        raise RuntimeError("in the body")
    assert _mine() == []


SIGNALLED = """
import sys, time
from benchmarks import launcher, netns
with netns.emulated(2, 100.0) as net:
    print(" ".join((*net.namespaces, net.bridge)), flush=True)
    time.sleep(120)
"""


@needs_netns
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_removed_after_a_signal(signum):
    """SIGTERM: the process removes its namespaces on its way out. SIGKILL leaves them, and
    ``remove_stale`` removes them by their dead pid."""
    proc = subprocess.Popen([sys.executable, "-c", SIGNALLED], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 3 and set(names) <= set(netns.ours())
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == -signum
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if signum == signal.SIGKILL:
        assert set(names) <= set(netns.ours())
        assert set(names) <= set(netns.remove_stale())
    assert not set(names) & set(netns.ours())


@needs_netns
@pytest.mark.slow  # forks a sender and a receiver
def test_shaped_rate():
    """40 MB at 200 Mbit/s (1.6 s) arrive within 15 % of the rate (TCP/IP headers take 4.4 % of it)."""
    rate = 200.0
    with netns.emulated(2, rate) as net:
        measured = netns.measure(net, megabytes=40.0)
        sent = netns.tx_bytes(net.namespaces[0])
    assert abs(measured / rate - 1) < 0.15, f"{measured:.1f} Mbit/s measured on a {rate:g} Mbit/s link"
    assert sent >= 40e6
    assert _mine() == []


@needs_netns
@pytest.mark.slow  # forks two senders and two receivers
def test_two_flows_share_a_nodes_link():
    """Two connections from node 0 to node 1 at once (D-PSGD's two ranks of a node, each sending to
    the other node) get together what one alone gets, within 15 %, and each about half of it: the
    sharing the virtual cluster charges (max-min over the node's link)."""
    rate = 100.0
    with netns.emulated(2, rate) as net:
        each = netns.measure_flows(net, megabytes=8.0, flows=2)
    together = 2 * min(each)
    assert abs(together / rate - 1) < 0.15, f"{each} Mbit/s each on a {rate:g} Mbit/s link"
    assert all(0.35 < r / rate < 0.65 for r in each), f"{each} Mbit/s each on a {rate:g} Mbit/s link"
    assert _mine() == []


@needs_netns
@pytest.mark.slow  # forks a sender and a receiver
def test_a_message_after_idle_is_paced_at_the_rate():
    """A tbf's full bucket passes at once: with the 64 KiB one a GSO segment needs, 32 KiB after 20 ms
    of idle took 0.2 ms at 25 Mbit/s. With one-frame packets and a bucket of two, the link paces it."""
    rate, nbytes = 25.0, 32768
    alone = nbytes / (rate * 1e6 / 8 * netns.PAYLOAD_BYTES / netns.FRAME_BYTES)  # 10.96 ms
    with netns.emulated(2, rate) as net:
        times = sorted(netns.message_times(net, nbytes, gap_s=0.02, reps=8))
    median = times[len(times) // 2]
    assert 0.85 * alone < median < 1.3 * alone, f"{median * 1e3:.2f} ms for what the rate gives {alone * 1e3:.2f} ms"
    assert _mine() == []


RANKS = """
import fcntl, json, socket, struct, sys
import torch
import torch.distributed as dist
from benchmarks import launcher, netns, spawn

out, per_node = sys.argv[1], 2

def address(interface):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFADDR
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])

def rank(argv):
    launch = launcher.detect()
    launcher.init_process_group(launch, 120.0, torch.device("cpu"))
    namespaces = argv
    node = launch.rank // per_node
    mine = {"rank": launch.rank, "node": node, "address": address(netns.INTERFACE),
            "in_node_namespace": netns.current_is(namespaces[node]), "master": launch.master_addr}
    t = torch.full((1 << 22,), float(launch.rank + 1))  # 16 MB: the inter-node ring carries it
    dist.all_reduce(t)
    mine["sum"] = t[0].item()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, mine)
    if launch.rank == 0:
        with open(out, "w") as f:
            json.dump(seen, f)
    dist.destroy_process_group()
    return 0

with netns.emulated(2, 400.0) as net:
    code, reason = spawn.spawn_local(rank, list(net.namespaces), 2, per_node, 1, network=net)
    sent = [netns.tx_bytes(n) for n in net.namespaces]
    print(json.dumps({"code": code, "reason": reason, "addresses": net.addresses, "sent": sent}))
"""


@needs_netns
def test_gloo_ranks_in_their_nodes_namespaces(tmp_path):
    """2 nodes x 2 ranks: each rank is in its node's namespace at its node's address, and an
    all_reduce over gloo crosses the shaped links."""
    out = tmp_path / "ranks.json"
    done = subprocess.run(
        [sys.executable, "-c", RANKS, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, (result, done.stderr)
    ranks = json.loads(out.read_text())
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for r in ranks:
        assert r["in_node_namespace"], r
        assert r["address"] == result["addresses"][r["node"]]
        assert r["master"] == result["addresses"][0]
        assert r["sum"] == 10.0
    assert min(result["sent"]) > 4e6  # each node sent its share of 16 MB over its own link


@needs_netns
def test_the_link_mbit_setting_runs_on_a_link_of_that_rate(tmp_path, run_benchmark):
    """``--set link_mbit=R``: the run's nodes talk over links of R Mbit/s, so its time is at least its
    inter-node bytes at that rate (a ring all-reduce on 2 nodes sends each node's share once each way
    over its link: rank 0's sent bytes)."""
    out, rate = tmp_path / "run", 8.0
    done = run_benchmark(
        *("--algorithm", "ddp", "--task", "digits", "--nodes", "2", "--procs-per-node", "2", "--seed", "0"),
        *("--out", out, "--set", "wandb=false", "--set", "epochs=1", "--set", f"link_mbit={rate}"),
        *("--set", "device=cpu"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    at_rate = summary["sent_mb"] * 1e6 * 8 / (rate * 1e6)
    assert at_rate > 1.0 and summary["wall_s"] >= 0.9 * at_rate, (summary["wall_s"], at_rate)
    assert _mine() == []  # the run removed its network


def test_the_link_mbit_setting_is_refused_where_it_cannot_work(monkeypatch):
    """Refused before launch with the reason: negative, on the simulated clock, without ip netns."""
    from benchmarks import config

    args = dict(algorithm="ddp", task="digits", nodes=2, procs_per_node=2, seed=0, out=Path("/tmp/unused"))
    with pytest.raises(config.ConfigError, match="link_mbit: must be >= 0"):
        config.resolve(**args, overrides=["link_mbit=-1"])
    with pytest.raises(config.ConfigError, match="link_mbit"):
        config.resolve(**args, overrides=["link_mbit=10", "clock=simulated"])
    with pytest.raises(config.ConfigError, match="link_queue_ms: a queue must hold something"):
        config.resolve(**args, overrides=["link_mbit=10", "link_queue_ms=0"])
    monkeypatch.setattr(netns, "available", lambda: (False, "emulated networks need root (ip netns, tc)"))
    cfg = config.resolve(**args, overrides=["link_mbit=10", "device=cpu"])
    with pytest.raises(config.ConfigError, match=r"no emulated network here \(emulated networks need root"):
        config.check_launch(cfg, None)
    srun = launcher.Launch(0, 4, "srun", "host", 1234, "1", local_rank=0, local_size=2)
    with pytest.raises(config.ConfigError, match="not under srun"):
        config.check_launch(cfg, srun)
