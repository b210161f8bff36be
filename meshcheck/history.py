"""The seat's write history, recorded as a run goes and checked afterwards (Jepsen's way): who wrote each value of
the seat's states, and whether that process held the lease for the key at the moment the server stored it.

**What is recorded.** `History` follows every stream of the seat's states (plans, provisions, refusals, the
registry, the retired needs) and its lease bucket (`mesh-provisioner.seat`) with an ordered consumer from the first
message, on a connection of its own, and keeps each message: its stream sequence, its subject, whether it is a put
or a delete, and the time the server stored it (JetStream's own timestamp, from the message's metadata). It creates
the seat's buckets itself first, as the seat would (`ensure_buckets`, the seat's own function), so that its
consumers start before the seat's first write: a bucket keeps only each key's last value, so a write the recorder
had not followed when it was made would be gone. What the streams held when the recorder started (a mesh loaded with
the seat's states, as an earlier seat left them) is the run's starting point, not a write of it. A sequence the
consumer never saw (a server restart cut the consumer, and the key was written again before it resumed) is a gap; a
write after one is not attributed (below) and is counted as unchecked, never passed.

**Who wrote a write.** The seat stamps nothing on its values, and JetStream keeps no publisher with a message. But
every write the seat makes to its states is a compare-and-set: it carries `Nats-Expected-Last-Subject-Sequence`, the
revision the rule read, and JetStream stores it only when the key's last sequence is that one. So the message at
sequence S on subject X, whose previous message on X was at sequence P, was made by a request that expected P on X,
and by no other: once one such request is stored the key's last sequence is S, and every other request expecting
P on X is refused. Each seat process logs every such request as it sends it, before it goes out (`Intent`: its
pid, the subject and the expected revision; faults/spies.py `CasSpy`, which a seat process started by
`python -m faults.logged` wears too). A stored write is the writer's whose intent matches its subject and its
predecessor, sent between the moment the predecessor was stored (the writer read it) and the moment the write was
(the same revision is expected again later, by a create that fails on a key that exists, say: those come after).
Two processes that sent the same (subject, expected) within that window make it ambiguous (a process killed with its
write sent, say, and the key's next holder sending the same one), unless the server's acknowledgement settles it:
each process logs each write the server acknowledged, with the sequence it was stored at, and that names the writer
outright. An ambiguous write with no acknowledgement is a finding: at most one of them could hold the key's lease.
The processes, the server and the checker share one host and its clock; the window is widened by a millisecond
each side, which can only make a write ambiguous, never misattribute it. A write no process sent (another module's
connection, a blind put) has no writer, which is a finding too: only the seat writes its states (contract section 4).

**Whose lease it was.** A lease is a key of `mesh-provisioner.seat`: `holder` for a seat of one shard, `shard.<i>` for
the shard a key's node is in (contract 8.1, `rules/shards.py` `shard_of_write`). At the moment the server stored a
write, the lease was the last put of that key stored before it, provided it was not deleted since and had not aged
out (the bucket's max age, the lease time, from that put's timestamp: the server removes it then, and only then can
another process take it). The write passes when that lease names the writer's pid. Both timestamps come from the
server that stores the two streams, so they are comparable without trusting any process's clock.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from mesh_provisioner.bus.connection import ensure_buckets, stream_of
from mesh_provisioner.contract import HOLDER_KEY, LEASE_SECONDS, SEAT, SEAT_STATES, bucket
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.shards import shard_key, shard_of_write
from meshcheck.bus import Bus

KV_OPERATION = "KV-Operation"
EXPECTED = "Nats-Expected-Last-Subject-Sequence"
SLACK = 0.001  # seconds either side of a write's window (the module's docstring)


class Intent(NamedTuple):
    """A compare-and-set a process sent to one of the seat's states: its pid, the subject, the revision expected, and
    when it was sent (`time.time()`: the host's clock, which the server on the same host stamps messages by); or,
    with `stored`, the server's acknowledgement that it stored that process's write at that sequence."""

    pid: int
    subject: str
    expected: int
    sent: float
    stored: int = 0

    def line(self) -> str:
        """The intent as one line of a write log."""
        return json.dumps({"pid": self.pid, "subject": self.subject, "expected": self.expected,
                           "sent": self.sent, "stored": self.stored}) + "\n"


def read_intents(path: Path) -> list[Intent]:
    """The intents a seat process logged, one JSON line each (a line cut short by a kill is left aside: its write
    was not sent)."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            d = json.loads(line)
            out.append(Intent(int(d["pid"]), str(d["subject"]), int(d["expected"]), float(d["sent"]),
                              int(d.get("stored", 0))))
        except (ValueError, KeyError, TypeError):
            continue
    return out


@dataclass(frozen=True)
class Entry:
    """One message of a seat stream as the server stored it."""

    state: str
    key: str
    subject: str
    seq: int
    at: datetime
    op: str  # "put", "del" or "purge"
    value: bytes


class History:
    """Every message of the seat's streams, from each stream's first, as the server stores them (the module's
    docstring); started before the seat, closed when the run's writes are done."""

    def __init__(self, bus: Bus, *, lease_seconds: float = LEASE_SECONDS, replicas: int = 1,
                 states: Iterable[str] = SEAT_STATES) -> None:
        self.bus = bus
        self.lease_seconds = lease_seconds
        self.states = tuple(states)
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        self._subs: list[object] = []
        js: JetStreamContext = bus.js

        async def made() -> None:
            await ensure_buckets(js, self.states, lease=lease_seconds, replicas=replicas, patience=30.0)

        bus.run(made, 60)
        # What the bus held before the run (a mesh loaded with a seat's states, as an earlier seat left them): a
        # predecessor to what follows, not a write of the run.
        self.before = bus.last_seqs(self.states)
        for state in self.states:
            self._subs.append(bus.run(functools.partial(self._follow, state), 60))

    async def _follow(self, state: str) -> object:
        prefix = f"$KV.{bucket(state)}."

        async def got(msg: Msg) -> None:
            meta = msg.metadata
            op = (msg.headers or {}).get(KV_OPERATION, "PUT").lower()
            with self._lock:
                self._entries.append(Entry(state, msg.subject.removeprefix(prefix), msg.subject,
                                           meta.sequence.stream, meta.timestamp, op, msg.data or b""))

        return await self.bus.js.subscribe(prefix + ">", stream=stream_of(state), cb=got, ordered_consumer=True,
                                           deliver_policy=api.DeliverPolicy.ALL, idle_heartbeat=1.0)

    def caught_up(self, timeout: float = 30.0) -> bool:
        """Wait until every stream's last sequence has been seen; whether it was within `timeout` seconds."""
        end = time.monotonic() + timeout
        while True:
            last = self.bus.last_seqs(self.states)
            with self._lock:
                seen: dict[str, int] = defaultdict(int)
                for e in self._entries:
                    seen[e.state] = max(seen[e.state], e.seq)
            if all(seen[s] >= n for s, n in last.items()):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)

    def close(self) -> None:
        """Stop following the streams."""
        for sub in self._subs:
            with contextlib.suppress(Exception):  # a bus that is gone has nothing left to unsubscribe
                self.bus.run(sub.unsubscribe, 10)  # type: ignore[attr-defined]
        self._subs = []

    def entries(self) -> list[Entry]:
        """What was recorded so far, each stream in its order."""
        with self._lock:
            return sorted(self._entries, key=lambda e: (e.state, e.seq))


