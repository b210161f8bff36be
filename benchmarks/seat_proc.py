"""The seat under benchmark, in a process of its own: started, timed to settled, then driven by lines on stdin.

`python -m benchmarks.seat_proc URL [--max-parallel P]` starts `Runtime.start(Config(nats=URL, ...))`, waits
for `wait_settled`, and prints one JSON line: the seconds from the start call to settled, the writes the seat made,
the keys in its cache, and the process's peak RSS so far (`VmHWM`). Then each line it reads is a command: `settle`
(wait until settled again and print the same figures), `stop` (stop the seat, print, exit).

With `--shards S` it is one process of a partitioned seat (contract 8.1): it runs as `serve` does (`Seat`, its shard
leases taken, renewed and rebalanced), and its figures are those of the runtime while it holds shards.

With `--metrics-addr HOST:PORT` it serves the seat's `/metrics` (and `/healthz`, `/readyz`) there, as `serve` does.

With `--breakdown` its figures say where its CPU went: each part the seat's ceiling does not count, and each kind of
thread (benchmarks/breakdown.py).

Its own process, so that its memory is its own and the load generator and the watch that times it do not share its
interpreter lock.
"""

from __future__ import annotations

import argparse
import gc
import json
import queue
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.breakdown import Breakdown
from mesh_provisioner.collector import Freezer, collect_seldom
from mesh_provisioner.config import Config
from mesh_provisioner.metrics import HttpEndpoint
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.seat import Seat


def rss_now() -> int:
    """The process's resident set size now, in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss() -> int:
    """The process's peak resident set size so far, in bytes (Linux: `VmHWM` of /proc/self/status, in kibibytes).

    Not getrusage's `ru_maxrss`: Linux carries into it, over the fork and exec that started the process, the peak
    of its parent's memory. A seat process started by a benchmark that held 262 MiB said 262 MiB, whatever it held.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM")


def figures(sup: Runtime, seconds: float, settled: bool, parts: Breakdown | None = None) -> dict[str, Any]:
    """What one measurement says; with `parts`, where the CPU went so far."""
    counts = sup.store.counts()
    return {
        **(parts.figures() if parts is not None else {}),
        "settled": settled,
        "seconds": seconds,
        "writes": counts["writes"],
        "conflicts": counts["conflicts"],
        "failed_writes": counts["failed writes"],
        "writes_sent_again": counts["writes sent again"],
        "keys": len(sup.view),
        "peak_rss_bytes": peak_rss(),
        "rss_bytes": rss_now(),
        "compositions": int(sup.metrics.compositions._value.get()),
        "cpu_seconds": _cpu_seconds(),
    }


def _cpu_seconds() -> float:
    """The process's CPU time so far, user and system, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.seat_proc")
    p.add_argument("url")
    p.add_argument("--max-parallel", type=int, default=Config().max_parallel,
                   help="compositions at once (default: the seat's own default)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--shards", type=int, default=0, help="one process of a partitioned seat of this many shards")
    p.add_argument("--metrics-addr", default="", help="serve the seat's /metrics on this HOST:PORT")
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="the interpreter's thread switch interval in seconds (0: Python's own, 5 ms)")
    p.add_argument("--breakdown", action="store_true",
                   help="count the CPU of the seat's parts (benchmarks/breakdown.py), in each line's figures")
    args = p.parse_args(argv)
    parts = Breakdown() if args.breakdown else None
    if parts is not None:
        parts.install()
    if args.switch_interval > 0:
        sys.setswitchinterval(args.switch_interval)
    config = Config(nats=args.url, max_parallel=args.max_parallel, request_timeout=60.0,
                    shards=max(args.shards, 1), metrics_addr=args.metrics_addr)
    gc.collect()
    base = {"rss_before_bytes": rss_now()}
    start = time.perf_counter()
    http: HttpEndpoint | None = None
    collect_seldom()  # as the seat's own process does (cli `main`)
    if args.shards:
        sup, stop = held(config)  # the seat serves its metrics itself, as `serve` does
    else:
        sup, stop = Runtime.start(config), None
        threading.Thread(target=freezing, args=(sup,), daemon=True).start()
        if args.metrics_addr:
            http = HttpEndpoint(args.metrics_addr, sup.metrics.registry, healthy=lambda: "", ready=lambda: "")
    settled = sup.wait_settled(args.timeout)
    out = figures(sup, time.perf_counter() - start, settled, parts)
    print(json.dumps({**base, **out}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "settle":
            start = time.perf_counter()
            settled = sup.wait_settled(args.timeout)
            print(json.dumps(figures(sup, time.perf_counter() - start, settled, parts)), flush=True)
        elif command == "stop":
            break
    out = figures(sup, 0.0, True, parts)
    if stop is not None:
        stop()
    else:
        sup.stop()
    if http is not None:
        http.stop()
    print(json.dumps(out), flush=True)
    return 0


def freezing(sup: Runtime) -> None:
    """Freeze what the seat holds as `serve` does (mesh_provisioner/collector.py): looked at as often as its hold
    loop does, for as long as the process runs."""
    freezer = Freezer()
    while True:
        time.sleep(0.1)
        freezer.tick(sup.quiet)


def held(config: Config) -> tuple[Runtime, Callable[[], None]]:
    """A seat process serving as `serve` does, once it holds shards: its runtime, and how to stop it."""
    running: queue.Queue[Runtime] = queue.Queue()
    stop = threading.Event()
    seat = Seat(config, on_hold=lambda sup: running.put(sup) if sup is not None else None)
    thread = threading.Thread(target=seat.serve, args=(stop,), daemon=True)
    thread.start()
    sup = running.get()

    def stopped() -> None:
        stop.set()
        thread.join(60)

    return sup, stopped


if __name__ == "__main__":
    sys.exit(main())
