"""The cache's load is waited for while it makes headway, however long it takes, and given up once it makes none.

A 100,000-node mesh loads some 8 million keys: minutes, where the seat waited six request timeouts (a minute) for its
first load and for a taken shard's keys, and failed there for good. A server gone quiet is still found out: a load
that receives nothing and takes nothing in for its stall is given up, and goes on in the background.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import NatsServer, seed_buckets
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache, while_headway
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import PLACEMENT, bucket

WINDOWS = 5


def test_a_wait_goes_on_past_its_stall_while_there_is_headway() -> None:
    asked = 0

    def headway() -> int:
        nonlocal asked
        asked += 1
        return asked  # grows at every look

    async def wait() -> bool:
        # Never woken: each look comes when a stall has passed, and the wait ends only after several of them.
        return await while_headway(lambda: asked >= 2 * WINDOWS, asyncio.Event(), headway, 0.001)

    assert asyncio.run(wait()) is True
    assert asked >= 2 * WINDOWS


def test_a_wait_without_headway_is_given_up_after_its_stall() -> None:
    async def wait() -> bool:
        return await while_headway(lambda: False, asyncio.Event(), lambda: 7, 0.01)

    assert asyncio.run(wait()) is False


def test_a_wait_ends_once_woken_and_done() -> None:
    async def wait() -> bool:
        woken = asyncio.Event()
        done: list[bool] = []
        asyncio.get_running_loop().call_soon(lambda: (done.append(True), woken.set()))
        return await while_headway(lambda: bool(done), woken, lambda: 0, None)

    assert asyncio.run(wait()) is True


def test_a_load_of_a_server_gone_quiet_is_given_up_after_its_stall_and_goes_on(
    loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])

    async def fill() -> None:
        kv = await other.jetstream().key_value(bucket(PLACEMENT))
        for node in ("ace", "bee"):
            await kv.put(node, b'{"node": "%s", "modules": []}' % node.encode())

    loop.run(fill(), 10)
    cache = Cache(nc, states=[PLACEMENT], backoff=(0.01, 0.1))
    nats_server.pause()  # nothing comes from here on: the load cannot begin
    try:
        loop.run(cache.start(), 10)
        with pytest.raises(TimeoutError, match=f"load of {PLACEMENT} made no headway in 0.3 s"):
            loop.run(cache.wait_loaded(stall=0.3), 10)
        assert cache.headway == 0
        assert not cache.synced
        nats_server.resume()
        loop.run(cache.wait_loaded(stall=10), 30)  # the load went on: once the server answers, it ends
        assert sorted(cache.view.keys(PLACEMENT)) == ["ace", "bee"]
        assert cache.headway > 0
    finally:
        nats_server.resume()
        loop.run(cache.stop(), 10)
