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
from typing import Final, NamedTuple

import msgspec

from mesh_provisioner.bus.connection import connect_options
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import load_states, router_stream
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.snapshot import snapshot_of
from mesh_provisioner.config import Config
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.settle import settle
from mesh_provisioner.samples import sample_mesh
from mesh_provisioner.seat import Seat
from mesh_provisioner.show import GRAPH, READS, SHOWN, check, render, tables
from mesh_provisioner.supervisor import Supervisor

log = logging.getLogger("mesh_provisioner.cli")


class Option(NamedTuple):
    """One setting of the command line: its flag, its environment variable, and the config field it fills."""

    flag: str
    env: str
    field: str
    help: str
    kind: type = str


# Every setting the seat takes, each also from the environment (the README's table lists them).
OPTIONS: Final = (
    Option("--nats", "NATS_URL", "nats", "NATS server URL(s), comma-separated: a cluster"),
    Option("--creds", "NATS_CREDS", "creds", "a NATS credentials file (JWT and NKey seed)"),
    Option("--nkey", "NATS_NKEY", "nkey", "an NKey seed file"),
    Option("--user", "NATS_USER", "user", "user name"),
    Option("--password", "NATS_PASSWORD", "password", "password"),
    Option("--token", "NATS_TOKEN", "token", "an authentication token"),
    Option("--tls-ca", "NATS_TLS_CA", "tls_ca", "CA certificate(s) to verify the servers with"),
    Option("--tls-cert", "NATS_TLS_CERT", "tls_cert", "client certificate"),
    Option("--tls-key", "NATS_TLS_KEY", "tls_key", "client certificate's key"),
    Option("--bound-reads", "MESH_PROVISIONER_BOUND_READS", "bound_reads",
           "the providers whose <provider>.bound entries are read, comma-separated"),
    Option("--max-parallel", "MESH_PROVISIONER_MAX_PARALLEL", "max_parallel",
           "compositions at once; 0: no bound, 1: one node at a time", int),
    Option("--lease-seconds", "MESH_PROVISIONER_LEASE_SECONDS", "lease_seconds",
           "the seat's lease time, the max age of its lease bucket", float),
    Option("--replicas", "MESH_PROVISIONER_REPLICAS", "replicas",
           "servers of a JetStream cluster that keep each bucket the seat creates", int),
    Option("--router-key", "MESH_PROVISIONER_ROUTER_KEY", "router_key",
           "the asks router's ed25519 public key (base64): answers are taken only with its signature"),
    Option("--metrics-addr", "MESH_PROVISIONER_METRICS_ADDR", "metrics_addr",
           "host:port serving /metrics, /healthz and /readyz"),
    Option("--registry", "MESH_PROVISIONER_REGISTRY", "registry",
           "the operator's registry file (TOML or JSON), written into the registry state when the seat is taken"),
)


def parser() -> argparse.ArgumentParser:
    """The command line: global options, then a command."""
    p = argparse.ArgumentParser(prog="mesh-provisioner", description=__doc__)
    defaults = Config()
    for o in OPTIONS:
        default = getattr(defaults, o.field)
        shown = ",".join(default) if isinstance(default, tuple) else default
        p.add_argument(o.flag, dest=o.field, type=o.kind, default=o.kind(os.environ.get(o.env, shown)),
                       help=f"{o.help} (env {o.env})")
    p.add_argument("--log-level", default=os.environ.get("MESH_PROVISIONER_LOG_LEVEL", "INFO"),
                   help="DEBUG, INFO, WARNING or ERROR (env MESH_PROVISIONER_LOG_LEVEL)")
    p.add_argument("--log-format", choices=("text", "json"),
                   default=os.environ.get("MESH_PROVISIONER_LOG_FORMAT", "text"),
                   help="one line of text, or one JSON object, per record (env MESH_PROVISIONER_LOG_FORMAT)")
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("reconcile", help="compose every node and judge every key once, then exit")
    rec.add_argument("--timeout", type=float, default=120.0, help="seconds to settle before giving up")
    rec.add_argument("--dry-run", action="store_true", help="take no lease, write nothing: print what would change")
    sub.add_parser("serve", help="run on events until SIGTERM or SIGINT")
    demo = sub.add_parser("demo", help="run the seat on an embedded nats-server and a sample mesh")
    demo.add_argument("--serve", action="store_true", help="keep running after the tables, until interrupted")
    show_p = sub.add_parser("show", help="print the seat's plans, provisions or refusals, or draw them as a graph")
    show_p.add_argument("what", choices=[*SHOWN, GRAPH], help="what to show; graph: Graphviz DOT of the provisions")
    show_p.add_argument("--node", default="", help="only this node's keys")
    show_p.add_argument("--module", default="", help="only this module's keys (a provision's consumer)")
    show_p.add_argument("--state", default="", help="only provisions in this state (provided, asked, waits, ...)")
    show_p.add_argument("--json", action="store_true", help='as the verb answers: {"entries": [{"key", "value"}]}')
    show_p.add_argument("--timeout", type=float, default=30.0, help="seconds to read the bus before giving up")
    return p