@dataclass
class Attributed:
    """The writes of the seat's states, each with its writer; what could not be attributed, and why."""

    writes: list[tuple[Entry, int]]
    problems: list[str]
    unchecked: int


def attribute(entries: list[Entry], intents: Iterable[Intent], before: dict[str, int] | None = None) -> Attributed:
    """Each write of the seat's states (the lease bucket aside) with the pid whose compare-and-set it was (the
    module's docstring)."""
    senders: dict[tuple[str, int], list[Intent]] = defaultdict(list)
    acked: dict[tuple[str, int], int] = {}  # (subject, sequence) -> the pid the server acknowledged it to
    for i in intents:
        if i.stored:
            acked[(i.subject, i.stored)] = i.pid
        else:
            senders[(i.subject, i.expected)].append(i)
    out = Attributed([], [], 0)
    by_state: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        by_state[e.state].append(e)
    for state, seen in by_state.items():
        if state == SEAT:
            continue
        seen.sort(key=lambda e: e.seq)
        last_on: dict[str, int] = {}
        stored: dict[int, float] = {}  # each sequence seen: when it was stored
        gap_after = 0  # the last sequence before which a message was never seen
        start = (before or {}).get(state, 0)
        expect = start + 1
        for e in seen:
            if e.seq <= start:
                last_on[e.subject] = e.seq  # the starting point: each key's value when the run began
                continue
            stored[e.seq] = e.at.timestamp()
            if e.seq > expect:
                gap_after = e.seq - 1
            expect = e.seq + 1
            previous = last_on.get(e.subject, 0)
            last_on[e.subject] = e.seq
            if previous < gap_after:
                out.unchecked += 1  # its predecessor may be in the gap: the writer cannot be told
                continue
            if (e.subject, e.seq) in acked:
                out.writes.append((e, acked[(e.subject, e.seq)]))  # its writer was told it stored it
                continue
            earliest = stored.get(previous, float("-inf")) - SLACK
            latest = e.at.timestamp() + SLACK
            pids = {i.pid for i in senders.get((e.subject, previous), []) if earliest <= i.sent <= latest}
            if len(pids) == 1:
                out.writes.append((e, next(iter(pids))))
            elif not pids:
                out.problems.append(f"{_said(e)} was sent by no seat process (no compare-and-set on revision "
                                    f"{previous} of it was sent by one): only the seat writes its states")
            else:
                out.problems.append(f"{_said(e)} cannot be told apart: processes {sorted(pids)} each sent a "
                                    f"compare-and-set on revision {previous} of it")
    return out


