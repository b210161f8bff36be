"""The store asks its guard again as a batch goes out (contract 8: only the holder writes the seat's states).

Making a batch's messages may wait on the bus: a bucket not yet open is opened, which on a slow or frozen server
takes up to the request timeout. A lease that lapsed meanwhile must stop the batch: found by the fault runner's
pause scenario (a write sent while the process no longer held the lease, the server frozen past the lease time).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.connection import ensure_buckets
from mesh_provisioner.bus.lease import SeatLease
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.store import Store
from mesh_provisioner.contract import PLANS, REFUSED, SEAT_STATES
from mesh_provisioner.messages.writes import Delete, Put


def test_a_lease_lapsed_while_the_batch_was_made_stops_it(
    loop: EventLoopThread, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES), 10)
    store = Store(nc)
    held = [True]
    store.guard = lambda _: "" if held[0] else "this process does not hold the seat's lease"
    real = Store._bucket

    async def opened_slowly(self: Store, state: str) -> Any:
        kv = await real(self, state)
        if state == REFUSED:
            held[0] = False  # the lease lapsed while the bucket was opened
        return kv

    monkeypatch.setattr(Store, "_bucket", opened_slowly)
    applied = loop.run(store.apply([Put(PLANS, "ace.gitea", b"{}", 0), Put(REFUSED, "ace.gitea", b"{}", 0)]), 10)
    assert applied.done == []
    assert "does not hold the seat's lease" in applied.error
    assert store.writes == 0


def test_a_create_made_again_on_a_delete_marker_asks_the_guard_again(
    loop: EventLoopThread, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A create of a deleted key is refused by JetStream and made again on the delete marker's revision, after its
    # answer and the marker were waited for (seconds on a frozen server): found by the runner's pause scenario.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES), 10)
    store = Store(nc)
    made = loop.run(store.apply([Put(REFUSED, "bee.webapp", b"{}", 0)]), 10)
    ((_, revision),) = made.done
    assert loop.run(store.apply([Delete(REFUSED, "bee.webapp", revision)]), 10).ok
    held = [True]
    store.guard = lambda _: "" if held[0] else "this process does not hold the seat's lease"
    real = Store._deleted_at

    async def marker_found_late(self: Store, write: Any) -> int:
        found = await real(self, write)
        held[0] = False  # the lease lapsed while the answer and the marker were waited for
        return found

    monkeypatch.setattr(Store, "_deleted_at", marker_found_late)
    applied = loop.run(store.apply([Put(REFUSED, "bee.webapp", b'{"why": "again"}', 0)]), 10)
    assert applied.done == []
    assert "does not hold the seat's lease" in applied.error


def test_8_1_a_batch_counts_as_unanswered_from_its_guards_last_look_until_its_answers(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client
) -> None:
    # A lease given back waits on this count before deleting its key (bus/unanswered.py): a write sent under it, and
    # not yet stored, must be in it; a batch the guard stopped, not.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES), 10)
    store, lease = Store(nc), SeatLease(nc)
    store.guard, store.unanswered = (lambda _: ""), lease.unanswered
    assert loop.run(store.apply([Put(PLANS, "bee.gitea", b"{}", 0)]), 10).ok  # the bucket opened
    assert lease.unanswered.count() == 0
    nats_server.pause()  # the write goes out and is not answered
    try:
        applying = asyncio.run_coroutine_threadsafe(store.apply([Put(PLANS, "ace.gitea", b"{}", 0)]), loop.loop)
        wait_until(lambda: lease.unanswered.count() == 1, 10, what="the write counted while unanswered")
        assert not loop.run(lease.unanswered.cleared(None, 0.05), 10)
    finally:
        nats_server.resume()
    assert applying.result(15).ok
    assert lease.unanswered.count() == 0 and loop.run(lease.unanswered.cleared({0}, 0), 10)
    store.guard = lambda _: "this process does not hold the seat's lease"
    assert not loop.run(store.apply([Put(PLANS, "cat.gitea", b"{}", 0)]), 10).ok
    assert lease.unanswered.count() == 0, "a batch the guard stopped is not left counted"
