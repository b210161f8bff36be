"""`Cache.caught_up` asks the stream's leader, not the watch's consumer, whether memory holds every change.

On a cluster, a watch's consumer lives on one server. Killed and brought back, that server answers for its consumer
from its own copy of the stream while it catches up: nothing pending, everything delivered. The leader meanwhile
holds changes the watch has not brought. A cache that took the consumer's word said it had caught up; the seat said
it was settled, and judged those changes seconds later (found by the fault runner's cluster scenario: a fresh seat
over the bus, or the disturbed seat itself, wrote after the seat said it was settled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from helpers import NatsServer, seed_buckets, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.watch import Watch
from mesh_provisioner.contract import bound, bucket

STATE = bound("mesh-vault")
VALUE = b'{"state": "provided"}'


class LaggingServer:
    """A real watch whose consumer's server falls behind on `lag()`: what comes after is held back, and its consumer
    answers what it said then, as a server that stopped getting the stream's news does, until `catch_up()`."""

    def __init__(self) -> None:
        self.watchers: list[Stalled] = []
        self.behind = False
        self.caught_up = asyncio.Event()

    def lag(self, loop: EventLoopThread) -> None:
        async def go() -> None:
            for watcher in self.watchers:
                watcher._sub.said = await watcher._sub.real.consumer_info()
            self.behind = True
        loop.run(go(), 10)

    def catch_up(self, loop: EventLoopThread) -> None:
        async def go() -> None:
            self.behind = False
            self.caught_up.set()
        loop.run(go(), 10)


class Stalled:
    """One watch of `LaggingServer`."""

    def __init__(self, real: Watch, server: LaggingServer) -> None:
        self.real = real
        self.server = server
        self._sub = Consumer(real._sub, self)  # what the cache asks for its consumer's word

    @property
    def state(self) -> str:
        return self.real.state

    @property
    def consumer(self) -> str | None:
        return self.real.consumer

    async def __anext__(self) -> Any:
        return await self.real.__anext__()

    async def stop(self) -> None:
        await self.real.stop()

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for update in self.real:
            if self.server.behind:
                await self.server.caught_up.wait()
            yield update


class Consumer:
    """A stalled watch's consumer: while its server is behind, it says what it said when it fell behind."""

    def __init__(self, real: Any, watch: Stalled) -> None:
        self.real = real
        self.watch = watch
        self.said: Any = None

    async def consumer_info(self) -> Any:
        return self.said if self.watch.server.behind else await self.real.consumer_info()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def lagging(monkeypatch: pytest.MonkeyPatch) -> Iterator[LaggingServer]:
    server = LaggingServer()
    real = Watch.start

    async def start(js: Any, state: str, **options: Any) -> Any:
        watcher = Stalled(await real(js, state, **options), server)
        server.watchers.append(watcher)
        return watcher

    monkeypatch.setattr(Watch, "start", start)
    yield server


def started(loop: EventLoopThread, nc: Client, backoff: tuple[float, float] = (0.05, 5.0)) -> Cache:
    cache = Cache(nc, states=[STATE], backoff=backoff)
    loop.run(cache.start(), 10)
    loop.run(cache.wait_synced(10), 15)
    return cache


def put(loop: EventLoopThread, other: Client, key: str) -> int:
    async def go() -> int:
        return await (await other.jetstream().key_value(bucket(STATE))).put(key, VALUE)
    revision: int = loop.run(go(), 10)
    return revision


ACE, BEE = "ace.gitea.pg-credential.main", "bee.mailer.pg-credential.mail"


@pytest.fixture
def behind(
    lagging: LaggingServer, loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
) -> Iterator[Cache]:
    """A cache caught up with ace's entry, whose watch's server then fell behind, and bee's entry put since."""
    seed_buckets(nats_server.url, [STATE])
    put(loop, other, ACE)
    cache = started(loop, nc)
    try:
        assert loop.run(cache.caught_up(), 10)
        lagging.lag(loop)
        put(loop, other, BEE)
        yield cache
    finally:
        lagging.catch_up(loop)
        loop.run(cache.stop(), 10)


def test_caught_up_is_false_while_the_leader_holds_a_change_the_watch_has_not_brought(
    behind: Cache, lagging: LaggingServer, loop: EventLoopThread
) -> None:
    # The consumer's server says all is delivered; the leader holds bee's entry, which memory has not.
    assert not loop.run(behind.caught_up(), 10)
    assert behind.view.get(STATE, BEE) is None
    lagging.catch_up(loop)
    wait_until(lambda: loop.run(behind.caught_up(), 10), what="the cache caught up")
    assert behind.view.get(STATE, BEE) is not None


def test_caught_up_once_what_the_watch_missed_was_removed_from_the_stream(
    behind: Cache, loop: EventLoopThread, other: Client
) -> None:
    # The leader's last revision is past memory's, but no message after memory's is left to bring: caught up.
    async def purge() -> None:
        await other.jetstream().purge_stream(f"KV_{bucket(STATE)}")
    loop.run(purge(), 10)
    assert loop.run(behind.caught_up(), 10)


def test_caught_up_is_false_while_a_watch_is_down(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    # A watch that ended is made again after a backoff; until it follows, memory may miss what comes meanwhile.
    seed_buckets(nats_server.url, [STATE])
    cache = started(loop, nc, backoff=(3.0, 3.0))
    try:
        assert loop.run(cache.caught_up(), 10)

        async def end_the_watch() -> None:
            await cache._watchers[STATE].stop()  # type: ignore[no-untyped-call]
        loop.run(end_the_watch(), 10)
        wait_until(lambda: STATE not in cache._watchers, what="the watch ended")
        assert not loop.run(cache.caught_up(), 10)
        wait_until(lambda: loop.run(cache.caught_up(), 10), what="the watch made again")
    finally:
        loop.run(cache.stop(), 10)
