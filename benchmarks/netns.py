"""A real two-level network on one machine: one Linux network namespace per virtual node.

The local launcher runs every rank on this machine, so all of a job's traffic goes over loopback,
at memory speed: nothing between nodes is slower than within one, and an algorithm that saves
inter-node traffic (DASO's, WAGMA's) shows no advantage. Here each virtual node gets a namespace of
its own with one adapter, ``eth0``, a veth whose other end is a port of a bridge in a further
namespace; the adapter is shaped with ``tc ... tbf`` in both directions (its own egress, the
node's upload, and the bridge port's egress toward it, its download). All of a node's ranks run in
its namespace, so they share its one shaped link as a node's GPUs share its network adapter, and a
node's ranks talk to each other over the namespace's loopback, unshaped.

Nothing is linked to the machine's own namespace: traffic cannot leave the namespaces, so the
private addresses (``SUBNET``) clash with nothing, and concurrent jobs may use the same ones. Each
namespace is named ``PREFIX-<pid>-<serial>-<role>``, unique among concurrent processes; a network
removes its namespaces on leaving its ``with`` block, also when the block raises, and on SIGTERM or
SIGHUP (where those are not handled otherwise) and at the interpreter's exit; what a SIGKILL
leaves behind, ``remove_stale()`` (``python -m benchmarks.netns cleanup``) removes by its pid.

No name server is reachable from the namespaces either: c10d's warning that "the hostname of the
client socket cannot be retrieved" is that, and harmless; a rank that needs the internet (a dataset's
download, wandb online) cannot run there.

The links use ``tbf``, not ``netem`` (which a kernel may lack): they have a rate, no added delay. A
tbf lets a full bucket pass at once, so after an idle moment (a rank's compute) a burst goes at
memory speed: with the 64 KiB bucket that a GSO segment needs, a 32 KiB message after an idle moment
would cross a 25 Mbit/s link about fifty times too fast. The links therefore send packets of at most ``packet_bytes(rate)`` (the
adapters' ``gso_max_size``) through a bucket of two of them or 0.5 ms at the rate, whichever is
more: a burst gains at most 1 ms (at 25 Mbit/s; 0.5 ms from 49 Mbit/s up), and every message is
paced as a link of that rate paces it. It needs root and iproute2; ``available()`` says whether
this machine allows it, and why not.

    with netns.emulated(nodes=2, rate_mbit=200) as net:
        spawn.run_locally(main, argv, cfg, network=net)

``python -m benchmarks.netns measure --rate-mbit 200`` measures a link against its setting.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "dpbnet"
SUBNET = "10.213.0"  # node i is SUBNET.(i + 1)/24; no link reaches the machine's own network
INTERFACE = "eth0"  # each node's one adapter, the same name in every node's namespace
NETNS_DIR = "/var/run/netns"  # where ``ip netns add`` mounts a namespace
CLONE_NEWNET = 0x40000000
MAX_NODES = 250
FRAME_BYTES = 1514  # an Ethernet frame of a 1500-byte MTU, as tbf counts it
PAYLOAD_BYTES = 1448  # the TCP payload of a full frame (with timestamps): what a link of R carries is R x 1448/1514

_serial = itertools.count()
_live: dict[str, list[str]] = {}  # namespace group (PREFIX-pid-serial) -> its names, while in use
_lock = threading.Lock()
_OWNER = os.getpid()  # set again on each network's start: only its own process removes it
_previous_handlers: dict[int, object] = {}


@dataclass(frozen=True)
class Network:
    """An emulated cluster's network: node ``i`` is namespace ``namespaces[i]`` at ``addresses[i]``."""

    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    rate_mbit: float
    bridge: str  # the namespace of the bridge that joins the nodes' links
    interface: str = INTERFACE

    @property
    def nodes(self) -> int:
        return len(self.namespaces)


def available() -> tuple[bool, str]:
    """Whether networks can be made here, and if not, why: root, ``ip`` and ``tc``, a namespace made
    and removed, a bridge and a ``tbf`` in it."""
    if os.geteuid() != 0:
        return False, "emulated networks need root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"emulated networks need iproute2's {tool!r}, not found on PATH"
    name = f"{PREFIX}-{os.getpid()}-{next(_serial)}-probe"
    try:
        _ip("netns", "add", name)
    except RuntimeError as error:
        return False, f"'ip netns add' fails here: {error}"
    try:
        _ip("-n", name, "link", "add", "br0", "type", "bridge")
        _run("tc", "-n", name, "qdisc", "add", "dev", "br0", "root", *_tbf(100.0, None, 50.0))
    except RuntimeError as error:
        return False, f"a bridge with a tbf qdisc cannot be made in a namespace here: {error}"
    finally:
        _delete([name])
    return True, ""


