"""The seat process: `serve` on events, `reconcile` once, `demo` on an embedded bus and a sample mesh."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from mesh_provisioner.bus.connection import connect_options
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.snapshot import snapshot_of
from mesh_provisioner.config import Config
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.settle import settle
from mesh_provisioner.rules.view import DEFAULT_BOUND_READS
from mesh_provisioner.samples import sample_mesh
from mesh_provisioner.seat import Seat
from mesh_provisioner.show import tables
from mesh_provisioner.supervisor import Supervisor

log = logging.getLogger("mesh_provisioner.cli")


def parser() -> argparse.ArgumentParser:
    """The command line: global options, then a command."""
    p = argparse.ArgumentParser(prog="mesh-provisioner", description=__doc__)
    env = os.environ.get
    p.add_argument("--nats", default=env("NATS_URL", "nats://127.0.0.1:4222"),
                   help="NATS server URL(s), comma-separated (env NATS_URL)")
    p.add_argument("--bound-reads", default=env("MESH_PROVISIONER_BOUND_READS", ",".join(DEFAULT_BOUND_READS)),
                   help="the providers whose <provider>.bound entries are read, comma-separated")
    p.add_argument("--max-parallel", type=int, default=0,
                   help="compositions at once; 0: no bound, 1: one node at a time")
    p.add_argument("--log-level", default=os.environ.get("MESH_PROVISIONER_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("reconcile", help="compose every node and judge every key once, then exit")
    rec.add_argument("--timeout", type=float, default=120.0, help="seconds to settle before giving up")
    rec.add_argument("--dry-run", action="store_true", help="take no lease, write nothing: print what would change")
    sub.add_parser("serve", help="run on events until SIGTERM or SIGINT")
    demo = sub.add_parser("demo", help="run the seat on an embedded nats-server and a sample mesh")
    demo.add_argument("--serve", action="store_true", help="keep running after the tables, until interrupted")
    return p


def config_of(args: argparse.Namespace) -> Config:
    """The seat's config from the command line."""
    reads = tuple(p.strip() for p in args.bound_reads.split(",") if p.strip())
    return Config(nats=args.nats, bound_reads=reads, max_parallel=args.max_parallel)


def reconcile(config: Config, timeout: float) -> int:
    """Take the seat's lease, let every node compose and every key be judged, print what changed, give it back."""
    started = time.monotonic()
    seat = Seat(config)
    try:
        if not seat.take(threading.Event(), timeout):
            log.error("another process holds the seat's lease; nothing is reconciled")
            return 2
        sup = Supervisor.start(config, nc=seat.nc, loop=seat.loop.loop, guard=seat.lease.guard)
        try:
            if not sup.wait_settled(timeout):
                log.error("the seat did not settle within %g s", timeout)
                return 2
            counts = sup.store.counts()
        finally:
            sup.stop()
        print(f"settled in {time.monotonic() - started:.2f} s: {summary(counts)}")  # noqa: T201
        return 0
    finally:
        seat.close()


def dry_run(config: Config) -> int:
    """Read the bus once, settle a copy of it in memory, and print each write the seat would make."""
    with EventLoopThread() as loop:
        view = loop.run(snapshot_of(config.servers(), connect_options(config), bound_reads=config.bound_reads), 120)
    settled = settle(view.copy(), datetime.now(UTC))
    for w in settled.writes:
        what = "put" if isinstance(w, Put) else "delete"
        print(f"{what} {w.state} {w.key}" + (f" {w.value.decode()}" if isinstance(w, Put) else ""))  # noqa: T201
    for composed in settled.composed:
        for problem in composed.problems:
            print(f"problem on {composed.node}: {problem}")  # noqa: T201
    print(f"{len(settled.writes)} write(s) would be made")  # noqa: T201
    return 0 if settled.settled else 2


def summary(counts: dict[str, int]) -> str:
    """What a run wrote, in words."""
    if not any(counts.values()):
        return "nothing changed"
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items()) if n)


def serve(config: Config) -> int:
    """Run the seat on events, holding its lease, until SIGTERM or SIGINT; then stop cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return Seat(config).serve(stop)


def demo(config: Config, keep: bool) -> int:
    """A nats-server of its own, the sample mesh loaded, the seat run until settled, and the tables printed."""
    with EmbeddedServer() as server:
        config = Config(nats=server.url, bound_reads=config.bound_reads, max_parallel=config.max_parallel)
        with EventLoopThread() as loop:
            loop.run(load_states(server.url, sample_mesh()), 30)
        sup = Supervisor.start(config)
        try:
            if not sup.wait_settled(60):
                log.error("the demo did not settle")
                return 2
            print(tables(sup.view))  # noqa: T201
            if keep:
                print(f"\nThe seat runs on {server.url}; interrupt to stop.")  # noqa: T201
                stop = threading.Event()
                signal.signal(signal.SIGINT, lambda *_: stop.set())
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                stop.wait()
            return 0
        finally:
            sup.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the process's exit code."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    config = config_of(args)
    try:
        if args.command == "reconcile":
            return dry_run(config) if args.dry_run else reconcile(config, args.timeout)
        if args.command == "serve":
            return serve(config)
        return demo(config, args.serve)
    except Exception as err:
        log.error("mesh-provisioner could not run: %s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
