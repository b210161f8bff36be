"""Chaos: a seat whose actors are killed again and again, or whose NATS server restarts, while the mesh changes,
ends where an undisturbed seat given the same changes ends (design.md, properties 1, 3 and 4).

Two servers get the same sample mesh and, change by change, the same seeded stream of random changes (written to
both at once by another module's connection). One seat serves each: the disturbed one is killed at random (through
the chaos API, `sup.kill`, and by `ActorRef.stop()` from outside), or its server is restarted mid-stream; the
other is left alone. Once both are settled:

- each bus is at a fixed point: a fresh seat over it writes nothing;
- every plan, every needed (non-retiring) provision and every refusal is the same on both, `at`, `v` and a
  refusal's `since` aside; a retiring key may be on one bus only, and a key may be needed on one bus only while a
  retiring key there depends on it (a transient need, kept until the operator answers);
- no ask was published twice: the router's stream holds each `Nats-Msg-Id` once, and every ask it holds is the
  ask its key names, published again after a crash as the very same message;
- every write of the seat's states carried the revision it was judged from (a compare-and-set): the seat's
  connection is spied on, at the requests JetStream publishes go out as;
- a node never composed twice at once, and the restart intensity never tripped.

The stream ends by setting the composition's inputs to a final mesh in which no module is held, so that what each
seat ends with depends on the final inputs alone (a held module keeps its last plan: that depends on history).
"""

from __future__ import annotations

import contextvars
import os
import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client
from seatbus import Bus, Seats, assert_fixed_point, load_sample, plans, provisions, raw, seat_config, seat_state

from mesh_provisioner import supervisor as supervisor_module
from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.config import Config
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import (
    ASK_RECORDS,
    BUILDS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    REFUSED,
    RESOLVED,
    WANTS,
    bound,
)
from mesh_provisioner.samples import sample_mesh
from mesh_provisioner.supervisor import Supervisor

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("CHAOS_SEED", "20261203"))  # another seed: CHAOS_SEED=n
CHANGES = 300
KILLS = 200  # at least this many children die during the stream
STREAM_SECONDS = 90.0  # the stream and its kills end by then, whatever happened
SETTLE_SECONDS = 60.0

NODES = ("ace", "bee", "cat")
FPS = {
    "postgres": ("pg1",),
    "gitea": ("gt1", "gt2"),
    "mesh-vault": ("mv1",),
    "keycloak": ("kc1",),
    "webapp": ("wa1", "wa2"),
    "reports": ("rp1",),
    "mailer": ("ml1",),
    "minio": ("mi1",),
}
MODULES_ALL = tuple(FPS)

# What the sample mesh does not have and the stream uses: minio (object-storage), keycloak's manifest that provides
# object-storage too, gitea's build that needs an oidc client, webapp's build that needs no credential.
EXTRA: dict[str, dict[str, Any]] = {
    MANIFESTS: {
        "m-minio": {"name": "minio", "provides": ["object-storage"]},
        "m-keycloak-s3": {"name": "keycloak", "provides": ["oidc-client", "object-storage"]},
        "m-gitea2": {
            "name": "gitea",
            "requires": [
                {"provision": "postgres-database", "local": "main", "credential": "own"},
                {"provision": "oidc-client"},
            ],
            "provides": [{"name": "forge-account", "answered-by": "helper"}, "npm-package-registry"],
            "state": ["bound"],
            "reads": ["mesh-provisioner.plans"],
        },
        "m-webapp2": {
            "name": "webapp",
            "requires": [{"provision": "postgres-database"}, {"provision": "forge-account"},
                         {"provision": "oidc-client"}],
        },
    },
    MODULES: {"minio": {"module": "minio", "fp": "mi1", "manifest": "m-minio"}},
    BUILDS: {
        "minio.mi1": {"module": "minio", "fp": "mi1", "manifest": "m-minio"},
        "gitea.gt2": {"module": "gitea", "fp": "gt2", "manifest": "m-gitea2"},
        "webapp.wa2": {"module": "webapp", "fp": "wa2", "manifest": "m-webapp2"},
    },
}

