"""Reading the bus once into memory (bus/snapshot.py), as `show` does, on a real nats-server."""

from __future__ import annotations

import asyncio

import nats
import pytest
from helpers import NatsServer, free_port, seed_buckets

from mesh_provisioner.bus.connection import stream_of
from mesh_provisioner.bus.snapshot import snapshot
from mesh_provisioner.contract import OWN, PLANS, PROVISIONS, REFUSED, bucket
from mesh_provisioner.messages import records as r


async def _put(url: str, state: str, key: str, raw: bytes) -> None:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket(state))
        await kv.put(key, raw)
    finally:
        await nc.close()


def test_a_snapshot_by_url_holds_every_key_of_the_states_and_leaves_no_consumer(nats_server: NatsServer) -> None:
    seed_buckets(nats_server.url, [PLANS, PROVISIONS])  # no refused bucket: read as empty
    plan = r.PlanRecord(node="ace", module="gitea", plan=r.Plan(provisions=()))
    asyncio.run(_put(nats_server.url, PLANS, "ace.gitea", r.encode(plan)))
    asyncio.run(_put(nats_server.url, PROVISIONS, "ace.gitea.x", b"{not json"))

    view = asyncio.run(snapshot(nats_server.url, states=OWN, timeout=10))
    entry = view.get(PLANS, "ace.gitea")
    assert entry is not None and entry.get(r.PlanRecord) == plan
    bad = view.get(PROVISIONS, "ace.gitea.x")
    assert bad is not None and bad.error.startswith("mesh-provisioner.provisions ace.gitea.x does not decode")
    assert list(view.keys(REFUSED)) == []

    async def consumers() -> list[int]:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            return [(await js.stream_info(stream_of(s))).state.consumer_count for s in (PLANS, PROVISIONS)]
        finally:
            await nc.close()

    assert asyncio.run(consumers()) == [0, 0]


def test_a_snapshot_of_a_connection_leaves_it_open(nats_server: NatsServer) -> None:
    seed_buckets(nats_server.url, [PLANS])

    async def go() -> bool:
        nc = await nats.connect(nats_server.url)
        try:
            view = await snapshot(nc, states=[PLANS], timeout=10)
            assert len(view) == 0
            return nc.is_connected
        finally:
            await nc.close()

    assert asyncio.run(go())


def test_a_snapshot_of_no_server_fails_rather_than_waiting() -> None:
    with pytest.raises(nats.errors.NoServersError):
        asyncio.run(asyncio.wait_for(snapshot(f"nats://127.0.0.1:{free_port()}", states=OWN), 30))
