"""The seat process: `serve` on events, `reconcile` once, `show` what it keeps, `demo` and `load` a sample mesh.

Every option can come before or after the command, and from the environment; each is checked before anything
connects, and a wrong one is refused in one line with exit code 2. SIGTERM and SIGINT stop every command at any
moment: the first stops it cleanly (a held lease is given back), a second during that clean-up exits at once.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final, NamedTuple

import msgspec
import pykka

from mesh_provisioner.bus.connection import NotConnected, open_bus
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import add_router_stream, put_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.snapshot import snapshot
from mesh_provisioner.bus.verb import version
from mesh_provisioner.config import Config
from mesh_provisioner.contract import PROVISIONS, ROUTER_STREAM, VERB_SUBJECT
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.settle import Settled, settle
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.samples import BadMesh, mesh_of, sample_text
from mesh_provisioner.seat import Seat
from mesh_provisioner.show import GRAPH, READS, SHOWN, check, render, table, tables

log = logging.getLogger("mesh_provisioner.cli")

PROG: Final = "mesh-provisioner"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS: Final = ("text", "json")
# Commands that only read: quiet unless asked (their output is what they print, not the log).
QUIET_LEVEL: Final = "WARNING"


class Refused(ValueError):
    """A setting that cannot be taken; the message says which, and what it must be."""


def whole(text: str) -> int:
    """A whole number from the command line or the environment."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def number(text: str) -> float:
    """A number (of seconds) from the command line or the environment."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def seconds(text: str) -> float:
    """A time in seconds that is more than 0."""
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the time must be more than 0 seconds")
    return value


def words(text: str) -> tuple[str, ...]:
    """Comma-separated words, blanks left out."""
    return tuple(w.strip() for w in text.split(",") if w.strip())


class CliOption(NamedTuple):
    """One setting of the seat: its flag, its environment variable, the config field it fills, how it is read."""

    flag: str
    env: str
    field: str
    help: str
    read: Callable[[str], Any] = str
    metavar: str = ""


# Every setting the seat takes, each also from the environment (the README's table lists them).
OPTIONS: Final = (
    CliOption("--nats", "NATS_URL", "nats", "NATS server URL(s), comma-separated: the servers of a cluster",
           metavar="URL"),
    CliOption("--creds", "NATS_CREDS", "creds", "a NATS credentials file (JWT and NKey seed)", metavar="FILE"),
    CliOption("--nkey", "NATS_NKEY", "nkey", "an NKey seed file", metavar="FILE"),
    CliOption("--user", "NATS_USER", "user", "user name"),
    CliOption("--password", "NATS_PASSWORD", "password", "password"),
    CliOption("--token", "NATS_TOKEN", "token", "an authentication token"),
    CliOption("--tls-ca", "NATS_TLS_CA", "tls_ca", "CA certificate(s) to verify the servers with", metavar="FILE"),
    CliOption("--tls-cert", "NATS_TLS_CERT", "tls_cert", "client certificate", metavar="FILE"),
    CliOption("--tls-key", "NATS_TLS_KEY", "tls_key", "client certificate's key", metavar="FILE"),
    CliOption("--bound-reads", "MESH_PROVISIONER_BOUND_READS", "bound_reads",
           "the providers whose <provider>.bound entries are read, comma-separated", words, "LIST"),
    CliOption("--max-parallel", "MESH_PROVISIONER_MAX_PARALLEL", "max_parallel",
           "compositions at once; 0: no bound, 1: one node at a time", whole, "N"),
    CliOption("--lease-seconds", "MESH_PROVISIONER_LEASE_SECONDS", "lease_seconds",
           "the seat's lease time, the max age of its lease bucket (at least 2)", number, "SECONDS"),
    CliOption("--replicas", "MESH_PROVISIONER_REPLICAS", "replicas",
           "servers of a JetStream cluster that keep each bucket the seat creates (1 to 5)", whole, "N"),
    CliOption("--router-key", "MESH_PROVISIONER_ROUTER_KEY", "router_key",
           "the asks router's ed25519 public key (base64): answers are taken only with its signature", metavar="KEY"),
    CliOption("--metrics-addr", "MESH_PROVISIONER_METRICS_ADDR", "metrics_addr",
           "host:port serving /metrics, /healthz and /readyz", metavar="HOST:PORT"),
    CliOption("--registry", "MESH_PROVISIONER_REGISTRY", "registry",
           "the operator's registry file (TOML or JSON), written into the registry state when the seat is taken",
           metavar="FILE"),
)
LOG_OPTIONS: Final = (
    CliOption("--log-level", "MESH_PROVISIONER_LOG_LEVEL", "log_level",
           f"{', '.join(LOG_LEVELS)} (default INFO; WARNING for show, load and reconcile --dry-run)", str.upper,
           "LEVEL"),
    CliOption("--log-format", "MESH_PROVISIONER_LOG_FORMAT", "log_format",
           "text, or json: one JSON object a record (default text)", str.lower, "FORMAT"),
)


class _Parser(argparse.ArgumentParser):
    """argparse, saying a wrong command line in one line (with where to read more) and exit code 2."""

    def error(self, message: str) -> Any:  # argparse's NoReturn
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _shown(value: object) -> str:
    """A setting as it is written on the command line."""
    if isinstance(value, tuple):
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def common_options() -> _Parser:
    """The settings every command takes, before or after its name: a parent of the main parser and of each command.

    None has a default here (argparse.SUPPRESS): an option given before the command is not overwritten by the
    command's parser, and one given nowhere is read from the environment, then the config's default (`settings`).
    """
    p = _Parser(add_help=False)
    defaults = Config()
    seat = p.add_argument_group("the bus and the seat (each also from its environment variable)")
    for o in OPTIONS:
        default = _shown(getattr(defaults, o.field))
        seat.add_argument(o.flag, dest=o.field, type=o.read, default=argparse.SUPPRESS, metavar=o.metavar or None,
                          help=f"{o.help} (env {o.env}" + (f"; default {default})" if default else ")"))
    logs = p.add_argument_group("logging")
    for o in LOG_OPTIONS:
        choices = LOG_LEVELS if o.field == "log_level" else LOG_FORMATS
        logs.add_argument(o.flag, dest=o.field, type=o.read, choices=choices, default=argparse.SUPPRESS,
                          metavar=o.metavar, help=f"{o.help} (env {o.env})")
    return p


def parser() -> argparse.ArgumentParser:
    """The command line: a command and its options, and the settings every command takes, before or after it."""
    common = common_options()
    p = _Parser(prog=PROG, description=__doc__, parents=[common],
                epilog=f"'{PROG} COMMAND --help' lists a command's options.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=summary, description=summary)

    rec = command("reconcile", "take the seat's lease, compose every node and judge every key once, then exit")
    rec.add_argument("--timeout", type=seconds, default=120.0, metavar="SECONDS",
                     help="give up after this long: connecting, waiting for the lease (--wait), settling "
                          "(default 120)")
    rec.add_argument("--wait", action="store_true",
                     help="while another process holds the seat, wait for it (up to --timeout) rather than exit 2")
    rec.add_argument("--dry-run", action="store_true",
                     help="take no lease, write nothing: read the bus once and count what would change")
    rec.add_argument("--json", action="store_true", help="with --dry-run: every write, the counts and the problems, "
                                                         "as one JSON object")
    command("serve", "hold the seat (waiting as a standby while another process holds it) and run on events "
                     "until SIGTERM or SIGINT")
    demo = command("demo", "run the seat on a nats-server of its own loaded with the sample mesh, print what it "
                           "composed")
    demo.add_argument("--serve", action="store_true",
                      help="keep the seat and its server running after the tables, until interrupted")
    show_p = command("show", "print the seat's plans, provisions or refusals, or draw them as a graph")
    show_p.add_argument("what", choices=[*SHOWN, GRAPH], help="what to show; graph: Graphviz DOT of the provisions")
    show_p.add_argument("--node", default="", help="only this node's keys")
    show_p.add_argument("--module", default="", help="only this module's keys (a provision's consumer)")
    show_p.add_argument("--state", default="", help="only provisions in this state (provided, asked, waits, ...)")
    show_p.add_argument("--json", action="store_true", help='as the verb answers: {"entries": [{"key", "value"}]}')
    show_p.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS",
                        help="seconds to connect, and to read the bus, before giving up (default 10)")
    load_p = command("load", "put a mesh's states into the bus (default: the sample mesh the demo runs on)")
    load_p.add_argument("file", nargs="?", type=Path, metavar="FILE",
                        help='a mesh file: {"states": {"<module>.<state>": {"<key>": value}}} (default: the sample)')
    load_p.add_argument("--router", action="store_true",
                        help=f"also create the router's stream of asks ({ROUTER_STREAM}), as a stand-in for a router")
    load_p.add_argument("--timeout", type=seconds, default=30.0, metavar="SECONDS",
                        help="seconds to connect before giving up (default 30)")
    return p


class Settings(NamedTuple):
    """What the command line and the environment say: the seat's config, and the process's logging."""

    config: Config
    log_level: str
    log_format: str


def _from_env(o: CliOption) -> Any:
    """An option's value from its environment variable; Refused names the variable when it does not read."""
    raw = os.environ[o.env]
    try:
        return o.read(raw)
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise Refused(f"{o.env}={raw}: {err}") from None


