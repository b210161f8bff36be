"""The watched cache against a real server: loading, following, waiting for buckets, bad values, restarts."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import nats
import pytest
from helpers import NatsServer, seed_buckets, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache, watched_states
from mesh_provisioner.bus.connection import stream_of
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import MANIFESTS, MODULES, PLACEMENT, PLANS, PROVISIONS, READS, bound, bucket
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.view import Entry

Change = tuple[str, str, Entry | None, Entry | None, bool]


def placement(node: str, *modules: str) -> bytes:
    return r.encode(r.Placement(node=node, modules=tuple(r.PlacedModule(m) for m in modules)))


def put(loop: EventLoopThread, client: Client, state: str, key: str, raw: bytes) -> int:
    """Another module's put: answers the new revision."""

    async def go() -> int:
        kv = await client.jetstream().key_value(bucket(state))
        return await kv.put(key, raw)

    return loop.run(go(), 10)


def delete(loop: EventLoopThread, client: Client, state: str, key: str, *, purge: bool = False) -> None:
    async def go() -> None:
        kv = await client.jetstream().key_value(bucket(state))
        await (kv.purge(key) if purge else kv.delete(key))

    loop.run(go(), 10)


def on_loop(loop: EventLoopThread, call: Callable[[], object]) -> None:
    """Call on the loop's thread, where the store calls the cache."""

    async def go() -> None:
        call()

    loop.run(go(), 5)


class Started:
    """A started cache and every change it told."""

    def __init__(self, loop: EventLoopThread, nc: Client, **options: Any) -> None:
        self.changes: list[Change] = []
        self.loop = loop
        self.cache = Cache(nc, on_change=lambda *c: self.changes.append(c), **options)
        loop.run(self.cache.start(), 10)

    def synced(self) -> Cache:
        self.loop.run(self.cache.wait_synced(10), 15)
        return self.cache

    def told(self, state: str, key: str) -> list[Change]:
        return [c for c in self.changes if c[0] == state and c[1] == key]


Start = Callable[..., Started]


@pytest.fixture
def started(loop: EventLoopThread, nc: Client) -> Iterator[Start]:
    """Start caches on the seat's connection (options as `Cache` takes them); each is stopped after the test."""
    holder: list[Started] = []

    def make(**options: Any) -> Started:
        holder.append(Started(loop, nc, **options))
        return holder[-1]

    yield make
    for s in holder:
        loop.run(s.cache.stop(), 10)


def test_watched_states_are_what_the_rules_read_and_the_seat_owns() -> None:
    states = watched_states(["postgres"])
    assert states[: len(READS)] == READS
    assert {bound("postgres"), "asks.records", PLANS, PROVISIONS, "mesh-provisioner.refused"} <= set(states)


def test_initial_load_then_live_changes_keep_the_indices(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT, MODULES, MANIFESTS])
    put(loop, other, PLACEMENT, "ace", placement("ace", "gitea", "postgres"))
    put(loop, other, MODULES, "postgres", r.encode(r.ModuleEntry(module="postgres", fp="f1", manifest="m1")))
    put(loop, other, MANIFESTS, "m1", b'{"name": "postgres", "provides": ["postgres-database"]}')

    s = started(states=[PLACEMENT, MODULES, MANIFESTS])
    view = s.synced().view
    assert s.cache.synced
    assert view.placed_on("gitea") == ["ace"]
    assert view.providers_of("postgres-database") == {"postgres"}
    assert {(c[0], c[1]) for c in s.changes} == {(PLACEMENT, "ace"), (MODULES, "postgres"), (MANIFESTS, "m1")}

    # Live: another node placed, the first one's placement deleted, the manifest no longer providing.
    rev = put(loop, other, PLACEMENT, "bee", placement("bee", "gitea"))
    wait_until(lambda: view.placed_on("gitea") == ["ace", "bee"], what="bee placed")
    entry = view.get(PLACEMENT, "bee")
    assert entry is not None and entry.revision == rev
    delete(loop, other, PLACEMENT, "ace")
    wait_until(lambda: view.placed_on("gitea") == ["bee"], what="ace's placement deleted")
    assert view.get(PLACEMENT, "ace") is None
    (_, _, old, new, _), = s.told(PLACEMENT, "ace")[-1:]
    assert old is not None and new is None
    put(loop, other, MANIFESTS, "m1", b'{"name": "postgres", "provides": []}')
    wait_until(lambda: not view.providers_of("postgres-database"), what="postgres no longer provides")
    delete(loop, other, PLACEMENT, "bee", purge=True)
    wait_until(lambda: view.placed_on("gitea") == [], what="bee's placement purged")


