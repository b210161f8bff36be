"""Another module's connection to a bus, the seat's states read back from the server, and the router's stand-in.

A fault run or a test plays the other modules of the mesh: it writes their states through a connection of its own
(`Bus`), as the controller, the assigner or a provider would, creates the router's stream of asks (`asks`,
de-duplicating by `Nats-Msg-Id` for a day, as the router keeps it) and its records, and reads the seat's states back
from the server, never from the seat's memory. Every call waits for the server's acknowledgement, retrying while the
server is away (a restart, a pause, a cluster electing a leader) up to a deadline.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KeyValue

from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.config import Config
from mesh_provisioner.contract import (
    ASK_RECORDS,
    DECIDED_SUBJECT,
    MODULE,
    OWN,
    PLANS,
    PROVISIONS,
    REFUSED,
    ROUTER_STREAM,
    bucket,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.retire import act, act_digest
from mesh_provisioner.rules.signature import signed_bytes
from mesh_provisioner.samples import sample_mesh

log = logging.getLogger("meshcheck.bus")

# JetStream's answers that mean "not now" (no leader yet, a peer catching up): asked again until the deadline.
_TRANSIENT_CODES = (None, 503, 500)

Value = dict[str, Any] | bytes | None


def raw(value: dict[str, Any] | bytes) -> bytes:
    """A value as the bus keeps it: JSON bytes."""
    return value if isinstance(value, bytes) else json.dumps(value).encode()


def until(predicate: Callable[[], Any], timeout: float, interval: float = 0.01, what: str = "") -> Any:
    """Poll `predicate` until it answers something true and answer that; TimeoutError past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout} s: {what or getattr(predicate, '__qualname__', predicate)}")
        time.sleep(interval)