# The states the stream changes that compose a node; the final mesh sets each of them.
COMPOSING = (PLACEMENT, WANTS, MODULES, RESOLVED, HAVE)
# The sample's bound entries that name a vault value: left alone, so that a key's reference (which a provision
# keeps from the last entry that named one) cannot depend on which intermediate entries a seat happened to see.
REFERENCED = {
    (bound("postgres"), "ace.gitea.postgres-database.main"),
    (bound("mesh-vault"), "ace.gitea.postgres-database-credential.main"),
    (bound("mesh-vault"), "ace.postgres.postgres-database-credential"),
}
Change = tuple[str, str, dict[str, Any] | None]
# Not a state: the router decides every ask it holds and has not decided yet, each key's answer always the same.
ROUTER = "router"


def extra_states() -> dict[str, dict[str, bytes]]:
    return {state: {key: raw(v) for key, v in values.items()} for state, values in EXTRA.items()}


def final_mesh() -> dict[tuple[str, str], bytes]:
    """The composing inputs the stream ends with: the sample's, and minio on cat, so that reports composes."""
    sample = sample_mesh()
    out = {(state, key): v for state in COMPOSING for key, v in sample.get(state, {}).items()}
    out[(PLACEMENT, "cat")] = raw({"node": "cat", "modules": [{"module": "minio"}]})
    out[(MODULES, "minio")] = raw(EXTRA[MODULES]["minio"])
    return out


def bound_keys() -> list[tuple[str, str]]:
    """The provider entries the stream writes: keys the seat may make on any node, but the referenced ones."""
    out = []
    for node in NODES:
        for provider, key in (
            ("postgres", f"{node}.webapp.postgres-database"),
            ("postgres", f"{node}.mailer.postgres-database.mail"),
            ("postgres", f"{node}.gitea.postgres-database.main"),
            ("gitea", f"{node}.webapp.forge-account"),
            ("mesh-vault", f"{node}.mailer.postgres-database-credential.mail"),
            ("mesh-vault", f"{node}.gitea.postgres-database-credential.main"),
            ("mesh-vault", f"{node}.postgres.postgres-database-credential"),
        ):
            if (bound(provider), key) not in REFERENCED:
                out.append((bound(provider), key))
    return out


def stream(seed: int, n: int) -> list[Change]:
    """A seeded stream of n random changes of the other modules' states, then the final mesh."""
    rng = random.Random(seed)
    bounds = bound_keys()
    sample_haves = list(sample_mesh()[HAVE])
    wanted = [key.removeprefix("want.") for key in sample_mesh()[WANTS]]
    changes: list[Change] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.18:
            node = rng.choice(NODES)
            modules = [m for m in MODULES_ALL if rng.random() < 0.45]
            changes.append((PLACEMENT, node, {"node": node, "modules": [{"module": m} for m in modules]}))
        elif roll < 0.32:
            node, module = rng.choice(NODES), rng.choice(MODULES_ALL)
            choice = rng.random()
            value = {"fp": rng.choice(FPS[module])} if choice < 0.7 else {"fp": "", "removed": True}
            changes.append((WANTS, f"want.{node}.{module}", value if choice < 0.9 else None))
        elif roll < 0.46:
            # Only haves of modules the final mesh wants: a have of a module with no want composes it.
            key = rng.choice(sample_haves + wanted)
            module = key.split(".", 1)[1]
            phase, health = rng.choice([("running", "ok"), ("running", "ok"), ("starting", "unknown"),
                                        ("failed", "failed"), ("running", "failed")])
            changes.append((HAVE, key, {"fp": FPS[module][0], "phase": phase, "health": health}))
        elif roll < 0.80:
            state, key = rng.choice(bounds)
            value = rng.choice([{"state": "provided"}, {"state": "provided"}, {"state": "failed", "why": "quota"},
                                {"state": "waits", "why": "a person accepts it"}, None])
            changes.append((state, key, value))
        elif roll < 0.90:
            node = rng.choice(NODES)
            value = {"providers": {"oidc-client": rng.choice(NODES), "object-storage": rng.choice(NODES)}}
            changes.append((RESOLVED, f"{node}.webapp", value if rng.random() < 0.7 else None))
        elif roll < 0.97:
            manifest = rng.choice(["m-keycloak", "m-keycloak-s3"])
            changes.append((MODULES, "keycloak", {"module": "keycloak", "fp": "kc1", "manifest": manifest}))
        else:
            changes.append((ROUTER, "", None))
    # The final mesh: every composing key the stream touched, and every key of the final mesh, set to it.
    final = final_mesh()
    touched = {(state, key) for state, key, _ in changes if state in COMPOSING}
    for state, key in sorted(touched | set(final)):
        value = final.get((state, key))
        changes.append((state, key, msgspec.json.decode(value) if value is not None else None))
    return changes