def test_a_bucket_created_after_the_cache_started_is_picked_up(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    state = bound("postgres")
    # Looking again only every minute: what wakes the watch is JetStream's advisory that the bucket was made.
    s = started(states=[PLACEMENT, state], backoff=(60.0, 60.0), poll_missing=60.0)
    s.synced()  # a missing bucket does not hold the cache back (contract section 2)
    seed_buckets(nats_server.url, [state])
    put(loop, other, state, "ace.gitea.postgres-database", b'{"state": "provided"}')
    entry = wait_until(lambda: s.cache.view.get(state, "ace.gitea.postgres-database"), what="the bound entry")
    assert entry is not None and entry.get(r.BoundEntry) == r.BoundEntry(state="provided")

    # A bucket deleted takes its keys with it, and one made again is watched again.
    loop.run(other.jetstream().delete_key_value(bucket(state)), 10)
    wait_until(lambda: s.cache.view.get(state, "ace.gitea.postgres-database") is None, what="the keys forgotten")
    seed_buckets(nats_server.url, [state])
    put(loop, other, state, "bee.gitea.postgres-database", b'{"state": "waits"}')
    wait_until(lambda: s.cache.view.get(state, "bee.gitea.postgres-database"), what="the bucket made again")


def test_a_missing_bucket_is_said_once_not_at_each_resynchronisation(
    loop: EventLoopThread, nats_server: NatsServer, started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    state = bound("postgres")
    with caplog.at_level(logging.INFO, logger="mesh_provisioner.bus.cache"):
        s = started(states=[PLACEMENT, state])
        s.synced()
        for _ in range(3):
            loop.run(s.cache.resync(), 30)
        seed_buckets(nats_server.url, [state])
        wait_until(lambda: any("exists now" in m for m in caplog.messages), what="the bucket made")
    waiting = [m for m in caplog.messages if "does not exist yet" in m]
    assert waiting == [f"bucket {bucket(state)} does not exist yet: it is read once it is created; the seat goes on "
                       "meanwhile"], caplog.messages


def test_a_value_that_does_not_decode_is_kept_with_why_and_the_watch_goes_on(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    put(loop, other, PLACEMENT, "ace", b"not json")
    put(loop, other, PLACEMENT, "bee", b'{"node": "bee", "modules": "gitea"}')
    s = started(states=[PLACEMENT])
    view = s.synced().view
    ace, bee = view.get(PLACEMENT, "ace"), view.get(PLACEMENT, "bee")
    assert ace is not None and ace.value is None and "mesh-controller.placement ace" in ace.error
    assert bee is not None and bee.value is None and bee.error
    put(loop, other, PLACEMENT, "cat", placement("cat", "gitea"))
    wait_until(lambda: view.placed_on("gitea") == ["cat"], what="a good value after bad ones")


def test_note_written_is_read_at_once_and_nothing_goes_backwards(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    s = started(states=[PLACEMENT])
    cache = s.synced()
    first = put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))
    second = put(loop, other, PLACEMENT, "ace", placement("ace", "postgres"))
    wait_until(lambda: (e := cache.view.get(PLACEMENT, "ace")) is not None and e.revision == second)

    def note(raw: bytes | None, revision: int) -> None:
        on_loop(loop, lambda: cache.note_written(PLACEMENT, "ace", raw, revision))

    note(placement("ace", "gitea"), first)  # older: ignored
    assert cache.view.placed_on("postgres") == ["ace"]
    note(placement("ace", "keycloak"), second + 10)  # newer: kept at once
    assert cache.view.placed_on("keycloak") == ["ace"]
    note(None, second + 11)  # a delete, newer still
    assert cache.view.get(PLACEMENT, "ace") is None
    note(placement("ace", "gitea"), second + 5)  # older than the delete: stays deleted
    assert cache.view.get(PLACEMENT, "ace") is None
    cache.note_written("some-module.other", "x", b"{}", 1)  # a state not watched: ignored
    assert cache.view.get("some-module.other", "x") is None


def test_a_change_is_told_as_the_seats_own_only_when_the_seat_made_it(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    s = started(states=[PLACEMENT])
    cache = s.synced()

    def last_told(key: str, revision: int) -> bool:
        wait_until(lambda: any(c[3] is not None and c[3].revision == revision for c in s.told(PLACEMENT, key)))
        return s.told(PLACEMENT, key)[-1][4]

    assert last_told("ace", put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))) is False
    on_loop(loop, lambda: cache.note_written(PLACEMENT, "ace", placement("ace", "postgres"), 100))
    assert last_told("ace", 100) is True
    # A write the seat is making: its echo may come before its acknowledgement, and is the seat's own then.
    mine = (PLACEMENT, "bee", placement("bee", "gitea"))
    on_loop(loop, lambda: cache.begin_writes([mine]))
    assert last_told("bee", put(loop, other, PLACEMENT, "bee", mine[2])) is True
    assert last_told("bee", put(loop, other, PLACEMENT, "bee", placement("bee", "postgres"))) is False
    on_loop(loop, lambda: cache.end_writes([mine]))
    assert last_told("bee", put(loop, other, PLACEMENT, "bee", mine[2])) is False


def test_a_request_of_the_cache_gives_up_after_its_request_timeout(
    loop: EventLoopThread, nats_server: NatsServer, started: Start
) -> None:
    # Config.request_timeout bounds every call to the bus; nats-py's own default for a JetStream request is 5 s.
    seed_buckets(nats_server.url, [PLACEMENT])
    cache = started(states=[PLACEMENT], request_timeout=0.5).synced()
    nats_server.pause()
    try:
        began = time.monotonic()
        assert loop.run(cache.refresh(PLACEMENT, "ace"), 10) is False
        assert time.monotonic() - began < 4, "the cache's request waited past its timeout"
    finally:
        nats_server.resume()


def test_resync_reconciles_what_no_watch_tells(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))
    put(loop, other, PLACEMENT, "bee", placement("bee", "gitea"))
    s = started(states=[PLACEMENT])
    cache = s.synced()
    # Purging the stream removes keys without a marker: a watch never hears of it, a resync does.
    loop.run(other.jetstream().purge_stream(stream_of(PLACEMENT), subject=f"$KV.{bucket(PLACEMENT)}.ace"), 10)
    told = len(s.changes)
    loop.run(cache.resync(), 15)
    assert cache.view.placed_on("gitea") == ["bee"]
    assert [(c[1], c[3]) for c in s.changes[told:]] == [("ace", None)]  # bee, unchanged, is not told again

    # A write's own note that arrives after a reload holding something newer is old news, even for a key
    # the reload found deleted: bee was written at `rev`, deleted since, and stays deleted.
    rev = cache.view.get(PLACEMENT, "bee").revision  # type: ignore[union-attr]
    delete(loop, other, PLACEMENT, "bee")
    loop.run(cache.resync(), 15)
    assert cache.view.get(PLACEMENT, "bee") is None

    async def note() -> None:
        cache.note_written(PLACEMENT, "bee", placement("bee", "gitea"), rev)

    loop.run(note(), 5)
    assert cache.view.get(PLACEMENT, "bee") is None