@contextlib.contextmanager
def emulated(
    nodes: int, rate_mbit: float, *, burst_bytes: int | None = None, latency_ms: float = 50.0
) -> Iterator[Network]:
    """A network of ``nodes`` namespaces, each node's link shaped to ``rate_mbit`` Mbit/s each way.

    ``burst_bytes`` is the tbf's bucket (default: two of the links' packets, ``packet_bytes``, or
    0.5 ms at the rate, whichever is more); ``latency_ms`` bounds the time a packet may wait in the tbf's queue (its queue
    length), not a delay. Everything made is removed on leaving, also on an exception or a signal.
    """
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"an emulated network has 1 to {MAX_NODES} nodes, not {nodes}")
    if rate_mbit <= 0:
        raise ValueError(f"a link's rate must be positive, not {rate_mbit} Mbit/s")
    group = f"{PREFIX}-{os.getpid()}-{next(_serial)}"
    names = [f"{group}-n{i}" for i in range(nodes)]
    bridge = f"{group}-br"
    network = Network(tuple(names), tuple(f"{SUBNET}.{i + 1}" for i in range(nodes)), float(rate_mbit), bridge)
    made: list[str] = []
    _register(group, made)
    try:
        shape = _tbf(rate_mbit, burst_bytes, latency_ms)
        packet = str(packet_bytes(rate_mbit))
        for name in (bridge, *names):
            _ip("netns", "add", name)
            made.append(name)
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        for i, (name, address) in enumerate(zip(names, network.addresses, strict=True)):
            port = f"n{i}"  # the bridge's port toward node i; names are per namespace
            _ip("-n", bridge, "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", name)
            _ip("-n", bridge, "link", "set", port, "master", "br0")
            _ip("-n", bridge, "link", "set", port, "gso_max_size", packet)
            _ip("-n", bridge, "link", "set", port, "up")
            _run("tc", "-n", bridge, "qdisc", "add", "dev", port, "root", *shape)  # the node's download
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", INTERFACE)
            _ip("-n", name, "link", "set", INTERFACE, "gso_max_size", packet)
            _ip("-n", name, "link", "set", INTERFACE, "up")
            _ip("-n", name, "link", "set", "lo", "up")  # the node's own ranks meet over it
            _run("tc", "-n", name, "qdisc", "add", "dev", INTERFACE, "root", *shape)  # its upload
        yield network
    finally:
        _delete(made)
        _unregister(group)


def for_run(nodes: int, rate_mbit: float, queue_ms: float = 50.0) -> contextlib.AbstractContextManager[Network | None]:
    """A run's network: ``emulated(nodes, rate_mbit, latency_ms=queue_ms)`` for a positive rate (the
    ``link_mbit`` and ``link_queue_ms`` run settings), else None, the machine's own loopback."""
    return emulated(nodes, rate_mbit, latency_ms=queue_ms) if rate_mbit > 0 else contextlib.nullcontext()


def enter(name: str) -> None:
    """Move the calling thread into network namespace ``name``; every socket it opens from then on is
    that namespace's. Call it in a forked child before it opens any socket (a process's existing
    sockets stay where they were opened). Python 3.12 has ``os.setns``; before it, libc's."""
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if hasattr(os, "setns"):
            os.setns(fd, CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def current_is(name: str) -> bool:
    """Whether this process's network namespace is ``name`` (the same namespace file's inode)."""
    mine, theirs = os.stat("/proc/self/ns/net"), os.stat(os.path.join(NETNS_DIR, name))
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def ours() -> list[str]:
    """Every namespace on this machine whose name has this module's prefix, any process's."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(f"{PREFIX}-"))
    except FileNotFoundError:
        return []


def remove_stale() -> list[str]:
    """Remove the namespaces with this module's prefix whose process no longer runs (one killed by
    SIGKILL, which no handler sees); returns their names. Live processes' namespaces stay. The pids
    are read in this process's pid namespace: run it where the networks' makers run."""
    stale = []
    for name in ours():
        match = re.match(rf"{PREFIX}-(\d+)-", name)
        if match and not _running(int(match.group(1))):
            stale.append(name)
    _delete(stale)
    return stale


def tx_bytes(name: str, interface: str = INTERFACE) -> int:
    """Bytes sent so far by ``interface`` of namespace ``name`` (what crossed its shaped link)."""
    (link,) = json.loads(_run("ip", "-n", name, "-j", "-s", "link", "show", "dev", interface))
    return int(link["stats64"]["tx"]["bytes"])


PORT = 5201  # the receivers' first port


def measure(network: Network, megabytes: float = 20.0, src: int = 0, dst: int = 1, timeout_s: float = 120.0) -> float:
    """Send ``megabytes`` over one TCP connection from a process in node ``src`` to one in node
    ``dst``; returns the payload rate in Mbit/s, from the first byte sent to the receiver's
    acknowledgement of the last. The payload rate is a few percent under the link's: tbf counts
    each packet's TCP/IP and Ethernet headers (66 of every 1514 bytes)."""
    (rate,) = measure_flows(network, megabytes, 1, src, dst, timeout_s)
    return rate