# ---- spies -------------------------------------------------------------------------------------------------------


_IN_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar("in_request", default=False)


class CasSpy:
    """Every request a seat's connection sends to one of the seat's own buckets, and those with no expected revision.

    JetStream publishes go out as requests; a blind put (no `Nats-Expected-Last-Subject-Sequence`) or a plain
    publish into a bucket of the seat is counted as blind.
    """

    PREFIX = "$KV.mesh-provisioner_"

    def __init__(self) -> None:
        self.writes = 0
        self.blind: list[str] = []

    def wrap(self, nc: Client) -> Client:
        request, publish = nc.request, nc.publish

        async def spied_request(subject: str, payload: bytes = b"", *args: Any, **kwargs: Any) -> Any:
            if subject.startswith(self.PREFIX):
                headers = kwargs.get("headers") or (args[2] if len(args) > 2 else None) or {}
                self.writes += 1
                if "Nats-Expected-Last-Subject-Sequence" not in headers:
                    self.blind.append(f"{subject} {headers}")
            token = _IN_REQUEST.set(True)
            try:
                return await request(subject, payload, *args, **kwargs)
            finally:
                _IN_REQUEST.reset(token)

        async def spied_publish(subject: str, payload: bytes = b"", *args: Any, **kwargs: Any) -> None:
            if subject.startswith(self.PREFIX) and not _IN_REQUEST.get():
                self.blind.append(f"{subject} (a plain publish)")
            await publish(subject, payload, *args, **kwargs)

        nc.request = spied_request  # type: ignore[method-assign]
        nc.publish = spied_publish  # type: ignore[method-assign]
        return nc