def settings(args: argparse.Namespace) -> Settings:
    """The settings of a parsed command line, each from its flag, else its environment variable, else its default;
    Refused says the first that cannot be taken, naming where it came from."""
    given: dict[str, str] = {}  # field -> where its value came from, for the error that names it
    values: dict[str, Any] = {}
    for o in (*OPTIONS, *LOG_OPTIONS):
        if hasattr(args, o.field):
            values[o.field], given[o.field] = getattr(args, o.field), o.flag
        elif os.environ.get(o.env, "") != "":
            values[o.field], given[o.field] = _from_env(o), o.env
    level = values.pop("log_level", "")
    form = values.pop("log_format", "text")
    if level and level not in LOG_LEVELS:
        raise Refused(f"{given['log_level']}={level}: the log level is one of {', '.join(LOG_LEVELS)}")
    if form not in LOG_FORMATS:
        raise Refused(f"{given['log_format']}={form}: the log format is text or json")
    config = Config(**values)
    problems = config.problems()
    if problems:
        field, why = problems[0]
        source, shown = given.get(field, field), _shown(getattr(config, field))
        raise Refused(f"{source} {shown}: {why}" if source.startswith("--") else f"{source}={shown}: {why}")
    if not level:
        quiet = args.command in ("show", "load") or (args.command == "reconcile" and args.dry_run)
        level = QUIET_LEVEL if quiet else "INFO"
    return Settings(config, level, form)


