"""What the actor and system tests share: another module's connection to the bus, the seat's states read back,
and the fixed-point check (contract section 6: a quiet seat composing everything again writes nothing).

A test plays the other modules of the mesh: it writes their states through a connection of its own (`Bus`), as
the controller, the assigner or a provider would, and reads the seat's states back from the server, never from
the seat's memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KeyValue

from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.config import Config
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.retire import act, act_digest
from mesh_provisioner.rules.view import ASK_RECORDS, PLANS, PROVISIONS, REFUSED, bucket
from mesh_provisioner.samples import sample_mesh
from mesh_provisioner.supervisor import Supervisor

SEAT_STATES = (PLANS, PROVISIONS, REFUSED)
ASKS_STREAM = "asks"
DECIDED = "asks.decided.mesh-provisioner"

Value = dict[str, Any] | bytes | None


def raw(value: dict[str, Any] | bytes) -> bytes:
    """A value as the bus keeps it: JSON bytes."""
    return value if isinstance(value, bytes) else json.dumps(value).encode()


class Bus:
    """Another module's connection to a test server, on a loop of its own: it writes the states the seat reads.

    Every call waits for the server's acknowledgement, retrying while the server is away (a restart test), up to
    a deadline: a test that writes knows its write is on the bus when the call returns.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = EventLoopThread("test-bus-writer")
        self.nc: Client = self.loop.run(
            nats.connect(url, reconnect_time_wait=0.1, max_reconnect_attempts=-1, name="test-writer"), 15
        )
        self.js = self.nc.jetstream(timeout=5)
        self._kvs: dict[str, KeyValue] = {}

    def close(self) -> None:
        """Close the connection and its loop."""
        try:
            self.loop.run(self.nc.close(), 10)
        finally:
            self.loop.stop()

    def run(self, make: Callable[[], Any], timeout: float = 20.0) -> Any:
        """Run a coroutine made by `make` on this connection's loop, again while the server is unreachable."""
        last: list[BaseException] = []

        def attempt() -> list[Any]:
            try:
                return [self.loop.run(make(), 5)]
            except (nats.errors.Error, TimeoutError, OSError) as err:
                if isinstance(err, nats.js.errors.APIError) and err.code not in (None, 503):
                    raise
                last[:] = [err]
                return []

        return wait_until(attempt, timeout, interval=0.05, what=f"the bus to answer (last: {last})")[0]

    async def _kv(self, state: str) -> KeyValue:
        kv = self._kvs.get(state)
        if kv is None:
            kv = self._kvs[state] = await self.js.key_value(bucket(state))
        return kv

    # ---- writing the other modules' states --------------------------------------------------------------

    def put(self, state: str, key: str, value: dict[str, Any] | bytes) -> int:
        """Put a key of another module's state (its bucket must exist); answers its revision."""

        async def go() -> int:
            return await (await self._kv(state)).put(key, raw(value))

        revision: int = self.run(go)
        return revision

    def delete(self, state: str, key: str) -> None:
        """Delete a key of another module's state."""

        async def go() -> None:
            await (await self._kv(state)).delete(key)

        self.run(go)

    def write(self, state: str, key: str, value: Value) -> None:
        """Put a value, or delete the key for None."""
        if value is None:
            self.delete(state, key)
        else:
            self.put(state, key, value)

    def create_bucket(self, state: str) -> None:
        """Create a state's bucket, as the module owning it would (nothing when it exists)."""

        async def go() -> None:
            await self.js.create_key_value(bucket=bucket(state), history=1)

        self.run(go)

    def publish(self, subject: str, data: bytes = b"", headers: dict[str, str] | None = None) -> None:
        """Publish a core NATS message, flushed to the server."""

        async def go() -> None:
            await self.nc.publish(subject, data, headers=headers)
            await self.nc.flush()

        self.run(go)

    # ---- reading the seat's states ----------------------------------------------------------------------

    def entries(self, state: str) -> dict[str, bytes]:
        """Every key of a state and its value, as the server holds them now.

        The keys come from the stream's subjects, not from a key-value watch: nats-py's watch may say it has
        delivered every current value before it has (its marker races the consumer's first messages).
        """
        prefix = f"$KV.{bucket(state)}."

        async def go() -> dict[str, bytes]:
            kv = await self._kv(state)
            info = await self.js.stream_info(f"KV_{bucket(state)}", subjects_filter=prefix + ">")
            out = {}
            for subject in sorted(info.state.subjects or {}):
                key = subject.removeprefix(prefix)
                try:
                    entry = await kv.get(key)
                except nats.js.errors.KeyNotFoundError:
                    continue  # deleted or purged: its marker is all that is left
                out[key] = entry.value or b""
            return out

        found: dict[str, bytes] = self.run(go)
        return found

    def get(self, state: str, key: str) -> bytes | None:
        """One key's value now, None when there is none."""

        async def go() -> bytes | None:
            try:
                entry = await (await self._kv(state)).get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
            return entry.value or b""

        value: bytes | None = self.run(go)
        return value

    def provision(self, key: str) -> r.Provision | None:
        """A provision of the seat, decoded; None when there is none."""
        value = self.get(PROVISIONS, key)
        return None if value is None else r.decode(r.Provision, value)

    def plan(self, key: str) -> r.PlanRecord | None:
        """A plan of the seat, decoded; None when there is none."""
        value = self.get(PLANS, key)
        return None if value is None else r.decode(r.PlanRecord, value)

    def refusal(self, key: str) -> r.Refusal | None:
        """A refusal of the seat, decoded; None when there is none."""
        value = self.get(REFUSED, key)
        return None if value is None else r.decode(r.Refusal, value)

    def last_seqs(self, states: tuple[str, ...] = SEAT_STATES) -> dict[str, int]:
        """Each state's bucket's last revision: any write, even of an equal value, moves it."""

        async def go() -> dict[str, int]:
            out = {}
            for state in states:
                info = await self.js.stream_info(f"KV_{bucket(state)}")
                out[state] = info.state.last_seq
            return out

        seqs: dict[str, int] = self.run(go)
        return seqs

    # ---- the operator's channel, as the router keeps it -------------------------------------------------

    def create_asks_stream(self) -> None:
        """The router's stream of asks, keeping every ask id for a day against duplicates, and its records."""

        async def go() -> None:
            await self.js.add_stream(name=ASKS_STREAM, subjects=["asks.>"], duplicate_window=86_400.0)

        self.run(go)
        self.create_bucket(ASK_RECORDS)

    def asks_published(self) -> list[tuple[str, r.Ask]]:
        """Every ask in the router's stream, in order, with its `Nats-Msg-Id`."""

        async def go() -> list[tuple[str, r.Ask]]:
            info = await self.js.stream_info(ASKS_STREAM)
            if not info.state.messages:
                return []
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await self.js.get_msg(ASKS_STREAM, seq)
                except nats.js.errors.NotFoundError:
                    continue
                if msg.subject.startswith("asks.ask."):
                    msg_id = (msg.headers or {}).get(api.Header.MSG_ID, "")
                    out.append((msg_id, r.decode(r.Ask, msg.data or b"")))
            return out

        asks: list[tuple[str, r.Ask]] = self.run(go)
        return asks

    def decide(self, key: str, ask_id: str, option: str = "yes", *, binds: str | None = None) -> None:
        """Decide a retiring key's ask as the router does: write its record, then say so on the decided subject."""
        options = tuple(
            r.Option(id=o, label=o, does=o, level="approve", binds=act_digest(act(key, ask_id, o)))
            for o in ("yes", "no")
        )
        if binds is not None:
            options = tuple(msgspec.structs.replace(o, binds=binds) if o.id == option else o for o in options)
        now = datetime.now(UTC)
        record = r.AskRecord(
            state="decided",
            ask=r.Ask(id=ask_id, headline="Remove?", who="operator", options=options, about="provision." + key),
            warrant=r.Warrant(
                asker=r.MODULE,
                ask=ask_id,
                outcome="chosen",
                option=option,
                by=r.Identity(who="operator", kind="person", identity="ops@example.org"),
                at=now,
            ),
        )
        self.put(ASK_RECORDS, ask_id, r.encode(record))
        self.publish(DECIDED, b"{}")