def measure_flows(
    network: Network, megabytes: float, flows: int, src: int = 0, dst: int = 1, timeout_s: float = 120.0
) -> list[float]:
    """``flows`` connections from node ``src`` to ``dst`` at once, each sending ``megabytes`` between
    a process pair of its own (two ranks of a node sending to the other node at once, as D-PSGD's do);
    returns each one's payload rate in Mbit/s. Sharing one link, together they get what one alone gets."""
    nbytes = int(megabytes * 1e6)
    pipes = [os.pipe() for _ in range(flows)]

    def one(i: int) -> None:
        (elapsed,) = message_times(network, nbytes, 0.0, 1, src, dst, timeout_s, port=PORT + i)
        os.write(pipes[i][1], json.dumps(elapsed).encode())

    children = [fork_child(lambda i=i: one(i)) for i in range(flows)]
    for _, w in pipes:
        os.close(w)
    try:
        codes = [wait_child(pid, timeout_s) for pid in children]
        if any(codes):
            raise RuntimeError(f"the flows failed (exit codes {codes})")
        return [nbytes * 8 / json.loads(os.read(r, 256).decode()) / 1e6 for r, _ in pipes]
    finally:
        for r, _ in pipes:
            os.close(r)


def message_times(
    network: Network,
    nbytes: int,
    gap_s: float,
    reps: int = 12,
    src: int = 0,
    dst: int = 1,
    timeout_s: float = 120.0,
    port: int = PORT,
) -> list[float]:
    """Send ``reps`` messages of ``nbytes`` from node ``src`` to ``dst`` over one TCP connection, each
    after ``gap_s`` of idle (as a message after a rank's compute); returns each one's seconds until
    the receiver's acknowledgement. A link of the network's rate takes ``nbytes`` over its payload
    rate whatever the gap: what a tbf's bucket would let through at once is the difference."""
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()

    def receive() -> None:
        os.close(ready_r)
        enter(network.namespaces[dst])
        with socket.create_server((network.addresses[dst], port)) as server:
            os.write(ready_w, b"r")
            server.settimeout(timeout_s)
            connection, _ = server.accept()
            with connection:
                connection.settimeout(timeout_s)
                buffer = bytearray(1 << 20)
                for _ in range(reps):
                    left = nbytes
                    while left > 0:
                        got = connection.recv_into(buffer, min(left, len(buffer)))
                        if not got:
                            raise ConnectionError(f"the sender closed with {left} bytes to come")
                        left -= got
                    connection.sendall(b"k")

    def send() -> None:
        enter(network.namespaces[src])
        with socket.create_connection((network.addresses[dst], port), timeout=timeout_s) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            payload, times = bytes(nbytes), []
            for _ in range(reps):
                time.sleep(gap_s)
                start = time.perf_counter()
                connection.sendall(payload)
                if connection.recv(1) != b"k":
                    raise ConnectionError("no acknowledgement from the receiver")
                times.append(time.perf_counter() - start)
            os.write(result_w, json.dumps(times).encode())

    receiver = fork_child(receive)
    os.close(ready_w)
    try:
        if os.read(ready_r, 1) != b"r":
            raise RuntimeError("the receiver did not start listening")
        sender = fork_child(send)
        os.close(result_w)
        codes = [wait_child(pid, timeout_s) for pid in (sender, receiver)]
        if any(codes):
            raise RuntimeError(f"the messages failed (sender, receiver exit codes {codes})")
        return json.loads(os.read(result_r, 1 << 16).decode())
    finally:
        os.close(ready_r)
        os.close(result_r)