def test_after_a_server_restart_the_cache_catches_up_without_leaking_consumers(
    loop: EventLoopThread, nats_server: NatsServer, started: Start
) -> None:
    states = [PLACEMENT, MODULES]
    seed_buckets(nats_server.url, states)
    asyncio.run(_write(nats_server.url, [("ace", placement("ace", "gitea")), ("bee", placement("bee", "gitea")),
                                         ("dog", placement("dog", "gitea"))]))
    s = started(states=states)
    cache = s.synced()
    assert cache.view.placed_on("gitea") == ["ace", "bee", "dog"]

    # The seat's loop is held while the server restarts and another module changes things, so the seat cannot
    # reconnect before they are made: it must find them by loading every bucket again.
    gate = threading.Event()
    held = loop.submit(_hold(gate))
    try:
        nats_server.stop()
        nats_server.start()
        asyncio.run(_write(nats_server.url, [("cat", placement("cat", "gitea")), ("ace", placement("ace", "postgres")),
                                             ("bee", None), ("dog", b"purge")]))
    finally:
        gate.set()
        held.result(10)
    wait_until(lambda: cache.resyncs >= 1, what="a resync after the reconnect")
    wait_until(lambda: cache.view.placed_on("gitea") == ["cat"], what="the changes made while the seat was away")
    assert cache.view.placed_on("postgres") == ["ace"]
    assert [c[3] for c in s.told(PLACEMENT, "dog")][-1] is None  # purged with no marker: only a reload tells

    # The watches live on: a change made now arrives too, and each bucket has one consumer, the new watch's.
    asyncio.run(_write(nats_server.url, [("eel", placement("eel", "keycloak"))]))
    wait_until(lambda: cache.view.placed_on("keycloak") == ["eel"], what="a change after the resync")

    async def consumers() -> list[int]:
        js = cache_nc(cache).jetstream()
        return [(await js.stream_info(stream_of(state))).state.consumer_count for state in states]

    wait_until(lambda: loop.run(consumers(), 10) == [1, 1], what="one consumer per watched bucket")


