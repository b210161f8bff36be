"""The check every fault scenario ends with (design.md, properties 1, 3, 4 and 5): what was lost, in sentences.
The tests make its fixed point check too (tests/seatbus.py, tests/support/seatrun.py).

Once both seats are settled:

- **fixed point**: a fresh seat over the disturbed bus composes every node and judges every key again, and writes
  nothing (contract section 6);
- **settle() of the final inputs**: every plan, provision and refusal on the disturbed bus is the one the pure
  `settle()` computes from the inputs the bus ends with, key by key, but what the contract lets history decide
  (meshcheck/settled.py), and `settle()` over the bus as it is writes nothing;
- **the write history** (meshcheck/history.py): every write of the seat's states was sent by a seat process, and by
  the holder of the key's lease at the moment it was stored;
- **the same as an undisturbed run**: every plan, every needed (non-retiring) provision and every refusal on the
  disturbed bus is the one an undisturbed seat given the same changes ends with, `at`, `v` and a refusal's `since`
  aside; a retiring key may be on one bus only, and a key may be needed on one bus only while a retiring key there
  depends on it (a transient need, kept until the operator answers);
- **asked once**: the router's stream holds each `Nats-Msg-Id` once, and each ask it holds is the ask its key names;
- **the seat still answers**: its verb `mesh-provisioner.provisioning`, or `Runtime.compose`;
- **no exception escaped**: no ERROR record from the `pykka` or `mesh_provisioner` loggers but the deliberate
  kills'.

Each check answers a list of problems; an empty list is a check passed. A problem is what was lost.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import nats

from mesh_provisioner.actors.base import ActorKilled
from mesh_provisioner.bus.cache import watched_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.config import Config
from mesh_provisioner.contract import PLANS, PROVISIONS, REFUSED, SEAT_STATES, VERB_SUBJECT
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.runtime import Runtime
from meshcheck.bus import Bus, comparable, diff, plans, provisions, refusals, seat_state, short, until
from meshcheck.settled import compare, expected, inputs_of, off_fixed_point

WATCHED_LOGGERS = ("pykka", "mesh_provisioner")


def fixed_point(bus: Bus, config: Config, timeout: float = 60.0) -> list[str]:
    """A fresh seat over the bus composes every node and judges every key again: what it wrote (nothing, at a
    fixed point)."""
    before, seqs = seat_state(bus), bus.last_seqs()
    fresh = Runtime.start(config)
    try:
        settled = fresh.wait_settled(timeout)
        counts = fresh.store.counts()
    finally:
        fresh.stop()
    problems = [] if settled else [f"a fresh seat over the bus did not settle within {timeout:g} s"]
    changed = diff(before, seat_state(bus))
    if counts["writes"] or changed or bus.last_seqs() != seqs:
        problems.append(f"not at a fixed point: a fresh seat wrote {counts}: " + "; ".join(changed[:20]))
    return problems


def settled_as(bus: Bus, bound_reads: tuple[str, ...]) -> tuple[str, list[str]]:
    """The seat's states on a bus compared, key by key, with `settle()` of the inputs the bus holds (every state but
    the seat's own), and `settle()` over the bus as it is: says how many keys, and each difference."""
    live = bus.snapshot(watched_states(bound_reads), bound_reads)
    want = expected(inputs_of(live, SEAT_STATES), bound_reads)
    problems = [f"against settle() of the final inputs: {p}" for p in compare(want, live)]
    problems += off_fixed_point(live)
    counts = ", ".join(f"{len(list(live.keys(s)))} {s.rpartition('.')[2]}" for s in (PLANS, PROVISIONS, REFUSED))
    return f"{counts} compared with settle() of the final inputs", problems


def transient_needs(*sides: dict[str, r.Provision]) -> set[str]:
    """Every key a retiring key depends on, and what that depends on in turn, on either side."""
    out: set[str] = set()
    todo = [dep for ps in sides for p in ps.values() if p.state == r.RETIRING for dep in p.depends_on]
    while todo:
        dep = todo.pop()
        if dep not in out:
            out.add(dep)
            todo.extend(d for ps in sides if dep in ps for d in ps[dep].depends_on)
    return out