# ---- logging ------------------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time (UTC, milliseconds), level, logger, message, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        at = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out = {"time": at, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
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
    logging.basicConfig(level=level, handlers=[handler], force=True)


def say(text: str) -> None:
    """A command's output, on stdout, at once (a test or a pipe reads it while the process runs)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ---- signals ------------------------------------------------------------------------------------------------


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the process: raised where its main thread was, so every `finally` cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """SIGTERM and SIGINT honoured at every moment, while installed (`with Signals() as s:`).

    The first sets `stop` (what waits on it ends its loop) and raises Interrupted in the main thread, out of whatever
    it waits for: connecting, the lease, settling. The `finally` blocks on the way give the lease back and stop the
    actors. A second signal during that clean-up exits at once. Installed only on the main thread (the only one
    that receives signals), and the handlers before it are put back after.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signum = 0
        self._before: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._before[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            log.warning("%s again while stopping: exiting at once, without the rest of the clean-up", name)
            logging.shutdown()
            os._exit(128 + signum)
        self.signum = signum
        self.stop.set()
        raise Interrupted(signum)


# ---- the commands -------------------------------------------------------------------------------------------


def reconcile(config: Config, timeout: float, wait: bool, stop: threading.Event) -> int:
    """Take the seat's lease, let every node compose and every key be judged, print what changed, give it back.

    `timeout` bounds the whole: connecting, the lease (with `wait`), settling. Another process holding the seat is
    said at once (exit 2) unless `wait`. The lease is held as `serve` holds it; a reconcile that loses it says so
    and exits 2 at once.
    """
    started = time.monotonic()

    def left() -> float:
        return max(timeout - (time.monotonic() - started), 0.1)

    settled = threading.Event()
    outcome: list[tuple[bool, dict[str, int]]] = []

    def wait_settled(sup: Runtime | None) -> None:
        if sup is None:
            return

        def wait() -> None:
            try:
                outcome.append((sup.wait_settled(left()), sup.store.counts()))
            finally:
                settled.set()

        threading.Thread(target=wait, name="mesh-provisioner-reconcile", daemon=True).start()

    seat = Seat(config, on_hold=wait_settled, connect_within=timeout)
    try:
        if not seat.take(stop, left() if wait else 0):
            lost = seat.closed()
            if lost:
                log.error("%s; nothing is reconciled", lost)
            else:
                holder = seat.lease_loop.run(seat.lease.current(), config.request_timeout)
                log.error("another process holds the seat%s%s; nothing is reconciled%s", _holder(holder),
                          f" still after {timeout:g} s" if wait else "",
                          "" if wait else ": --wait waits for it (up to --timeout)")
            return 2
        # Held as `serve` holds it (`Seat.hold`: the lease renewed all along); a lost lease ends it at once.
        why, _ = seat.hold(settled)
        if why:
            log.error("%s; the reconcile stops, unfinished", why)
            return 2
        if not outcome or not outcome[0][0]:
            log.error("the seat did not settle within --timeout %g s", timeout)
            return 2
        say(f"settled in {time.monotonic() - started:.2f} s: {summary(outcome[0][1])}")
        return 0
    finally:
        seat.close()


def _holder(lease: r.Lease | None) -> str:
    """Who holds the seat, in words (after "another process holds the seat")."""
    if lease is None:
        return ""
    since = f" since {lease.since.isoformat().replace('+00:00', 'Z')}" if lease.since else ""
    return f" (pid {lease.pid} on {lease.host}{since})"


def read_bus(config: Config, timeout: float, states: Sequence[str] | None = None) -> MemoryView:
    """The bus read once (its seat's states, or all it watches): connecting and reading within `timeout` each."""
    with EventLoopThread() as loop:
        nc = loop.run(open_bus(config, timeout), timeout + config.request_timeout)
        try:
            return loop.run(snapshot(nc, bound_reads=config.bound_reads, states=states, timeout=timeout), timeout + 5)
        finally:
            loop.run(nc.close(), config.request_timeout)


def dry_run(config: Config, timeout: float, as_json: bool) -> int:
    """Read the bus once, settle a copy of it in memory, and count the writes the seat would make, by state."""
    settled = settle(read_bus(config, timeout).copy(), datetime.now(UTC))
    problems = [f"{c.node}: {p}" for c in settled.composed for p in c.problems]
    counts = write_counts(settled)
    if as_json:
        writes = [{"op": "put" if isinstance(w, Put) else "delete", "state": w.state, "key": w.key,
                   **({"value": msgspec.json.decode(w.value)} if isinstance(w, Put) else {})} for w in settled.writes]
        say(msgspec.json.encode({"writes": writes, "counts": counts, "provisions": provision_counts(settled),
                                 "problems": problems, "settled": settled.settled}).decode())
    else:
        rows = [[state, str(c["put"]), str(c["delete"])] for state, c in counts.items()]
        say(table(["state", "puts", "deletes"], rows) if rows else "nothing to write")
        by_state = provision_counts(settled)
        if by_state:
            say("provisions written, by their state: " + ", ".join(f"{n} {s}" for s, n in by_state.items()))
        for problem in problems:
            say(f"problem on {problem}")
        if not settled.settled:
            say(f"the copy did not settle in {settled.rounds} rounds: the rules do not reach a fixed point on this bus")
        say(f"{len(settled.writes)} write(s) would be made")
    return 0 if settled.settled else 2


def write_counts(settled: Settled) -> dict[str, dict[str, int]]:
    """How many puts and deletes a settling makes in each state, in the order of the states."""
    counts: dict[str, dict[str, int]] = {}
    for w in settled.writes:
        c = counts.setdefault(w.state, {"put": 0, "delete": 0})
        c["put" if isinstance(w, Put) else "delete"] += 1
    return dict(sorted(counts.items()))


def provision_counts(settled: Settled) -> dict[str, int]:
    """The provisions a settling puts, by the state each is put in (its last put where one is put twice)."""
    last: dict[str, str] = {}
    for w in settled.writes:
        if isinstance(w, Put) and w.state == PROVISIONS:
            p = msgspec.json.decode(w.value, type=r.Provision)
            last[w.key] = p.state
    out: dict[str, int] = {}
    for state in last.values():
        out[state] = out.get(state, 0) + 1
    return dict(sorted(out.items()))


def summary(counts: dict[str, int]) -> str:
    """What a run wrote, in words."""
    if not any(counts.values()):
        return "nothing changed"
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items()) if n)


