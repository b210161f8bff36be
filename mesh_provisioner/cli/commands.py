"""The commands: `serve` on events, `reconcile` once (or `--dry-run`), `show` what the seat keeps, `demo` and `load`
a sample mesh. Each answers the process's exit code; what it prints goes to stdout (`say`)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from mesh_provisioner.bus.connection import LOAD_CONNECTION, READ_CONNECTION, open_bus
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import add_router_stream, put_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.snapshot import snapshot
from mesh_provisioner.cli.options import Refused, invoked
from mesh_provisioner.config import Config
from mesh_provisioner.contract import PROVISIONS, ROUTER_STREAM, VERB_SUBJECT
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.settle import Settled, settle
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.samples import BadMesh, mesh_of, sample_text
from mesh_provisioner.seat import Seat
from mesh_provisioner.show import READS, check, render, table, tables

log = logging.getLogger("mesh_provisioner.cli")


def say(text: str) -> None:
    """A command's output, on stdout, at once (a test or a pipe reads it while the process runs)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def reconcile(config: Config, timeout: float, wait: bool, stop: threading.Event) -> int:
    """Take the seat's lease, let every node compose and every key be judged, print what changed, give it back.

    `timeout` bounds the whole: connecting, the lease (with `wait`), settling. Another process holding the seat is
    said at once (exit 2) unless `wait`. The lease is held as `serve` holds it; a reconcile that loses it says so
    and exits 2 at once.
    """
    started = time.monotonic()

    def left() -> float:
        return max(timeout - (time.monotonic() - started), 0.1)

    outcome: list[tuple[bool, dict[str, int]]] = []

    def wait_settled(sup: Runtime | None) -> None:
        if sup is None:
            return

        def wait() -> None:
            # Settled or not by the timeout, holding ends as a signal ends it: on `stop`. Not settled once a signal
            # stopped the seat is no outcome: the signal is said, not a timeout.
            try:
                settled = sup.wait_settled(left())
                if settled or not stop.is_set():
                    outcome.append((settled, sup.store.counts()))
            except Exception as err:  # the runtime stopped under it (its connection closed, say)
                log.error("the seat's settling could not be waited for: %s", err)
            finally:
                stop.set()

        threading.Thread(target=wait, name="mesh-provisioner-reconcile", daemon=True).start()

    seat = Seat(config, on_hold=wait_settled, connect_within=timeout)
    try:
        if not seat.take(stop, left() if wait else 0):
            if stop.is_set():
                return 2  # stopped by a signal: `main` says so
            lost = seat.closed()
            if lost:
                log.error("%s; nothing is reconciled", lost)
            else:
                # A partitioned seat holds no `holder` key: the lease says which of its processes holds shards.
                holder = seat.lease_loop.run(seat.lease.current(), config.request_timeout)
                who = seat.lease.blocker or f"another process holds the seat{_holder(holder)}"
                log.error("%s%s; nothing is reconciled%s", who, f" still after {timeout:g} s" if wait else "",
                          "" if wait else ": --wait waits for it (up to --timeout)")
            return 2
        # Held as `serve` holds it (`Seat.hold`: the lease renewed all along); a lost lease ends it at once.
        why, _ = seat.hold(stop, within=left())
        if why:
            log.error("%s; the reconcile stops, unfinished", why)
            return 2
        if not outcome:
            return 2  # stopped by a signal before it settled (`main` says so), or the wait failed (said)
        if not outcome[0][0]:
            log.error("the seat did not settle within --timeout %g s", timeout)
            return 2
        say(f"settled in {time.monotonic() - started:.2f} s: {summary(outcome[0][1])}")
        return 0
    finally:
        stop.set()  # done, whatever ended it: a signal from now on lets the lease be given back (cli/process.py)
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
        nc = loop.run(open_bus(config, timeout, name=READ_CONNECTION), timeout + config.request_timeout)
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
            nc = loop.run(open_bus(config, 30, name=LOAD_CONNECTION), 40)
            try:
                loop.run(put_states(nc, mesh_of(sample_text())), 30)
                loop.run(add_router_stream(nc), 30)
            finally:
                loop.run(nc.close(), 10)
        shown: list[int] = []

        def settled_then_shown(sup: Runtime) -> None:
            if not sup.wait_settled(60):
                if stop.is_set():
                    return  # stopped by a signal first: nothing to show, and nothing failed
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
                f"In another terminal: {invoked()} --nats {server.url} show provisions\n"
                "Interrupt (Ctrl-C) to stop.")

        def on_hold(sup: Runtime | None) -> None:
            if sup is not None and not shown:
                threading.Thread(target=settled_then_shown, args=(sup,), name="demo-tables", daemon=True).start()

        code = Seat(config, on_hold=on_hold).serve(stop)
        return code or (shown[0] if shown else 0)  # not shown: stopped by a signal first


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
        nc = loop.run(open_bus(config, args.timeout, name=LOAD_CONNECTION), args.timeout + config.request_timeout)
        try:
            n = loop.run(put_states(nc, states, replicas=config.replicas), 60)
            made = args.router and loop.run(add_router_stream(nc, replicas=config.replicas), 30)
        finally:
            loop.run(nc.close(), config.request_timeout)
    say(f"loaded {n} key(s) of {what} into {len(states)} state(s) on {url}"
        + (f"; created the router's stream {ROUTER_STREAM}" if made else ""))
    # The seat needs the same servers, and on a cluster the same replicas for the buckets it creates.
    replicas = f" --replicas {config.replicas}" if config.replicas > 1 else ""
    say(f"next: {invoked()} --nats {','.join(config.servers())}{replicas} reconcile (once) or serve (on events), "
        "then show provisions")
    return 0