async def _hold(gate: threading.Event) -> None:
    """Hold the loop's thread until the gate opens: nothing of the seat's runs meanwhile."""
    gate.wait(30)


async def _write(url: str, changes: list[tuple[str, bytes | None]]) -> None:
    """Another module's placements on its own connection: a value, None to delete, b"purge" to purge silently."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        kv = await js.key_value(bucket(PLACEMENT))
        for key, raw in changes:
            if raw is None:
                await kv.delete(key)
            elif raw == b"purge":
                await js.purge_stream(stream_of(PLACEMENT), subject=f"$KV.{bucket(PLACEMENT)}.{key}")
            else:
                await kv.put(key, raw)
    finally:
        await nc.close()


def cache_nc(cache: Cache) -> Client:
    return cache._nc


def test_requests_are_counted_and_reading_the_view_makes_none(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))
    s = started(states=[PLACEMENT])
    cache = s.synced()
    before = cache.requests
    assert before > 0
    assert cache.view.placed_on("gitea") == ["ace"]
    assert list(cache.view.keys(PLACEMENT)) == ["ace"]
    assert cache.requests == before


def test_every_state_of_the_seat_is_watched_and_missing_buckets_do_not_hold_the_sync(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [*READS, PLANS, PROVISIONS])  # no bound buckets, no asks.records, no refused
    put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))
    s = started()
    cache = s.synced()
    assert set(cache.states) == set(watched_states())
    assert cache.view.placed_on("gitea") == ["ace"]


def test_refresh_reads_one_key_now_and_caught_up_says_when_memory_has_everything(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    s = started(states=[PLACEMENT])
    cache = s.synced()
    assert loop.run(cache.caught_up(), 10)
    rev = put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))

    # Right after a write, refresh has its value in memory, whether or not the watch brought it already.
    async def write_then_refresh() -> Entry | None:
        kv = await other.jetstream().key_value(bucket(PLACEMENT))
        await kv.put("bee", placement("bee", "gitea"))
        await cache.refresh(PLACEMENT, "bee")
        return cache.view.get(PLACEMENT, "bee")

    entry = loop.run(write_then_refresh(), 10)
    assert entry is not None and entry.revision > rev
    wait_until(lambda: loop.run(cache.caught_up(), 10), what="the cache caught up")
    assert cache.view.placed_on("gitea") == ["ace", "bee"]

    async def delete_then_refresh() -> Entry | None:
        kv = await other.jetstream().key_value(bucket(PLACEMENT))
        await kv.delete("bee")
        await cache.refresh(PLACEMENT, "bee")
        return cache.view.get(PLACEMENT, "bee")

    assert loop.run(delete_then_refresh(), 10) is None
    wait_until(lambda: loop.run(cache.caught_up(), 10), what="the cache caught up again")


def test_refresh_on_a_bus_out_of_reach_returns_and_leaves_memory_as_it_is(
    loop: EventLoopThread, nats_server: NatsServer, other: Client, started: Start
) -> None:
    # A read again after a conflict, on a server that stopped answering, says so: its caller does its work again
    # later. It raised into the actor, which crashed.
    seed_buckets(nats_server.url, [PLACEMENT])
    put(loop, other, PLACEMENT, "ace", placement("ace", "gitea"))
    cache = started(states=[PLACEMENT]).synced()
    held = cache.view.get(PLACEMENT, "ace")
    nats_server.pause()
    try:
        assert loop.run(cache.refresh(PLACEMENT, "ace"), 30) is False  # nats-py's request times out inside, in 5 s
    finally:
        nats_server.resume()
    assert cache.view.get(PLACEMENT, "ace") == held
    assert cache.view.placed_on("gitea") == ["ace"]


def test_on_resync_is_told_once_every_bucket_is_loaded_again(
    loop: EventLoopThread, nats_server: NatsServer, started: Start
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])
    told: list[str] = []
    s = started(states=[PLACEMENT, MODULES], on_resync=lambda: told.append("resynced"))
    s.synced()
    nats_server.stop()
    nats_server.start()
    wait_until(lambda: told == ["resynced"], what="the resync told")
    assert s.cache.resyncs == 1