def serve(config: Config, stop: threading.Event) -> int:
    """Hold the seat whenever this process can, until stopped; connect for as long as it takes."""
    return Seat(config, connect_within=math.inf).serve(stop)


def demo(config: Config, keep: bool, stop: threading.Event) -> int:
    """A nats-server of its own loaded with the sample mesh, and the seat `serve` runs on it: its lease, its verb,
    its metrics. The tables once it settled; then, unless `keep`, it stops as `serve` does on SIGTERM."""
    with EmbeddedServer() as server:
        config = msgspec.structs.replace(config, nats=server.url)
        with EventLoopThread() as loop:
            nc = loop.run(open_bus(config, 30), 40)
            try:
                loop.run(put_states(nc, mesh_of(sample_text())), 30)
                loop.run(add_router_stream(nc), 30)
            finally:
                loop.run(nc.close(), 10)
        shown: list[int] = []

        def settled_then_shown(sup: Runtime) -> None:
            if not sup.wait_settled(60):
                log.error("the demo did not settle within 60 s")
                shown.append(2)
                stop.set()
                return
            say(tables(sup.view))
            shown.append(0)
            if not keep:
                stop.set()
                return
            metrics = f", metrics on http://{config.metrics_addr}/metrics" if config.metrics_addr else ""
            say(f"\nThe seat holds its lease on {server.url} and answers its verb on {VERB_SUBJECT}{metrics}.\n"
                f"In another terminal: {PROG} --nats {server.url} show provisions\n"
                "Interrupt (Ctrl-C) to stop.")

        def on_hold(sup: Runtime | None) -> None:
            if sup is not None and not shown:
                threading.Thread(target=settled_then_shown, args=(sup,), name="demo-tables", daemon=True).start()

        code = Seat(config, on_hold=on_hold).serve(stop)
        return code or (shown[0] if shown else 2)


