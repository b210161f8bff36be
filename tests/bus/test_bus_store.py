"""Compare-and-set writes against a real server: create, update, delete, and conflicts between two writers."""

from __future__ import annotations

import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import ensure_buckets
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.store import Applied, Store
from mesh_provisioner.contract import PLANS, REFUSED, SEAT_STATES
from mesh_provisioner.messages.writes import Delete, Put, Write

A, B = b'{"node": "ace", "module": "gitea", "why": "a"}', b'{"node": "ace", "module": "gitea", "why": "b"}'


@pytest.fixture
def seat(loop: EventLoopThread, nc: Client) -> Client:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES), 10)
    return nc


def apply(loop: EventLoopThread, store: Store, *writes: Write) -> Applied:
    return loop.run(store.apply(list(writes)), 10)


def test_create_update_delete_each_on_the_revision_judged_from(loop: EventLoopThread, seat: Client) -> None:
    store = Store(seat)
    made = apply(loop, store, Put(REFUSED, "ace.gitea", A, 0))
    assert made.ok
    ((_, rev1),) = made.done
    made = apply(loop, store, Put(REFUSED, "ace.gitea", B, rev1))
    ((_, rev2),) = made.done
    assert made.ok and rev2 > rev1
    made = apply(loop, store, Delete(REFUSED, "ace.gitea", rev2))
    ((_, rev3),) = made.done
    assert made.ok and rev3 > rev2
    # Created again after the delete, from "no key" (revision 0).
    assert apply(loop, store, Put(REFUSED, "ace.gitea", A, 0)).ok
    assert store.counts() == {"writes": 4, "conflicts": 0, "failed writes": 0, "writes sent again": 0}


def test_two_writers_one_conflicts_and_its_batch_stops_there(
    loop: EventLoopThread, seat: Client, other: Client
) -> None:
    mine, theirs = Store(seat), Store(other)
    ((_, rev),) = apply(loop, mine, Put(REFUSED, "ace.gitea", A, 0)).done

    # Both judged from "no key": the second create conflicts.
    lost = apply(loop, theirs, Put(REFUSED, "ace.gitea", B, 0))
    assert lost.conflict == Put(REFUSED, "ace.gitea", B, 0) and not lost.done and "conflicts" in lost.error

    # Both judged from rev: the first update wins, the second conflicts. The batch is published at once, so what
    # follows the conflict is made too, each write checked against its own key: the batch says which landed.
    assert apply(loop, mine, Put(REFUSED, "ace.gitea", B, rev)).ok
    stale = Put(REFUSED, "ace.gitea", A, rev)
    after = Put(REFUSED, "bee.gitea", A, 0)
    lost = apply(loop, theirs, Put(REFUSED, "cat.gitea", A, 0), stale, after)
    assert [w for w, _ in lost.done] == [Put(REFUSED, "cat.gitea", A, 0), after]
    assert lost.conflict == stale and "conflicts" in lost.error

    # A delete on a stale revision conflicts too.
    lost = apply(loop, theirs, Delete(REFUSED, "ace.gitea", rev))
    assert lost.conflict == Delete(REFUSED, "ace.gitea", rev)
    assert (theirs.writes, theirs.conflicts) == (2, 3)

    async def read(key: str) -> bytes | None:
        kv = await other.jetstream().key_value("mesh-provisioner_refused")
        try:
            return (await kv.get(key)).value
        except Exception:
            return None

    assert loop.run(read("ace.gitea"), 5) == B
    assert loop.run(read("bee.gitea"), 5) == A


def test_writes_that_are_never_made(loop: EventLoopThread, seat: Client, nats_server: NatsServer) -> None:
    store = Store(seat)
    blind = apply(loop, store, Delete(REFUSED, "ace.gitea", 0))
    assert blind.error and "needs the revision" in blind.error and not blind.conflict
    bad = apply(loop, store, Put(REFUSED, "ace.gi tea", A, 0))
    assert "not tokens" in bad.error
    missing = apply(loop, store, Put("mesh-controller.placement", "ace", A, 0))
    assert "does not exist" in missing.error
    assert store.writes == 0


def test_each_write_made_is_in_the_cache_at_once(loop: EventLoopThread, seat: Client, other: Client) -> None:
    cache = Cache(seat, states=[PLANS, REFUSED])
    loop.run(cache.start(), 10)
    try:
        loop.run(cache.wait_synced(10), 15)
        store = Store(seat, cache)
        made = apply(loop, store, Put(REFUSED, "ace.gitea", A, 0))
        # Read your writes: no waiting for the watch.
        entry = cache.view.get(REFUSED, "ace.gitea")
        assert entry is not None and entry.revision == made.done[0][1] and entry.raw == A
        apply(loop, store, Delete(REFUSED, "ace.gitea", entry.revision))
        assert cache.view.get(REFUSED, "ace.gitea") is None
        # The watch's own report of those writes comes later and changes nothing: once a later write of another
        # writer has come through the watch (it delivers in order), the key is still deleted.
        apply(loop, Store(other), Put(REFUSED, "bee.gitea", A, 0))
        wait_until(lambda: cache.view.get(REFUSED, "bee.gitea"), what="the other writer's key")
        assert cache.view.get(REFUSED, "ace.gitea") is None
    finally:
        loop.run(cache.stop(), 10)


def test_a_server_that_does_not_answer_is_an_error_not_a_crash(
    loop: EventLoopThread, seat: Client, nats_server: NatsServer
) -> None:
    store = Store(seat, timeout=0.3)
    nats_server.pause()
    try:
        stuck = apply(loop, store, Put(REFUSED, "ace.gitea", A, 0), Put(REFUSED, "bee.gitea", A, 0))
    finally:
        nats_server.resume()
    assert not stuck.done and stuck.conflict is None and "TimeoutError" in stuck.error
    # The write may or may not have landed before the server froze; a compare-and-set tells which.
    again = apply(loop, store, Put(REFUSED, "ace.gitea", A, 0))
    assert again.ok or again.conflict is not None


def test_a_batch_whose_server_is_lost_fails_at_once_not_at_its_timeout(
    loop: EventLoopThread, seat: Client, nats_server: NatsServer
) -> None:
    # An answer to a message sent before the server was lost never comes: every composition writing then would wait
    # out its batch's timeout. It is told the writes failed as soon as the client knows (and makes them again later).
    store = Store(seat, timeout=60.0)
    assert apply(loop, store, Put(REFUSED, "ace.gitea", A, 0)).ok
    nats_server.pause()  # the batch below is published, and waits for answers a frozen server does not send
    future = loop.submit(store.apply([Put(REFUSED, "bee.gitea", A, 0), Put(REFUSED, "cat.gitea", A, 0)]))
    wait_until(lambda: store._acks._waiting, what="the batch waits for its answers")
    nats_server.kill()
    lost = future.result(30)  # well inside the batch's 60 s
    assert not lost.done and not lost.ok and "connection to NATS was lost" in lost.error
    assert store.counts()["failed writes"] == 2
    nats_server.start()
    wait_until(lambda: seat.is_connected, 30, what="the client reconnected")
    # Made again, from what the bus holds: nothing was written blind.
    def made_or_moved_on() -> Applied | None:
        again = apply(loop, store, Put(REFUSED, "bee.gitea", A, 0))
        return again if again.ok or again.conflict is not None else None

    wait_until(made_or_moved_on, 30, interval=0.1, what="the write made again, or found made")