def load_sample(url: str, *, extra: dict[str, dict[str, bytes]] | None = None) -> None:
    """Load the sample mesh into a server, as the other modules would have written it, plus `extra` states."""
    states = sample_mesh()
    for state, values in (extra or {}).items():
        states.setdefault(state, {}).update(values)
    with EventLoopThread("test-loader") as loop:
        loop.run(load_states(url, states), 30)


def seat_state(bus: Bus) -> dict[str, dict[str, bytes]]:
    """The seat's own states (plans, provisions, refused) as the server holds them."""
    return {state: bus.entries(state) for state in SEAT_STATES}


def diff(before: dict[str, dict[str, bytes]], after: dict[str, dict[str, bytes]]) -> list[str]:
    """What changed between two readings of the seat's states, one line a key."""
    out = []
    for state in SEAT_STATES:
        a, b = before.get(state, {}), after.get(state, {})
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                out.append(f"{state} {key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out


def seat_config(url: str, **overrides: Any) -> Config:
    """A seat's config for a test server: quick restarts, short timeouts."""
    values: dict[str, Any] = {"nats": url, "request_timeout": 5.0, "backoff_first": 0.01, "backoff_max": 0.2}
    values.update(overrides)
    return Config(**values)


def settle(sup: Supervisor, timeout: float = 30.0) -> None:
    """Wait until the seat is settled; fail the test if it is not within `timeout` seconds."""
    assert sup.wait_settled(timeout), f"the seat did not settle within {timeout} s: {sup.status()}"


def assert_fixed_point(bus: Bus, config: Config | None = None, timeout: float = 30.0) -> None:
    """A fresh seat over the same bus composes every node and judges every key again, and writes nothing.

    Contract section 6: a quiet seat off its fixed point has found a missing wake-up. Compared both by the fresh
    seat's own count of writes and by every bucket's last revision, and any difference is named.
    """
    before, seqs = seat_state(bus), bus.last_seqs()
    fresh = Supervisor.start(config or seat_config(bus.url))
    try:
        settle(fresh, timeout)
        counts = fresh.store.counts()
    finally:
        fresh.stop()
    after = seat_state(bus)
    changed = diff(before, after)
    assert counts["writes"] == 0 and not changed and bus.last_seqs() == seqs, (
        f"a fresh reconcile wrote {counts}: " + "\n".join(changed)
    )


def comparable(p: r.Provision) -> r.Provision:
    """A provision with `at` and `v` left aside: two that compare equal are the same (section 4)."""
    return msgspec.structs.replace(p, at=None, v=0)


def provisions(bus: Bus) -> dict[str, r.Provision]:
    """Every provision of the seat, decoded."""
    return {k: r.decode(r.Provision, v) for k, v in bus.entries(PROVISIONS).items()}


def plans(bus: Bus) -> dict[str, r.PlanRecord]:
    """Every plan of the seat, decoded."""
    return {k: r.decode(r.PlanRecord, v) for k, v in bus.entries(PLANS).items()}



# ---- fixtures (imported by the conftests of tests/actors and tests/system) ----------------------------------


class Seats:
    """Supervisors a test started, each stopped after it, whatever happened."""

    def __init__(self) -> None:
        self.started: list[Supervisor] = []

    def start(self, config: Config, **options: Any) -> Supervisor:
        """Start a supervisor (as `Supervisor.start`) and keep it to stop after the test."""
        sup = Supervisor.start(config, **options)
        self.started.append(sup)
        return sup

    def stop_all(self) -> None:
        """Stop every supervisor started, last first."""
        for sup in reversed(self.started):
            sup.stop()


@pytest.fixture
def bus(nats_server: NatsServer) -> Iterator[Bus]:
    """Another module's connection to the test server."""
    b = Bus(nats_server.url)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def mesh(bus: Bus) -> Bus:
    """The sample mesh on the test server, and the router's stream of asks and its records bucket."""
    load_sample(bus.url)
    bus.create_asks_stream()
    return bus


@pytest.fixture
def seats() -> Iterator[Seats]:
    """A way to start supervisors that are stopped after the test."""
    s = Seats()
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture
def sup(mesh: Bus, seats: Seats) -> Supervisor:
    """A seat serving the sample mesh, settled."""
    s = seats.start(seat_config(mesh.url))
    settle(s)
    return s