def show(config: Config, args: argparse.Namespace) -> int:
    """Read the seat's states once (contract section 4) and print them: a table, JSON, or Graphviz DOT."""
    why = check(args.what, args.state, args.json, bool(args.node or args.module))
    if why:
        raise Refused(why)
    view = read_bus(config, args.timeout, READS)
    say(render(view, args.what, args.node, args.module, args.state, args.json))
    return 0


def load(config: Config, args: argparse.Namespace) -> int:
    """Put a mesh file's states (the sample's by default) into the bus, and say what to run next."""
    if args.file is None:
        what, text = "the sample mesh", sample_text()
    else:
        try:
            what, text = str(args.file), args.file.read_text(encoding="utf-8")
        except OSError as err:
            raise Refused(f"{args.file}: {err.strerror or err}") from None
    try:
        states = mesh_of(text)
    except BadMesh as err:
        raise Refused(f"{what}: {err}") from None
    url = ", ".join(config.servers())
    with EventLoopThread() as loop:
        nc = loop.run(open_bus(config, args.timeout), args.timeout + config.request_timeout)
        try:
            n = loop.run(put_states(nc, states, replicas=config.replicas), 60)
            made = args.router and loop.run(add_router_stream(nc, replicas=config.replicas), 30)
        finally:
            loop.run(nc.close(), config.request_timeout)
    say(f"loaded {n} key(s) of {what} into {len(states)} state(s) on {url}"
        + (f"; created the router's stream {ROUTER_STREAM}" if made else ""))
    say(f"next: {PROG} --nats {config.servers()[0]} reconcile (once) or serve (on events), then show provisions")
    return 0


# ---- main ---------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the process's exit code (2: a setting refused, or the seat held by another process)."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, --version, or a command line argparse refused (said on stderr)
        return int(done.code or 0)
    try:
        config, level, form = settings(args)
        if args.command == "reconcile" and args.json and not args.dry_run:
            raise Refused("reconcile --json goes with --dry-run")
    except Refused as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 2
    configure_logging(level, form)
    with Signals() as signals:
        try:
            return run(args, config, signals.stop)
        except Interrupted as got:
            # serve and demo --serve run until stopped: being stopped is their clean end.
            if args.command == "serve" or (args.command == "demo" and args.serve):
                log.info("stopped by %s", got)
                return 0
            log.warning("interrupted by %s: %s did not finish", got, args.command)
            return 128 + got.signum
        except Refused as err:
            log.error("%s", err)
            return 2
        except NotConnected as err:
            log.error("%s", err)
            return 1
        except Exception as err:
            log.error("%s could not run: %s", PROG, str(err) or type(err).__name__,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            return 1
        finally:
            if signals.signum:
                # An actor an interrupted start left running would keep the process alive: its thread is not a
                # daemon. Only after a signal, which ends the process: in-process, other seats' actors run too.
                pykka.ActorRegistry.stop_all(block=True, timeout=10)


def run(args: argparse.Namespace, config: Config, stop: threading.Event) -> int:
    """The command the arguments name."""
    if args.command == "reconcile":
        return dry_run(config, args.timeout, args.json) if args.dry_run else reconcile(config, args.timeout,
                                                                                        args.wait, stop)
    if args.command == "serve":
        return serve(config, stop)
    if args.command == "show":
        return show(config, args)
    if args.command == "load":
        return load(config, args)
    return demo(config, args.serve, stop)


if __name__ == "__main__":
    sys.exit(main())