class ComposeSpy:
    """Counts concurrent compositions of each node of each seat (a seat's nodes are told apart by its view)."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.lock = threading.Lock()
        self.running: Counter[tuple[int, str]] = Counter()
        self.most = 0
        self.count = 0

    def __call__(self, view: Any, node: str, now: Any) -> Any:
        who = (id(view), node)
        with self.lock:
            self.running[who] += 1
            self.count += 1
            self.most = max(self.most, self.running[who])
        try:
            return self.real(view, node, now)
        finally:
            with self.lock:
                self.running[who] -= 1


@pytest.fixture
def cas(monkeypatch: pytest.MonkeyPatch) -> CasSpy:
    """Every supervisor started from now on has its connection spied on."""
    spy = CasSpy()
    real = supervisor_module.connect_config

    async def connect_spied(config: Config) -> Client:
        return spy.wrap(await real(config))

    monkeypatch.setattr(supervisor_module, "connect_config", connect_spied)
    return spy


@pytest.fixture
def composing(monkeypatch: pytest.MonkeyPatch) -> ComposeSpy:
    spy = ComposeSpy(node_actor.compose_node)
    monkeypatch.setattr(node_actor, "compose_node", spy)
    return spy


@pytest.fixture
def reference(tmp_path: Path) -> Iterator[NatsServer]:
    """A second nats-server, for the undisturbed seat."""
    root = tmp_path / "reference"
    root.mkdir()
    server = NatsServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---- the two runs --------------------------------------------------------------------------------------------------


class Twin:
    """The same mesh on two buses, a seat on each: `disturbed` is the one the test disturbs."""

    def __init__(self, disturbed: Bus, undisturbed: Bus, seats: Seats, **config: Any) -> None:
        self.buses = (disturbed, undisturbed)
        for bus in self.buses:
            load_sample(bus.url, extra=extra_states())
            bus.create_asks_stream()
        self.config = config
        self.disturbed = seats.start(seat_config(disturbed.url, **config))
        self.undisturbed = seats.start(seat_config(undisturbed.url, **config))
        for sup in (self.disturbed, self.undisturbed):
            assert sup.wait_settled(SETTLE_SECONDS)

    def write(self, change: Change) -> None:
        state, key, value = change
        for bus in self.buses:
            if state == ROUTER:
                decide_all(bus)
            else:
                bus.write(state, key, value)

    def settle(self) -> float:
        """Seconds until both seats are settled; fails past SETTLE_SECONDS."""
        started = time.monotonic()
        for sup in (self.disturbed, self.undisturbed):
            assert sup.wait_settled(SETTLE_SECONDS), f"not settled within {SETTLE_SECONDS} s: {sup.status()}"
        return time.monotonic() - started

    def check(self, cas: CasSpy, composing: ComposeSpy) -> str:
        """Every check of this module's docstring; says what was compared."""
        disturbed, undisturbed = self.buses
        assert not self.disturbed.failed.done(), self.disturbed.failed.result()
        for bus in self.buses:
            assert_fixed_point(bus, seat_config(bus.url, **self.config))
        same = assert_same(disturbed, undisturbed)
        for bus in self.buses:
            assert_asked_once(bus)
        assert cas.writes > 0 and not cas.blind, cas.blind[:10]
        assert composing.count > 0 and composing.most == 1
        return same


def decide_all(bus: Bus) -> None:
    """The router decides each ask it holds and has not decided yet: yes for about half the keys, no for the rest."""
    for msg_id, ask in bus.asks_published():
        if bus.get(ASK_RECORDS, msg_id) is None:
            key = ask.about.removeprefix("provision.")
            bus.decide(key, msg_id, "yes" if zlib.crc32(key.encode()) % 2 else "no")


def assert_same(a: Bus, b: Bus) -> str:
    """The same plans, needed provisions and refusals on both buses (see the module's docstring); says how many."""
    assert plans(a) == plans(b)
    pa, pb = provisions(a), provisions(b)
    retiring = {key for ps in (pa, pb) for key, p in ps.items() if p.state == r.RETIRING}
    # A key a retiring key depends on stays needed, as it was when last composed, until the operator answers; so
    # does what that key depends on in turn. Such needs are transient: which keys they keep, and as what, depends
    # on what each seat saw on the way.
    transient: set[str] = set()
    todo = [dep for ps in (pa, pb) for p in ps.values() if p.state == r.RETIRING for dep in p.depends_on]
    while todo:
        dep = todo.pop()
        if dep not in transient:
            transient.add(dep)
            todo.extend(d for ps in (pa, pb) if dep in ps for d in ps[dep].depends_on)
    same, allowed = 0, 0
    for key in sorted((pa.keys() | pb.keys()) - retiring):
        x, y = (msgspec.structs.replace(p, at=None, v=0) if p is not None else None for p in (pa.get(key), pb.get(key)))
        if x is not None and x == y:
            same += 1
            continue
        assert key in transient, (
            f"{key} differs, and no retiring key depends on it:\n"
            + "\n".join(r.encode(p).decode() if p is not None else "(none)" for p in (x, y))
        )
        allowed += 1
    ra, rb = (
        {k: msgspec.structs.replace(r.decode(r.Refusal, v), since=None) for k, v in seat_state(bus)[REFUSED].items()}
        for bus in (a, b)
    )
    assert ra == rb == {}, "the final mesh holds no module"
    return (
        f"{len(plans(a))} plans and {same} needed provisions the same; {len(retiring)} retiring, and {allowed} "
        "different while a retiring key depends on them"
    )