def same(disturbed: Bus, undisturbed: Bus) -> tuple[str, list[str]]:
    """The plans, needed provisions and refusals of two buses compared; says how many, and each difference."""
    problems: list[str] = []
    la, lb = plans(disturbed), plans(undisturbed)
    for key in sorted(la.keys() | lb.keys()):
        if la.get(key) != lb.get(key):
            problems.append(f"plan {key} differs: {_said(la.get(key))} where the undisturbed run has "
                            f"{_said(lb.get(key))}")
    pa, pb = provisions(disturbed), provisions(undisturbed)
    retiring = {key for ps in (pa, pb) for key, p in ps.items() if p.state == r.RETIRING}
    transient = transient_needs(pa, pb)
    alike, allowed = 0, 0
    for key in sorted((pa.keys() | pb.keys()) - retiring):
        x, y = (comparable(p) if p is not None else None for p in (pa.get(key), pb.get(key)))
        if x is not None and x == y:
            alike += 1
        elif key in transient:
            allowed += 1
        else:
            problems.append(f"provision {key} differs: {_said(x)} where the undisturbed run has {_said(y)}")
    ra, rb = refusals(disturbed), refusals(undisturbed)
    for key in sorted(ra.keys() | rb.keys()):
        if ra.get(key) != rb.get(key):
            problems.append(f"refusal {key} differs: {_said(ra.get(key))} where the undisturbed run has "
                            f"{_said(rb.get(key))}")
    summary = (f"{len(la)} plans, {alike} needed provisions and {len(ra)} refusals the same; {len(retiring)} "
               f"retiring, {allowed} different while a retiring key depends on them")
    return summary, problems


def _said(record: Any) -> str:
    return "nothing" if record is None else short(r.encode(record), 300)


def asked_once(bus: Bus) -> tuple[int, list[str]]:
    """How many asks the router's stream holds, and each one published twice or not the ask its key names."""
    asks = bus.asks_published()
    ids = Counter(msg_id for msg_id, _ in asks)
    problems = [f"the ask {i} was published {n} times" for i, n in sorted(ids.items()) if n > 1]
    for msg_id, ask in asks:
        key = ask.about.removeprefix("provision.")
        if msg_id != ask.id or k.ask_raised_at(msg_id) is None:
            problems.append(f"the ask {ask.id} went out under the message id {msg_id!r}")
        elif not msg_id.startswith("retire-" + key.replace(".", "-") + "-"):
            problems.append(f"the ask {msg_id} is not the ask of the key it is about, {key}")
    return len(asks), problems


def verb_answers(url: str, timeout: float = 20.0) -> list[str]:
    """The seat's verb answers a request for its plans with entries (contract 9), within `timeout` seconds."""

    async def ask() -> dict[str, Any]:
        nc = await nats.connect(url.split(","), max_reconnect_attempts=1, connect_timeout=2)
        try:
            msg = await nc.request(VERB_SUBJECT, b'{"what": "plans"}', timeout=2)
            answer: dict[str, Any] = json.loads(msg.data)
            return answer
        finally:
            await nc.close()

    last: list[str] = []

    def answered() -> bool:
        try:
            reply = loop.run(ask(), 10)
        except Exception as err:
            last[:] = [f"{type(err).__name__}: {err}"]
            return False
        last[:] = [json.dumps(reply)[:200]]
        return bool(reply.get("entries"))

    with EventLoopThread("meshcheck-verb") as loop:
        try:
            until(answered, timeout, 0.1, "the verb to answer")
        except TimeoutError:
            return [f"the seat's verb did not answer with entries within {timeout:g} s (last: {last})"]
    return []


