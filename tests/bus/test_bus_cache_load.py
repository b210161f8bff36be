"""The cache's first load of a bucket is whole even when its watch says "nothing more pending" before it is.

A load ends at the stream's last revision from just before the watch started, not when the consumer says nothing is
pending: on a cluster, a watch's consumer on a server still catching up after a restart says so before it has
delivered every value (found by the runner's cluster scenario). A cache that ended its load there reconciled memory
with what had come, raised its floor to the stream's last revision, and then dropped the other values as old news
when they came: keys lost for as long as the seat ran (design.md, property 3).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import nats.errors
import pytest
from helpers import NatsServer, seed_buckets, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.watch import Update, Watch
from mesh_provisioner.contract import bound, bucket

STATE = bound("mesh-vault")
KEYS = ("ace.gitea.pg-credential.main", "ace.postgres.pg-credential", "bee.mailer.pg-credential.mail")


class Behind:
    """A real watch whose consumer says nothing is pending after its first value, as one on a cluster's server that
    is still catching up does, and whose other values come after."""

    def __init__(self, real: Watch) -> None:
        self.real = real
        self.said = False

    async def __anext__(self) -> Update:
        update = await self.real.__anext__()
        if not self.said:
            self.said = True
            return msgspec.structs.replace(update, pending=0)
        return update

    def __aiter__(self) -> Behind:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every watch made from now on is a real one seen through `Behind`."""
    real = Watch.start

    async def start(js: Any, state: str, **options: Any) -> Any:
        return Behind(await real(js, state, **options))

    monkeypatch.setattr(Watch, "start", start)


def test_nothing_pending_said_before_the_values_loses_none_of_them(
    behind: None, loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
) -> None:
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


@pytest.fixture
def first_watch_fails(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first watch of the bucket fails to start, as one does while a cluster elects a leader."""
    real = Watch.start
    failed: list[str] = []

    async def start(js: Any, state: str, **options: Any) -> Any:
        if not failed:
            failed.append(bucket(state))
            raise nats.errors.TimeoutError
        return await real(js, state, **options)

    monkeypatch.setattr(Watch, "start", start)
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


def test_a_key_written_to_an_empty_bucket_after_its_load_comes_as_a_change(
    loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
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