def assert_asked_once(bus: Bus) -> None:
    """Each ask in the router's stream once, and each the very ask its key names (its id made from the key)."""
    asks = bus.asks_published()
    ids = Counter(msg_id for msg_id, _ in asks)
    assert all(n == 1 for n in ids.values()), [i for i, n in ids.items() if n > 1]
    for msg_id, ask in asks:
        key = ask.about.removeprefix("provision.")
        assert msg_id == ask.id and k.ask_raised_at(msg_id) is not None, ask
        assert msg_id.startswith("retire-" + key.replace(".", "-") + "-"), (msg_id, key)


# ---- the tests ------------------------------------------------------------------------------------------------------


def kill_one(sup: Supervisor, rng: random.Random) -> bool:
    """Kill a random live child, by the chaos API or by a stop from outside; whether one was alive."""
    alive = [(n, ref) for n, ref in sup.children().items() if ref.is_alive()]
    if not alive:
        return False
    name, ref = rng.choice(alive)
    if rng.random() < 0.5:
        sup.kill(name)
    else:
        ref.stop(block=False)
    return True


def restarts(sup: Supervisor) -> int:
    return sum(sup.status().restarts.values())


def test_chaos_kills_during_a_stream_of_changes(
    nats_server: NatsServer, reference: NatsServer, seats: Seats, cas: CasSpy, composing: ComposeSpy
) -> None:
    rng = random.Random(SEED)
    changes = stream(SEED, CHANGES)
    disturbed, undisturbed = Bus(nats_server.url), Bus(reference.url)
    try:
        twin = Twin(disturbed, undisturbed, seats, restart_intensity=100_000, backoff_first=0.005, backoff_max=0.05)
        sup = twin.disturbed
        deadline = time.monotonic() + STREAM_SECONDS
        i = 0
        while (i < len(changes) or restarts(sup) < KILLS) and time.monotonic() < deadline:
            if i < len(changes):
                twin.write(changes[i])
                i += 1
            kill_one(sup, rng)
            if i % 10 == 0:
                # Let the restarts happen now and then: a child killed while down is not killed again.
                wait_until(lambda: all(ref.is_alive() for ref in sup.children().values()), 10,
                           what="every child restarted")
        killed = restarts(sup)
        settled_in = twin.settle()
        print(f"chaos: {i} changes, {killed} kills, settled {settled_in:.2f} s after the last; "  # noqa: T201
              f"{composing.count} compositions, {cas.writes} compare-and-sets, "
              f"{sup.asks.duplicates} asks published again and kept once, "
              f"{len(disturbed.entries(ASK_RECORDS))} decided by the router")
        assert i == len(changes), "the stream did not end in time"
        assert killed >= KILLS
        print(twin.check(cas, composing))  # noqa: T201
    finally:
        disturbed.close()
        undisturbed.close()


def test_nats_server_restarted_mid_stream(
    nats_server: NatsServer, reference: NatsServer, seats: Seats, cas: CasSpy, composing: ComposeSpy
) -> None:
    changes = stream(SEED + 1, CHANGES // 2)
    disturbed, undisturbed = Bus(nats_server.url), Bus(reference.url)
    try:
        twin = Twin(disturbed, undisturbed, seats)
        cache = twin.disturbed.cache
        for i, change in enumerate(changes):
            if i == len(changes) // 3:
                nats_server.stop()
                nats_server.start()
            elif i == 2 * len(changes) // 3:
                # The changes since the first restart were made while the seat was away, or as it came back: they
                # must arrive as changes. It is back before the server goes again.
                wait_until(lambda: cache.resyncs >= 1, 30, what="the seat back on the bus")
                nats_server.stop()
                nats_server.start()
            twin.write(change)
        settled_in = twin.settle()
        print(f"restart: {len(changes)} changes, the server restarted twice, "  # noqa: T201
              f"settled {settled_in:.2f} s after the last; cache resyncs {cache.resyncs}")
        assert cache.resyncs >= 2
        print(twin.check(cas, composing))  # noqa: T201
    finally:
        disturbed.close()
        undisturbed.close()
