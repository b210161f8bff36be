"""The seat process's command line: `main` parses it, sets up logging and signals, runs one command and answers the
exit code (`mesh-provisioner` and `python -m mesh_provisioner` both run it).

`options` reads the command line and the environment into settings, `commands` runs each command, `process` keeps
the process's logging and signals.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

import pykka

from mesh_provisioner.bus.connection import NotConnected
from mesh_provisioner.cli import commands
from mesh_provisioner.cli.options import PROG, Refused, parser, settings
from mesh_provisioner.cli.process import Interrupted, Signals, configure_logging
from mesh_provisioner.collector import collect_seldom
from mesh_provisioner.config import Config

log = logging.getLogger("mesh_provisioner.cli")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the process's exit code (2: a setting refused, or the seat held by another process)."""
    collect_seldom()  # the process's collector: a host embedding the seat decides its own (collector.py)
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, --version, or a command line argparse refused (said on stderr)
        return int(done.code or 0)
    try:
        config, level, form = settings(args)
        if args.command == "reconcile" and args.json and not args.dry_run:
            raise Refused("reconcile --json goes with --dry-run")
        if args.command == "demo" and hasattr(args, "nats"):  # the flag given; the environment's is left aside
            raise Refused("--nats: the demo runs on a nats-server of its own (`load` puts the sample mesh into "
                          "yours, and `serve` runs on it)")
    except Refused as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 2
    configure_logging(level, form)
    with Signals() as signals:
        code = 0
        try:
            code = run(args, config, signals.stop)
            signals.stop.set()  # done: a signal from now on is late, and this outcome stands (show, load, dry runs)
        except Interrupted:
            pass  # said below, as when the command ended on `stop`
        except Refused as err:
            log.error("%s", err)
            code = 2
        except NotConnected as err:
            log.error("%s", err)
            code = 1
        except Exception as err:
            log.error("%s could not run: %s", PROG, str(err) or type(err).__name__,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            code = 1
        finally:
            if signals.signum:
                # An actor an interrupted start left running would keep the process alive: its thread is not a
                # daemon. Only after a signal, which ends the process: in-process, other seats' actors run too.
                pykka.ActorRegistry.stop_all(block=True, timeout=10)
    if not signals.signum or signals.late:  # late: the command was done, and finished its clean-up
        return code
    name = signal.Signals(signals.signum).name
    # serve and demo --serve run until stopped: being stopped is their clean end.
    if args.command == "serve" or (args.command == "demo" and args.serve):
        log.info("stopped by %s", name)
        return code
    log.warning("interrupted by %s: %s did not finish", name, args.command)
    return 128 + signals.signum


def run(args: argparse.Namespace, config: Config, stop: threading.Event) -> int:
    """The command the arguments name."""
    if args.command == "reconcile":
        if args.dry_run:
            return commands.dry_run(config, args.timeout, args.json)
        return commands.reconcile(config, args.timeout, args.wait, stop)
    if args.command == "serve":
        return commands.serve(config, stop)
    if args.command == "show":
        return commands.show(config, args)
    if args.command == "load":
        return commands.load(config, args)
    return commands.demo(config, args.serve, stop)