def composes(sup: Runtime, node: str = "ace", timeout: float = 20.0) -> list[str]:
    """The seat composes a node when asked (`Runtime.compose`), within `timeout` seconds."""
    try:
        composed = sup.compose(node).get(timeout=timeout)
    except Exception as err:
        return [f"the seat did not compose {node} when asked: {type(err).__name__}: {err}"]
    if composed.node != node:
        return [f"the seat answered a composition of {composed.node} when asked for {node}"]
    return []


def unsettled(sup: Runtime) -> str:
    """Why a seat does not count as settled: what is in flight, and each watch that is loading, behind or silent."""

    async def watches() -> list[str]:
        cache = sup.cache
        out = [f"loading {sorted(cache._loading)}"] if cache._loading else []
        for state in sorted(cache._loading):
            task = cache._tasks.get(state)
            if task is not None and task.done():
                how = "was cancelled" if task.cancelled() else f"raised {task.exception()!r}"
                out.append(f"{state}'s watch ended: it {how}")
                continue
            chain: list[str] = []
            coro = task.get_coro() if task is not None else None
            while coro is not None and len(chain) < 20:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is None:
                    chain.append(type(coro).__name__)
                    break
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
            out.append(f"{state}'s watch waits in {' > '.join(chain) or 'nothing'}")
        for state, watcher in list(cache._watchers.items()):
            sub = watcher._sub
            if sub is None:
                out.append(f"{state}: no subscription")
                continue
            try:
                info = await sub.consumer_info()
            except Exception as err:
                out.append(f"{state}: its consumer does not answer ({type(err).__name__}: {err})")
                continue
            delivered = info.delivered.stream_seq if info.delivered is not None else 0
            if info.num_pending or cache._latest.get(state, 0) < delivered:
                out.append(f"{state}: {info.num_pending} pending, {delivered} delivered, "
                           f"{cache._latest.get(state, 0)} applied")
        missing = set(cache.states) - set(cache._watchers) - cache._loading - set(cache.view.states())
        if missing:
            out.append(f"no watch follows {sorted(missing)} (buckets that do not exist are waited for)")
        return out

    try:
        said = sup.loop.run(watches(), 30)
    except Exception as err:
        said = [f"the watches could not be asked: {type(err).__name__}: {err}"]
    return f"{sup.in_flight.total()} message(s) in flight; " + ("; ".join(said) or "every watch caught up")


class ErrorLog(logging.Handler):
    """Counts ERROR records of the seat's loggers (pykka's, mesh_provisioner's): each one not a deliberate kill is
    an exception that escaped unhandled, or an error the seat could not keep to itself."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.unhandled: list[str] = []
        self.kills = 0
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep one record: a deliberate kill is counted apart."""
        exc = record.exc_info[1] if record.exc_info else None
        with self._lock:
            if isinstance(exc, ActorKilled):
                self.kills += 1
            else:
                what = f"{record.name}: {record.getMessage()}"
                if exc is not None:
                    what += f" ({type(exc).__name__}: {exc})"
                self.unhandled.append(what[:500])

    def problems(self) -> list[str]:
        """Each unhandled error, as a problem."""
        with self._lock:
            return [f"an error escaped: {what}" for what in self.unhandled]


@contextmanager
def watching_errors() -> Iterator[ErrorLog]:
    """An ErrorLog on the seat's loggers while the block runs."""
    handler = ErrorLog()
    loggers = [logging.getLogger(name) for name in WATCHED_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def process_errors(log_path: Path) -> list[str]:
    """The ERROR records of a seat process that logged JSON (`--log-format json`), but deliberate kills."""
    problems = []
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if not isinstance(record, dict) or record.get("level") not in ("ERROR", "CRITICAL"):
            continue
        name = str(record.get("logger", ""))
        if name.partition(".")[0] in WATCHED_LOGGERS and "ActorKilled" not in str(record.get("exception", "")):
            problems.append(f"an error escaped in {log_path.name}: {name}: {str(record.get('message'))[:300]}")
    return problems