class Signer:
    """The router's ed25519 key: it signs the warrants it writes (contract 5.4, `Config.router_key`)."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = base64.b64encode(public).decode()

    def sign(self, warrant: dict[str, Any]) -> dict[str, Any]:
        """The warrant as the router writes it, with `sig` over the rest."""
        body = {k: v for k, v in warrant.items() if k != "sig"}
        return {**body, "sig": base64.b64encode(self._key.sign(signed_bytes(body))).decode()}


async def _quiet(err: Exception) -> None:
    log.debug("the writer's connection: %s", err)


async def _nothing() -> None:
    return None


class Bus:
    """Another module's connection to a bus (one URL, or a cluster's URLs comma-separated), on a loop of its own."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout
        self.loop = EventLoopThread("meshcheck-bus-writer")
        self.nc: Client = self.loop.run(
            nats.connect(url.split(","), reconnect_time_wait=0.1, max_reconnect_attempts=-1, name="meshcheck-writer",
                         error_cb=_quiet, disconnected_cb=_nothing, reconnected_cb=_nothing),
            15,
        )
        self.js = self.nc.jetstream(timeout=5)
        self._kvs: dict[str, KeyValue] = {}

    def close(self) -> None:
        """Close the connection and its loop."""
        try:
            self.loop.run(self.nc.close(), 10)
        except Exception as err:  # a bus that is gone has nothing left to close
            log.debug("the writer's connection did not close cleanly: %s", err)
        finally:
            self.loop.stop()

    def run(self, make: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run a coroutine made by `make` on this connection's loop, again while the server cannot answer."""
        last: list[BaseException] = []

        def attempt() -> list[Any]:
            try:
                return [self.loop.run(make(), 5)]
            except (nats.errors.Error, TimeoutError, OSError) as err:
                if isinstance(err, nats.js.errors.APIError) and err.code not in _TRANSIENT_CODES:
                    raise
                last[:] = [err]
                return []

        try:
            return until(attempt, timeout or self.timeout, interval=0.05, what="the bus to answer")[0]
        except TimeoutError as err:
            raise TimeoutError(f"{err} (last: {last[0] if last else 'nothing'})") from None

    async def _kv(self, state: str) -> KeyValue:
        kv = self._kvs.get(state)
        if kv is None:
            kv = self._kvs[state] = await self.js.key_value(bucket(state))
        return kv

    # ---- writing the other modules' states --------------------------------------------------------------

    def put(self, state: str, key: str, value: dict[str, Any] | bytes, *, validate: bool = True) -> int:
        """Put a key of another module's state (its bucket must exist); answers its revision.

        `validate=False` lets a key through that nats-py would refuse (bad input for the seat to name).
        """

        async def go() -> int:
            return await (await self._kv(state)).put(key, raw(value), validate_keys=validate)

        revision: int = self.run(go)
        return revision

    def delete(self, state: str, key: str, *, validate: bool = True) -> None:
        """Delete a key of another module's state."""

        async def go() -> None:
            await (await self._kv(state)).delete(key, validate_keys=validate)

        self.run(go)

    def write(self, state: str, key: str, value: Value, *, validate: bool = True) -> None:
        """Put a value, or delete the key for None."""
        if value is None:
            self.delete(state, key, validate=validate)
        else:
            self.put(state, key, value, validate=validate)

    def create_bucket(self, state: str, *, replicas: int = 1) -> None:
        """Create a state's bucket, as the module owning it would (nothing when it exists)."""

        async def go() -> None:
            try:
                await self.js.stream_info(f"KV_{bucket(state)}")
            except nats.js.errors.NotFoundError:
                await self.js.create_key_value(bucket=bucket(state), history=1, replicas=replicas)

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
                    entry = await kv.get(key, validate_keys=False)
                except nats.js.errors.KeyNotFoundError:
                    continue  # deleted or purged: its marker is all that is left
                out[key] = entry.value or b""
            return out

        found: dict[str, bytes] = self.run(go)
        return found

    def snapshot(self, states: Iterable[str], bound_reads: tuple[str, ...]) -> MemoryView:
        """Every key of these states as the server holds them now, in a view (a state with no bucket is left out)."""
        async def exists(state: str) -> bool:
            try:
                await self.js.stream_info(f"KV_{bucket(state)}")
            except nats.js.errors.NotFoundError:
                return False
            return True

        view = MemoryView(bound_reads)
        revision = 0
        for state in sorted(set(states)):
            if not self.run(functools.partial(exists, state)):
                continue
            for key, value in self.entries(state).items():
                revision += 1
                view.put(state, key, value, revision)
        return view

    def get(self, state: str, key: str) -> bytes | None:
        """One key's value now, None when there is none."""

        async def go() -> bytes | None:
            try:
                entry = await (await self._kv(state)).get(key, validate_keys=False)
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

    def last_seqs(self, states: tuple[str, ...] = OWN) -> dict[str, int]:
        """Each state's bucket's last revision: any write, even of an equal value, moves it."""

        async def go() -> dict[str, int]:
            out = {}
            for state in states:
                info = await self.js.stream_info(f"KV_{bucket(state)}")
                out[state] = info.state.last_seq
            return out

        seqs: dict[str, int] = self.run(go)
        return seqs

    def stream_replicas(self, state: str) -> int:
        """How many servers keep a state's bucket."""

        async def go() -> int:
            info = await self.js.stream_info(f"KV_{bucket(state)}")
            return int(info.config.num_replicas or 1)

        n: int = self.run(go)
        return n

    def stream_leader(self, state: str) -> str:
        """The name of the server leading a state's bucket's stream now ("" while none does)."""

        async def go() -> str:
            info = await self.js.stream_info(f"KV_{bucket(state)}")
            return str(info.cluster.leader or "") if info.cluster is not None else ""

        leader: str = self.run(go)
        return leader

    def makes_consumers(self, state: str) -> bool:
        """Whether JetStream makes a consumer of a state's bucket now (it needs the cluster's meta leader, as a seat's
        watches do): one is made and deleted at once."""

        async def go() -> bool:
            info = await self.js.add_consumer(f"KV_{bucket(state)}", api.ConsumerConfig(
                ack_policy=api.AckPolicy.NONE, inactive_threshold=5.0, mem_storage=True, num_replicas=1))
            await self.js.delete_consumer(f"KV_{bucket(state)}", info.name)
            return True

        try:
            return bool(self.loop.run(go(), 5))
        except (nats.errors.Error, TimeoutError, OSError):
            return False

    # ---- the operator's channel, as the router keeps it -------------------------------------------------

    def create_asks_stream(self, *, replicas: int = 1) -> None:
        """The router's stream of asks, keeping every ask id for a day against duplicates, and its records."""

        async def go() -> None:
            await self.js.add_stream(name=ROUTER_STREAM, subjects=["asks.>"], duplicate_window=86_400.0,
                                     num_replicas=replicas)

        self.run(go)
        self.create_bucket(ASK_RECORDS, replicas=replicas)

    def asks_published(self) -> list[tuple[str, r.Ask]]:
        """Every ask in the router's stream, in order, with its `Nats-Msg-Id`."""
        return [(msg_id, ask) for _, msg_id, ask in self.asks_since(0)]

    def asks_since(self, after: int) -> list[tuple[int, str, r.Ask]]:
        """The asks in the router's stream past its sequence `after`, in order, each with its sequence and
        `Nats-Msg-Id`."""

        async def go() -> list[tuple[int, str, r.Ask]]:
            info = await self.js.stream_info(ROUTER_STREAM)
            if not info.state.messages:
                return []
            out = []
            for seq in range(max(info.state.first_seq, after + 1), info.state.last_seq + 1):
                try:
                    msg = await self.js.get_msg(ROUTER_STREAM, seq)
                except nats.js.errors.NotFoundError:
                    continue
                if (msg.subject or "").startswith("asks.ask."):
                    msg_id = (msg.headers or {}).get(api.Header.MSG_ID, "")
                    out.append((seq, msg_id, r.decode(r.Ask, msg.data or b"")))
            return out

        asks: list[tuple[int, str, r.Ask]] = self.run(go)
        return asks

    def decide(
        self,
        key: str,
        ask_id: str,
        option: str = "yes",
        *,
        binds: str | None = None,
        signer: Signer | None = None,
    ) -> None:
        """Decide a retiring key's ask as the router does: write its record, then say so on the decided subject."""
        self.put(ASK_RECORDS, ask_id, record(key, ask_id, option, binds=binds, signer=signer))
        self.publish(DECIDED_SUBJECT, b"{}")


def record(
    key: str,
    ask_id: str,
    option: str = "yes",
    *,
    binds: str | None = None,
    signer: Signer | None = None,
    warrant: dict[str, Any] | None = None,
) -> bytes:
    """The router's record of a key's ask decided with `option`, its warrant signed by `signer` when given.

    `warrant` replaces fields of the warrant before it is signed (a forger's or a confused router's record).
    """
    options = tuple(
        r.Option(id=o, label=o, does=o, level="approve", binds=act_digest(act(key, ask_id, o))) for o in ("yes", "no")
    )
    if binds is not None:
        options = tuple(msgspec.structs.replace(o, binds=binds) if o.id == option else o for o in options)
    w = r.Warrant(
        asker=MODULE,
        ask=ask_id,
        outcome="chosen",
        option=option,
        by=r.Identity(who="operator", kind="person", identity="ops@example.org"),
        at=datetime.now(UTC).replace(microsecond=0),
    )
    written: dict[str, Any] = {**msgspec.json.decode(r.encode(w)), **(warrant or {})}
    if signer is not None:
        written = signer.sign(written)
    ask = r.Ask(id=ask_id, headline="Remove?", who="operator", options=options, about="provision." + key)
    return json.dumps({"state": "decided", "ask": msgspec.json.decode(r.encode(ask)), "warrant": written}).encode()


def load_sample(url: str, *, extra: dict[str, dict[str, bytes]] | None = None, replicas: int = 1) -> None:
    """Load the sample mesh into a bus, as the other modules would have written it, plus `extra` states."""
    states = sample_mesh()
    for state, values in (extra or {}).items():
        states.setdefault(state, {}).update(values)
    with EventLoopThread("meshcheck-loader") as loop:
        loop.run(load_states(url, states, replicas=replicas), 60)


def seat_state(bus: Bus) -> dict[str, dict[str, bytes]]:
    """The seat's own states (plans, provisions, refused) as the server holds them."""
    return {state: bus.entries(state) for state in OWN}


def diff(before: dict[str, dict[str, bytes]], after: dict[str, dict[str, bytes]]) -> list[str]:
    """What changed between two readings of the seat's states, one line a key."""
    out = []
    for state in OWN:
        a, b = before.get(state, {}), after.get(state, {})
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                out.append(f"{state} {key}: {short(a.get(key))} -> {short(b.get(key))}")
    return out


def short(value: bytes | None, most: int = 400) -> str:
    """A value for a message: its repr, cut to `most` characters."""
    text = repr(value)
    return text if len(text) <= most else text[:most] + f"... ({len(text)} characters)"


def seat_config(url: str, **overrides: Any) -> Config:
    """A seat's config for a run's bus: the production defaults (its request timeout too), but quick restarts."""
    values: dict[str, Any] = {"nats": url, "backoff_first": 0.01, "backoff_max": 0.2}
    values.update(overrides)
    return Config(**values)


def comparable(p: r.Provision) -> r.Provision:
    """A provision with `at` and `v` left aside: two that compare equal are the same (section 4)."""
    return msgspec.structs.replace(p, at=None, v=0)


def provisions(bus: Bus) -> dict[str, r.Provision]:
    """Every provision of the seat, decoded."""
    return {k: r.decode(r.Provision, v) for k, v in bus.entries(PROVISIONS).items()}


def plans(bus: Bus) -> dict[str, r.PlanRecord]:
    """Every plan of the seat, decoded."""
    return {k: r.decode(r.PlanRecord, v) for k, v in bus.entries(PLANS).items()}


def refusals(bus: Bus) -> dict[str, r.Refusal]:
    """Every refusal of the seat, decoded, `since` left aside."""
    return {k: msgspec.structs.replace(r.decode(r.Refusal, v), since=None) for k, v in bus.entries(REFUSED).items()}