def config_of(args: argparse.Namespace) -> Config:
    """The seat's config from the command line."""
    values = {o.field: getattr(args, o.field) for o in OPTIONS}
    values["bound_reads"] = tuple(p.strip() for p in values["bound_reads"].split(",") if p.strip())
    return Config(**values)


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message, and the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(out).decode()


def configure_logging(level: str, form: str) -> None:
    """The process's logging: to stderr, as text or JSON (the seat itself never configures logging)."""
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def reconcile(config: Config, timeout: float) -> int:
    """Take the seat's lease, let every node compose and every key be judged, print what changed, give it back.

    The lease is held as `serve` holds it (`Seat.hold`: renewed all along); a reconcile that loses it says so and
    exits 2 at once.
    """
    started = time.monotonic()
    settled = threading.Event()
    outcome: list[tuple[bool, dict[str, int]]] = []

    def wait_settled(sup: Supervisor | None) -> None:
        if sup is None:
            return

        def wait() -> None:
            try:
                outcome.append((sup.wait_settled(max(timeout - (time.monotonic() - started), 0.1)), sup.store.counts()))
            finally:
                settled.set()

        threading.Thread(target=wait, name="mesh-provisioner-reconcile", daemon=True).start()

    seat = Seat(config, on_hold=wait_settled)
    try:
        if not seat.take(threading.Event(), timeout):
            log.error("%s; nothing is reconciled", seat.closed() or "another process holds the seat's lease")
            return 2
        why, _ = seat.hold(settled)
        if why:
            log.error("%s; the reconcile stops, unfinished", why)
            return 2
        if not outcome or not outcome[0][0]:
            log.error("the seat did not settle within %g s", timeout)
            return 2
        print(f"settled in {time.monotonic() - started:.2f} s: {summary(outcome[0][1])}")  # noqa: T201
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
        config = msgspec.structs.replace(config, nats=server.url)
        with EventLoopThread() as loop:
            loop.run(load_states(server.url, sample_mesh()), 30)
            loop.run(router_stream(server.url), 30)
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


def show(config: Config, args: argparse.Namespace) -> int:
    """Read the seat's states once (contract section 4) and print them: a table, JSON, or Graphviz DOT."""
    why = check(args.what, args.state, args.json, bool(args.node or args.module))
    if why:
        log.error("%s", why)
        return 2
    # One try at each server: a reader that cannot reach the bus says so rather than waiting for ever.
    options = {**connect_options(config), "max_reconnect_attempts": 1}
    with EventLoopThread() as loop:
        view = loop.run(snapshot_of(config.servers(), options, bound_reads=config.bound_reads, states=READS,
                                    timeout=args.timeout), args.timeout + 5)
    print(render(view, args.what, args.node, args.module, args.state, args.json))  # noqa: T201
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the process's exit code."""
    args = parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    config = config_of(args)
    try:
        if args.command == "reconcile":
            return dry_run(config) if args.dry_run else reconcile(config, args.timeout)
        if args.command == "serve":
            return serve(config)
        if args.command == "show":
            return show(config, args)
        return demo(config, args.serve)
    except Exception as err:
        log.error("mesh-provisioner could not run: %s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
