#!/usr/bin/python3
"""PyTorch TCPStore throughput: set and get operations per second with N concurrent clients on loopback.

The counterpart of build/bin/store_bench (same workload, same output format); bench/store_vs_tcpstore.sh runs
both and prints one table. Needs Debian's python3-torch, so run it with /usr/bin/python3.

    /usr/bin/python3 bench/tcpstore_bench.py [--clients 1,16,64] [--seconds 2] [--value-bytes 32] [--repeat 3]
                                             [--mode processes|threads]

Each client is its own TCPStore connection, in its own process by default (forked after torch is imported, as
ranks are separate processes; --mode threads runs them as threads of one process). The master store runs in the
parent process (its daemon thread serves every client). Each client works on its own key ("bench/<i>"); get is
TCPStore's get, which waits for the key if it is missing.

Output, one line per (operation, clients), tab-separated: impl op clients ops_per_second (best of --repeat).
"""
import argparse
import multiprocessing as mp
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)


def connect(port):
    return dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT)


def run_client(store, key, value, op, start_at, seconds):
    """Runs op from start_at for `seconds`; returns (operations, time the last one completed).

    TCPStore's set sends no reply: a client can queue sets faster than the server applies them, and the backlog
    would be served during the next measurement. A get (a round trip, answered after the queued sets) closes the
    measurement, so what counts is sets the server has applied.
    """
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    end = start_at + seconds
    n = 0
    if op == "set":
        while time.monotonic() < end:
            store.set(key, value)
            n += 1
    else:
        while time.monotonic() < end:
            store.get(key)
            n += 1
    store.get(key)
    return n, time.monotonic()


def process_worker(port, index, value, conn):
    """A client process: connects, then runs the measurements the parent sends over the pipe."""
    store = connect(port)
    key = f"bench/{index}"
    store.set(key, value)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        op, start_at, seconds = msg
        conn.send(run_client(store, key, value, op, start_at, seconds))


def measure_processes(pipes, op, seconds):
    # time.monotonic() is CLOCK_MONOTONIC, shared by all processes on the machine.
    start_at = time.monotonic() + 0.2
    for p in pipes:
        p.send((op, start_at, seconds))
    results = [p.recv() for p in pipes]
    return sum(n for n, _ in results) / (max(t for _, t in results) - start_at)


def measure_threads(stores, value, op, seconds):
    results = [(0, 0.0)] * len(stores)
    start_at = time.monotonic() + 0.2

    def body(i):
        results[i] = run_client(stores[i], f"bench/{i}", value, op, start_at, seconds)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(n for n, _ in results) / (max(t for _, t in results) - start_at)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--value-bytes", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mode", choices=["processes", "threads"], default="processes")
    args = parser.parse_args()

    master = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    port = master.port
    value = "v" * args.value_bytes
    ctx = mp.get_context("fork")
    impl = "tcpstore" if args.mode == "processes" else "tcpstore-threads"
    for n in [int(x) for x in args.clients.split(",")]:
        procs, pipes, stores = [], [], []
        if args.mode == "processes":
            for i in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=process_worker, args=(port, i, value, child), daemon=True)
                p.start()
                procs.append(p)
                pipes.append(parent)
            for p in pipes:
                assert p.recv() == "ready"
        else:
            for i in range(n):
                s = connect(port)
                s.set(f"bench/{i}", value)
                stores.append(s)
        best = {"set": 0.0, "get": 0.0}
        for _ in range(args.repeat):
            for op in ("set", "get"):
                if args.mode == "processes":
                    rate = measure_processes(pipes, op, args.seconds)
                else:
                    rate = measure_threads(stores, value, op, args.seconds)
                best[op] = max(best[op], rate)
        for op in ("set", "get"):
            print(f"{impl}\t{op}\t{n}\t{best[op]:.0f}", flush=True)
        for p in pipes:
            p.send(None)
        for p in procs:
            p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
