"""The cache's load is waited for while it makes headway, however long it takes, and given up once it makes none.

A 100,000-node mesh loads some 8 million keys: minutes, where the seat waited six request timeouts (a minute) for its
first load and for a taken shard's keys, and failed there for good. A server gone quiet is still found out: a load
that receives nothing and takes nothing in for its stall is given up, and goes on in the background.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers import NatsServer, seed_buckets
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache, while_headway
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.watch import Update, Watch
from mesh_provisioner.contract import PLACEMENT, WANTS, bucket

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
    async def wait() -> tuple[bool, float]:
        began = asyncio.get_running_loop().time()
        gave_up = await while_headway(lambda: False, asyncio.Event(), lambda: 7, 0.01)
        return gave_up, asyncio.get_running_loop().time() - began

    gave_up, waited = asyncio.run(wait())
    assert gave_up is False
    assert waited >= 0.01, "given up before its stall passed"


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
        assert cache.headway([PLACEMENT]) == 0
        assert not cache.synced
        nats_server.resume()
        loop.run(cache.wait_loaded(stall=10), 30)  # the load went on: once the server answers, it ends
        assert sorted(cache.view.keys(PLACEMENT)) == ["ace", "bee"]
    finally:
        nats_server.resume()
        loop.run(cache.stop(), 10)


class Silent:
    """A real watch of which nothing is ever read: its load never ends, whatever it receives."""

    def __init__(self, real: Watch) -> None:
        self.real = real

    def __aiter__(self) -> Silent:
        return self

    async def __anext__(self) -> Update:
        await asyncio.Event().wait()
        raise StopAsyncIteration

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_load_stuck_while_other_buckets_change_is_given_up_after_its_stall(
    loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What comes for a bucket already loaded is no headway of another's load.
    seed_buckets(nats_server.url, [PLACEMENT, WANTS])
    real = Watch.start

    async def start(js: Any, state: str, **options: Any) -> Any:
        watch = await real(js, state, **options)
        return Silent(watch) if state == WANTS else watch

    monkeypatch.setattr(Watch, "start", start)

    async def put(state: str, key: str) -> None:
        kv = await other.jetstream().key_value(bucket(state))
        await kv.put(key, b'{"fp": "1"}')

    loop.run(put(WANTS, "want.ace.gitea"), 10)
    cache = Cache(nc, states=[PLACEMENT, WANTS])
    loop.run(cache.start(), 10)
    try:
        waiting = asyncio.run_coroutine_threadsafe(cache.wait_loaded(stall=0.5), loop.loop)
        written = 0
        deadline = time.monotonic() + 20
        while not waiting.done() and time.monotonic() < deadline:
            written += 1
            loop.run(put(PLACEMENT, f"n{written}"), 10)  # the loaded bucket changes all along
        with pytest.raises(TimeoutError, match=f"load of {WANTS} made no headway"):
            waiting.result(0)
        assert written > 1
        assert PLACEMENT not in str(waiting.exception())
    finally:
        loop.run(cache.stop(), 10)
