"""The command line and the settings it makes: each option, before or after the command or from its environment
variable, checked before anything connects; a wrong one is `Refused` in one line, naming where it came from."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NamedTuple

from mesh_provisioner.bus.verb import version
from mesh_provisioner.config import Config
from mesh_provisioner.contract import ROUTER_STREAM
from mesh_provisioner.show import GRAPH, SHOWN

# What `--help` says the process does.
DESCRIPTION: Final = (
    "The seat process: `serve` on events, `reconcile` once, `show` what it keeps, `demo` and `load` a sample mesh.\n"
    "\n"
    "Every option can come before or after the command, and from the environment; each is checked before anything\n"
    "connects, and a wrong one is refused in one line with exit code 2. SIGTERM and SIGINT stop every command at any\n"
    "moment: the first stops it cleanly (a held lease is given back), a second during that clean-up exits at once.\n"
)
PROG: Final = "mesh-provisioner"


def invoked() -> str:
    """This program as it was started, for a command line the user copies: the console script's path as typed (a
    virtualenv's `bin` need not be on PATH), else the interpreter running the package."""
    script = sys.argv[0] if sys.argv else ""
    return script if os.path.basename(script) == PROG else f"{sys.executable} -m mesh_provisioner"
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
    CliOption("--shards", "MESH_PROVISIONER_SHARDS", "shards",
           "the mesh's shard count: more than 1 lets several seat processes share the mesh, each composing the "
           "nodes of the shards it holds (every process of a mesh the same; default 1, one process holds it all)",
           whole, "N"),
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
    p = _Parser(prog=PROG, description=DESCRIPTION, parents=[common],
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
