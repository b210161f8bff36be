"""The store asks its guard again as a batch goes out (contract 8: only the holder writes the seat's states).

Making a batch's messages may wait on the bus: a bucket not yet open is opened, which on a slow or frozen server
takes up to the request timeout. A lease that lapsed meanwhile must stop the batch: found by the fault runner's
pause scenario (a write sent while the process no longer held the lease, the server frozen past the lease time).
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client

from mesh_provisioner.bus.connection import ensure_buckets
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