def fork_child(work) -> int:
    """Run ``work()`` in a forked child that never returns into the caller; exit code 0 if it ran."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        except BaseException as error:  # noqa: BLE001 - the parent sees the exit code
            print(f"netns measure: {type(error).__name__}: {error}", file=sys.stderr)
        finally:
            os._exit(code)
    return pid


def wait_child(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.02)


def packet_bytes(rate_mbit: float) -> int:
    """The largest packet the links send (their adapters' ``gso_max_size``): one Ethernet frame, or
    0.1 ms at the rate where that is more (fewer packets for the cores to move at Gbit/s), at most a
    full GSO segment."""
    return min(65536, max(FRAME_BYTES, int(rate_mbit * 1e6 / 8 * 1e-4)))


def _tbf(rate_mbit: float, burst_bytes: int | None, latency_ms: float) -> list[str]:
    """A tbf's arguments: a bucket of two packets or 0.5 ms at the rate, whichever is more (a bucket
    of one frame holds the link under its rate: the next packet waits for the bucket to refill)."""
    burst = burst_bytes or max(2 * packet_bytes(rate_mbit), int(rate_mbit * 1e6 / 8 * 5e-4))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", f"{latency_ms:g}ms"]


def _run(*args: str) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise RuntimeError(f"{' '.join(args)}: {error}") from error
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done.stdout


def _ip(*args: str) -> str:
    return _run("ip", *args)


def _delete(names: list[str]) -> None:
    """Remove namespaces (their veths and bridge go with them); one that fails does not stop the rest."""
    for name in reversed(names):
        if os.path.exists(os.path.join(NETNS_DIR, name)):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=60, check=False)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _register(group: str, made: list[str]) -> None:
    """Track a network's namespaces for the exit and signal handlers, which are installed with the
    first live network: a SIGTERM's default ends the process at once, without leaving ``with``."""
    global _OWNER
    with _lock:
        first = not _live
        _live[group] = made
        _OWNER = os.getpid()
    if first and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:
                _previous_handlers[signum] = signal.signal(signum, _on_signal)


def _unregister(group: str) -> None:
    with _lock:
        _live.pop(group, None)
        last = not _live
    if last and threading.current_thread() is threading.main_thread():
        for signum, handler in list(_previous_handlers.items()):
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, handler)
            del _previous_handlers[signum]


def _remove_live() -> None:
    if os.getpid() != _OWNER:  # a forked child (a rank) inherits the registry, not the namespaces
        return
    with _lock:
        groups = list(_live.values())
        _live.clear()
    for made in groups:
        _delete(made)


def _on_signal(signum: int, _frame) -> None:
    """Remove the live networks, then end as the signal's default would (a forked rank just ends)."""
    _remove_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_remove_live)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.netns", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure_ = commands.add_parser("measure", help="send data between 2 emulated nodes; print the rate")
    measure_.add_argument("--rate-mbit", type=float, default=200.0, help="the links' rate (default 200)")
    measure_.add_argument("--megabytes", type=float, default=20.0, help="how much to send (default 20 MB)")
    measure_.add_argument("--flows", type=int, default=1, help="connections sending at once, each its own (default 1)")
    commands.add_parser("cleanup", help="remove namespaces left by processes that no longer run")
    args = parser.parse_args(argv)
    if args.command == "cleanup":
        removed = remove_stale()
        print(f"removed {len(removed)} stale namespaces" + "".join(f"\n  {n}" for n in removed))
        left = ours()
        if left:
            print(f"{len(left)} namespaces of running processes stay:" + "".join(f"\n  {n}" for n in left))
        return 0
    ok, reason = available()
    if not ok:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    with emulated(2, args.rate_mbit) as network:
        rates = measure_flows(network, args.megabytes, args.flows)
        sent = tx_bytes(network.namespaces[0])
    rate = len(rates) * min(rates)  # every byte over the time the last flow took
    what = f"{args.megabytes:g} MB" if args.flows == 1 else f"{args.flows} x {args.megabytes:g} MB at once"
    each = f" ({', '.join(f'{r:.1f}' for r in rates)} each)" if args.flows > 1 else ""
    print(
        f"{what} from node 0 to node 1: {rate:.1f} Mbit/s measured{each}, {args.rate_mbit:g} Mbit/s "
        f"configured ({rate / args.rate_mbit - 1:+.1%}); node 0's link sent {sent / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