def lease_problems(entries: list[Entry], writes: list[tuple[Entry, int]], *, shards: int,
                   lease_seconds: float) -> tuple[list[str], list[str]]:
    """Each write whose writer did not hold the key's lease (`holder`, or `shard.<i>` of the key's shard with
    `shards` > 1) when the server stored it (the module's docstring); and apart, each write stored after the writer's
    own lease aged out while nothing else was written to the lease key since (a late write: sent in time, stored
    late, as when the server itself was frozen between the two)."""
    leases: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.state == SEAT:
            leases[e.key].append(e)
    for history in leases.values():
        history.sort(key=lambda e: e.seq)
    age = timedelta(seconds=lease_seconds)
    problems, late = [], []
    for w, pid in writes:
        shard = shard_of_write(w.state, w.key, shards)
        key = HOLDER_KEY if shards <= 1 else shard_key(shard if shard is not None else 0)
        last = None
        for lease in leases.get(key, []):
            if lease.at > w.at:
                break
            last = lease
        record = r.decode(r.Lease, last.value) if last is not None and last.op == "put" else None
        holder = record.pid if record is not None else None
        if holder == pid and last is not None and w.at < last.at + age:
            continue
        said = f"{_said(w)} was written by process {pid} while "
        if holder == pid:
            late.append(said + f"its lease had aged out ({key} of {SEAT}: {_lease_said(last)})")
        else:
            held = "no process held it" if holder is None else f"process {holder} held it"
            problems.append(said + f"{held} ({key} of {SEAT}: {_lease_said(last)})")
    return problems, late


def check(history: History, intents: Iterable[Intent], *, shards: int = 1, leased: bool = True,
          late_ok: bool = False) -> tuple[dict[str, int], list[str]]:
    """The write history checked: every write of the seat's states attributed to the seat process that sent it and,
    with `leased`, stored while that process held the key's lease. Answers figures and problems.

    `late_ok`: a write stored after its writer's own lease aged out, with no other lease write in between, is
    counted, not a problem (a scenario that freezes the server stores the writes sent before the freeze late)."""
    if not history.caught_up():
        problems = ["the write history did not catch up with the seat's streams within 30 s"]
    else:
        problems = []
    entries = history.entries()
    who = attribute(entries, intents, history.before)
    problems += who.problems
    late: list[str] = []
    if leased:
        unheld, late = lease_problems(entries, who.writes, shards=shards, lease_seconds=history.lease_seconds)
        problems += unheld + ([] if late_ok else late)
    figures = {"writes": len(who.writes) + len(who.problems) + who.unchecked,
               "writers": len({pid for _, pid in who.writes}),
               "lease_writes": sum(1 for e in entries if e.state == SEAT),
               "unchecked": who.unchecked,
               "stored_after_lease": len(late)}
    return figures, problems


def _said(e: Entry) -> str:
    what = "a delete of" if e.op != "put" else "a put of"
    return f"{what} {e.state} {e.key} (sequence {e.seq}, stored {e.at.isoformat(timespec='milliseconds')})"


def _lease_said(e: Entry | None) -> str:
    if e is None:
        return "never written before"
    if e.op != "put":
        return f"deleted at {e.at.isoformat(timespec='milliseconds')}"
    record = r.decode(r.Lease, e.value)
    return f"last written at {e.at.isoformat(timespec='milliseconds')} by process {record.pid if record else '?'}"
