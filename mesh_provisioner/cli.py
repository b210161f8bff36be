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

from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.config import Config
from mesh_provisioner.rules.view import DEFAULT_BOUND_READS
from mesh_provisioner.samples import sample_mesh
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
    sub.add_parser("serve", help="run on events until SIGTERM or SIGINT")
    demo = sub.add_parser("demo", help="run the seat on an embedded nats-server and a sample mesh")
    demo.add_argument("--serve", action="store_true", help="keep running after the tables, until interrupted")
    return p


def config_of(args: argparse.Namespace) -> Config:
    """The seat's config from the command line."""
    reads = tuple(p.strip() for p in args.bound_reads.split(",") if p.strip())
    return Config(nats=args.nats, bound_reads=reads, max_parallel=args.max_parallel)


def reconcile(config: Config, timeout: float) -> int:
    """Start the seat, let every node compose and every key be judged, print what changed, stop."""
    started = time.monotonic()
    sup = Supervisor.start(config)
    try:
        if not sup.wait_settled(timeout):
            log.error("the seat did not settle within %g s", timeout)
            return 2
        counts = sup.store.counts()
        print(f"settled in {time.monotonic() - started:.2f} s: {summary(counts)}")  # noqa: T201
        return 0
    finally:
        sup.stop()


def summary(counts: dict[str, int]) -> str:
    """What a run wrote, in words."""
    if not any(counts.values()):
        return "nothing changed"
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items()) if n)


def serve(config: Config) -> int:
    """Run the seat on events until SIGTERM or SIGINT; then stop cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sup = Supervisor.start(config)
    log.info("serving: %d actors on %s", len(sup.children()), ", ".join(config.servers()))
    try:
        while not stop.wait(0.5):
            if sup.failed.done():
                log.error("the seat stopped: %s", sup.failed.result())
                return 1
        return 0
    finally:
        sup.stop()


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
            return reconcile(config, args.timeout)
        if args.command == "serve":
            return serve(config)
        return demo(config, args.serve)
    except Exception as err:
        log.error("mesh-provisioner could not run: %s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
