"""The cache's first load of a bucket is whole even when nats-py's watch says "all values came" before they did.

nats-py's `KeyValue.watch` puts its marker (None: every current value delivered) as soon as the consumer reports
nothing pending and the client has handled no message yet; the consumer may have pushed every value by then, so the
marker can come before the values. A cache that took that marker as the end of its load reconciled memory with an
empty bucket, raised its floor to the stream's last revision, and then dropped the values as old news when they
came: keys lost for as long as the seat ran (design.md, property 3). Found by the fault runner's fixed-point check
(a fresh seat judged credentials `asked` for want of mesh-vault's entries it never kept). On a cluster, a watch's
consumer on a server still catching up after a restart says nothing is pending before it has delivered every value:
that does not end the load either (found by the runner's cluster scenario).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import nats.errors
import pytest
from helpers import NatsServer, seed_buckets, wait_until
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import bound, bucket

STATE = bound("mesh-vault")
KEYS = ("ace.gitea.pg-credential.main", "ace.postgres.pg-credential", "bee.mailer.pg-credential.mail")


class MarkerFirst:
    """A real watch whose marker comes before its values, as nats-py's does when it loses the race."""

    def __init__(self, real: KeyValue.KeyWatcher) -> None:
        self.real = real
        self.marked = False

    async def __anext__(self) -> Any:
        if not self.marked:
            self.marked = True
            return None
        return await self.real.__anext__()  # type: ignore[no-untyped-call]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.real.__aiter__()  # type: ignore[no-any-return]


class BehindFirst(MarkerFirst):
    """A real watch whose consumer says nothing is pending after its first value, as one on a cluster's server that
    is still catching up does, and whose other values come after."""

    async def __anext__(self) -> Any:
        update = await self.real.__anext__()  # type: ignore[no-untyped-call]
        if not self.marked and update is not None:
            self.marked = True
            return dataclasses.replace(update, delta=0)
        return update


def watches_as(monkeypatch: pytest.MonkeyPatch, kind: type[MarkerFirst]) -> None:
    """Every key-value watch made from now on is a real one seen through `kind`."""
    real = KeyValue.watchall

    async def watchall(self: KeyValue, **kwargs: Any) -> Any:
        return kind(await real(self, **kwargs))

    monkeypatch.setattr(KeyValue, "watchall", watchall)


@pytest.fixture
def racing(monkeypatch: pytest.MonkeyPatch) -> None:
    watches_as(monkeypatch, MarkerFirst)


@pytest.fixture
def behind(monkeypatch: pytest.MonkeyPatch) -> None:
    watches_as(monkeypatch, BehindFirst)


@pytest.mark.parametrize("watch", ["racing", "behind"])
def test_a_marker_or_nothing_pending_before_the_values_loses_none_of_them(
    watch: str, request: pytest.FixtureRequest, loop: EventLoopThread, nc: Client, other: Client,
    nats_server: NatsServer,
) -> None:
    request.getfixturevalue(watch)
    seed_buckets(nats_server.url, [STATE])

    async def fill() -> None:
        kv = await other.jetstream().key_value(bucket(STATE))
        for key in KEYS:
            await kv.put(key, b'{"state": "provided"}')

    loop.run(fill(), 10)
    cache = Cache(nc, states=[STATE])
    loop.run(cache.start(), 10)
    try:
        loop.run(cache.wait_synced(10), 15)
        # Loaded whole, and nothing comes later to be dropped: the three keys are there once synced.
        assert sorted(cache.view.keys(STATE)) == sorted(KEYS)
        assert loop.run(cache.caught_up(), 10)
        wait_until(lambda: loop.run(cache.caught_up(), 10), 5, what="the watch caught up")
        assert sorted(cache.view.keys(STATE)) == sorted(KEYS)
    finally:
        loop.run(cache.stop(), 10)


def test_an_empty_bucket_still_loads_at_the_marker(
    racing: None, loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    seed_buckets(nats_server.url, [STATE])
    cache = Cache(nc, states=[STATE])
    loop.run(cache.start(), 10)
    try:
        loop.run(asyncio.wait_for(cache.wait_synced(), 5), 10)
        assert list(cache.view.keys(STATE)) == []
    finally:
        loop.run(cache.stop(), 10)


@pytest.fixture
def first_watch_fails(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first watch of the bucket fails to start, as one does while a cluster elects a leader."""
    real = KeyValue.watchall
    failed: list[str] = []

    async def watchall(self: KeyValue, **kwargs: Any) -> Any:
        if not failed:
            failed.append(self._name)
            raise nats.errors.TimeoutError
        return await real(self, **kwargs)

    monkeypatch.setattr(KeyValue, "watchall", watchall)
    return failed


def test_a_watch_that_fails_to_start_is_started_again(
    first_watch_fails: list[str], loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
) -> None:
    # The watch's session cleaned up a watcher it never had: `del` of a state it had no entry for raised KeyError,
    # which ended the session, and the state was never watched again (found by the runner's cluster scenario).
    seed_buckets(nats_server.url, [STATE])

    async def fill() -> None:
        kv = await other.jetstream().key_value(bucket(STATE))
        await kv.put(KEYS[0], b'{"state": "provided"}')

    loop.run(fill(), 10)
    cache = Cache(nc, states=[STATE], backoff=(0.01, 0.1))
    loop.run(cache.start(), 10)
    try:
        loop.run(cache.wait_synced(10), 15)
        assert first_watch_fails == [bucket(STATE)]
        assert list(cache.view.keys(STATE)) == [KEYS[0]]
    finally:
        loop.run(cache.stop(), 10)


class Markerless(MarkerFirst):
    """A real watch whose marker never comes, as nats-py's when an idle heartbeat of its consumer came before the
    consumer's info: it counts the heartbeat as a value delivered, and so never says that all of them came."""

    async def __anext__(self) -> Any:
        while True:
            update = await self.real.__anext__()  # type: ignore[no-untyped-call]
            if update is not None:
                return update


@pytest.fixture
def markerless(monkeypatch: pytest.MonkeyPatch) -> None:
    watches_as(monkeypatch, Markerless)


def test_an_empty_bucket_loads_without_waiting_for_a_marker_that_may_never_come(
    markerless: None, loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
) -> None:
    seed_buckets(nats_server.url, [STATE])
    cache = Cache(nc, states=[STATE], load_timeout=60)
    loop.run(cache.start(), 10)
    try:
        loop.run(asyncio.wait_for(cache.wait_synced(), 5), 10)
        assert list(cache.view.keys(STATE)) == []

        async def put() -> None:
            kv = await other.jetstream().key_value(bucket(STATE))
            await kv.put(KEYS[0], b'{"state": "provided"}')

        loop.run(put(), 10)  # written once the watch follows: it comes as a change
        wait_until(lambda: list(cache.view.keys(STATE)) == [KEYS[0]], 5, what="the key written after the load")
    finally:
        loop.run(cache.stop(), 10)
