"""gloo's messages over the emulated links, beside the links' own time: where a real run and its twin
part, is it the links, TCP, or gloo?

    python -m tools.gloo_links [--rate-mbit 50] [--kilobytes 175] [--reps 12]

Two nodes of ``benchmarks/netns.py`` (root), one process each (each on a core of its own), prints the
median over ``reps`` rounds, each after 10 ms idle, of: the bytes at the links' TCP payload rate
(what the virtual cluster's twin charges, less its per-message latency); a plain TCP exchange, both
ends of one connection sending the bytes at once; and, between two gloo ranks, an all-reduce of the
bytes (a ring of 2 sends half each way twice), an exchange (one ``isend`` and one ``irecv`` each, as
D-PSGD's) with the send or the receive posted first, and the exchange in 8 and in 33 rounds, each
waited for (``algorithms.comm.exchange``'s ``segments``); each round after a barrier. The "in a
loop" rows run 24 rounds of 7 ms busy compute then the operation with no barrier, as a training
loop does, less the compute alone: there the send posted first costs 2x the link
(``algorithms.comm.batch_isend_irecv`` posts receives first for this reason). gloo's rows are
prefixed "gloo". Results: docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from benchmarks import netns

GAP_S = 0.01  # idle before each round, as a rank's compute before its messages
LOOP_COMPUTE_MS = 7.0  # a digits batch on one core (docs/measurements.md), before each op of the loop rows
PORT = 29611  # the gloo ranks' rendezvous; the TCP exchange takes netns.PORT


def _median_ms(fn, reps: int, before=lambda: None) -> float:
    times = []
    for _ in range(reps):
        before()
        time.sleep(GAP_S)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def tcp_exchange_ms(network: netns.Network, nbytes: int, reps: int) -> float:
    """Both ends of one TCP connection send ``nbytes`` at once and read the other's: ms a round."""
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()

    def exchange(connection: socket.socket) -> float:
        payload, buffer = bytes(nbytes), bytearray(1 << 20)

        def one() -> None:
            writer = threading.Thread(target=connection.sendall, args=(payload,))
            writer.start()
            left = nbytes
            while left > 0:
                left -= connection.recv_into(buffer, min(left, len(buffer)))
            writer.join()

        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _median_ms(one, reps)

    def server() -> None:
        netns.enter(network.namespaces[1])
        with socket.create_server((network.addresses[1], netns.PORT)) as listening:
            os.write(ready_w, b"r")
            connection, _ = listening.accept()
            with connection:
                exchange(connection)

    def client() -> None:
        netns.enter(network.namespaces[0])
        with socket.create_connection((network.addresses[1], netns.PORT)) as connection:
            os.write(result_w, json.dumps(exchange(connection)).encode())

    pids = [netns.fork_child(server)]
    os.read(ready_r, 1)
    pids.append(netns.fork_child(client))
    codes = [netns.wait_child(pid, 120.0) for pid in pids]
    if any(codes):
        raise RuntimeError(f"the TCP exchange failed (exit codes {codes})")
    return json.loads(os.read(result_r, 256).decode())


def _gloo_rank(rank: int, network: netns.Network, nbytes: int, reps: int, result_w: int) -> None:
    netns.enter(network.namespaces[rank])
    os.environ.update(MASTER_ADDR=network.addresses[0], MASTER_PORT=str(PORT), GLOO_SOCKET_IFNAME=network.interface)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, y, peer = torch.ones(nbytes // 4), torch.empty(nbytes // 4), 1 - rank

    def exchange(rounds: int, receive_first: bool = False):
        def run() -> None:
            for a, b in zip(x.chunk(rounds), y.chunk(rounds)):
                ops = [dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]
                for work in dist.batch_isend_irecv(
                    ops[::-1] if receive_first else ops
                ):  # not comm's: its order is fixed
                    work.wait()

        return run

    def in_a_loop(op, compute_ms: float, steps: int = 24):
        """``steps`` rounds of busy compute then ``op``, no barrier between them, as a training loop
        runs: ms a round less the compute alone (measured first, on this rank)."""
        a, b = torch.randn(96, 96), torch.randn(96, 96)

        def compute() -> None:
            end = time.perf_counter() + compute_ms / 1e3
            while time.perf_counter() < end:
                a.mul_(0.5).add_(b @ b, alpha=1e-6)

        def rounds(with_op: bool) -> float:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                compute()
                if with_op:
                    op()
            return (time.perf_counter() - start) / steps * 1e3

        return rounds(True) - rounds(False)

    loops = {
        "all-reduce, in a loop": in_a_loop(lambda: dist.all_reduce(x), LOOP_COMPUTE_MS),
        "exchange, in a loop": in_a_loop(exchange(1), LOOP_COMPUTE_MS),
        "exchange, receive first, loop": in_a_loop(exchange(1, receive_first=True), LOOP_COMPUTE_MS),
    }
    timed = {
        "all-reduce": lambda: dist.all_reduce(x),
        "exchange": exchange(1),
        "exchange, receive first": exchange(1, receive_first=True),
        "exchange in 8 rounds": exchange(8),
        "exchange in 8 rounds, receive first": exchange(8, receive_first=True),
        "exchange in 33 rounds": exchange(33),
        "exchange in 33 rounds, receive first": exchange(33, receive_first=True),
    }
    out = {name: _median_ms(fn, reps, before=dist.barrier) for name, fn in timed.items()}
    out = {f"gloo {name}": ms for name, ms in (out | loops).items()}
    if rank == 0:
        os.write(result_w, json.dumps(out).encode())
    dist.destroy_process_group()


def gloo_ms(network: netns.Network, nbytes: int, reps: int) -> dict[str, float]:
    """Two gloo ranks, one a node: ms a round of each of the module docstring's operations."""
    result_r, result_w = os.pipe()
    pids = [netns.fork_child(lambda r=r: _gloo_rank(r, network, nbytes, reps, result_w)) for r in range(2)]
    codes = [netns.wait_child(pid, 300.0) for pid in pids]
    if any(codes):
        raise RuntimeError(f"the gloo ranks failed (exit codes {codes})")
    return json.loads(os.read(result_r, 1 << 16).decode())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gloo_links", description=__doc__.splitlines()[0])
    p.add_argument("--rate-mbit", type=float, default=50.0, help="the links' rate (default 50)")
    p.add_argument("--kilobytes", type=float, default=174.664, help="bytes a message, in kB (default: digits' model)")
    p.add_argument("--reps", type=int, default=12, help="rounds, of which the median is shown (default 12)")
    args = p.parse_args(argv)
    ok, why = netns.available()
    if not ok:
        print(f"error: {why}", file=sys.stderr)
        return 2
    nbytes = int(args.kilobytes * 1e3) // 4 * 4
    link_ms = nbytes / (args.rate_mbit * 1e6 / 8 * netns.PAYLOAD_BYTES / netns.FRAME_BYTES) * 1e3
    with netns.emulated(2, args.rate_mbit) as network:
        rows = {
            "the links' payload rate": link_ms,
            "TCP exchange, one connection": tcp_exchange_ms(network, nbytes, args.reps),
        }
        rows |= gloo_ms(network, nbytes, args.reps)
    print(f"{nbytes} bytes each way between 2 nodes at {args.rate_mbit:g} Mbit/s, median of {args.reps}:")
    for name, ms in rows.items():
        print(f"  {name:<42} {ms:7.1f} ms  {ms / link_ms:5.2f}x the link")
    return 0


if __name__ == "__main__":
    sys.exit(main())
