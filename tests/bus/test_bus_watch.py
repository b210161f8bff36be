"""A watch of a bucket (bus/watch.py `Watch`) on a real server: each key's newest value, then every change, with its
revision and what is still pending; deletes, purges and the server's markers as no key; a message that is no
key-value message left out, never fatal (contract section 7)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import NatsServer, seed_buckets
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KV_MARKER_REASON

from mesh_provisioner.bus.connection import subject_of
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.watch import Update, Watch
from mesh_provisioner.contract import PLACEMENT, bucket


async def _next(watch: Watch, count: int) -> list[Update]:
    return [await asyncio.wait_for(anext(watch), 5) for _ in range(count)]


def test_a_watch_delivers_each_keys_newest_value_then_every_change_deletes_and_purges_as_no_key(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])

    async def go() -> tuple[list[Update], list[Update], list[Update]]:
        kv = await nc.jetstream().key_value(bucket(PLACEMENT))
        await kv.put("ace", b"1")
        await kv.put("bee", b"2")
        await kv.put("ace", b"3")
        watch = await Watch.start(nc.jetstream(), PLACEMENT)
        try:
            first = await _next(watch, 2)
            await kv.delete("bee")
            await kv.put("cat", b"4")
            await kv.purge("cat")
            changes = await _next(watch, 3)
            # Published to the bucket by hand: the server's marker of a key removed, and one of a reason not known.
            js = nc.jetstream()
            await js.publish(subject_of(PLACEMENT, "dog"), b"", headers={KV_MARKER_REASON: "Remove"})
            await js.publish(subject_of(PLACEMENT, "eel"), b"", headers={KV_MARKER_REASON: "Unheard-Of"})
            await kv.put("fox", b"5")
            markers = await _next(watch, 2)
        finally:
            await watch.stop()
        return first, changes, markers

    first, changes, markers = loop.run(go(), 20)
    assert first == [Update("bee", b"2", 2, 1), Update("ace", b"3", 3, 0)]
    assert changes == [Update("bee", None, 4, 0), Update("cat", b"4", 5, 0), Update("cat", None, 6, 0)]
    assert markers == [Update("dog", None, 7, 0), Update("fox", b"5", 9, 0)], "a marker of no known reason is left out"


def test_a_watch_stopped_while_read_ends_its_reader(loop: EventLoopThread, nc: Client, nats_server: NatsServer) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])

    async def go() -> list[Update]:
        watch = await Watch.start(nc.jetstream(), PLACEMENT)
        reader = asyncio.create_task(_next(watch, 1))
        await asyncio.sleep(0)  # the reader waits for an update that never comes
        await watch.stop()
        try:
            return await reader
        except StopAsyncIteration:
            return []

    assert loop.run(go(), 20) == []


def test_a_watch_of_headers_only_says_which_keys_changed_and_which_have_none(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])

    async def go() -> list[Update]:
        kv = await nc.jetstream().key_value(bucket(PLACEMENT))
        await kv.put("ace", b"a value left out")
        watch = await Watch.start(nc.jetstream(), PLACEMENT, headers_only=True)
        try:
            first = await _next(watch, 1)
            await kv.delete("ace")
            return first + await _next(watch, 1)
        finally:
            await watch.stop()

    assert loop.run(go(), 20) == [Update("ace", b"", 1, 0), Update("ace", None, 2, 0)]


def test_a_stopped_watch_ends_its_iteration_even_with_its_queue_full(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    seed_buckets(nats_server.url, [PLACEMENT])

    async def go() -> tuple[int, bool]:
        kv = await nc.jetstream().key_value(bucket(PLACEMENT))
        await asyncio.gather(*(kv.put(f"n{i}", b"x") for i in range(400)))
        watch = await Watch.start(nc.jetstream(), PLACEMENT)
        while watch._updates.qsize() < watch._updates.maxsize:
            await asyncio.sleep(0.01)
        await watch.stop()
        read = len([u async for u in watch])
        try:
            await anext(watch)
        except StopAsyncIteration:
            return read, True
        return read, False

    assert loop.run(go(), 20) == (256, True), "what was queued and no more, then the end, again"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("$JS.ACK.KV_b.c1.1.42.7.1733390000000000000.3", Update("ace", b"v", 42, 3)),
        ("$JS.ACK.hub.ACCHASH.KV_b.c1.1.42.7.1733390000000000000.3.rnd", Update("ace", b"v", 42, 3)),
        ("$JS.ACK.hub.ACCHASH.KV_b.c1.1.42.7.1733390000000000000.3", Update("ace", b"v", 42, 3)),
        ("", None),
        ("_INBOX.abc", None),
    ],
)
def test_a_message_is_read_from_either_form_of_jetstreams_reply_and_one_with_none_is_left_out(
    reply: str, expected: Update | None
) -> None:
    async def go() -> list[Update]:
        watch = Watch(PLACEMENT)
        await watch._received(Msg(None, subject_of(PLACEMENT, "ace"), reply, b"v"))  # type: ignore[arg-type]
        return [watch._updates.get_nowait()] if not watch._updates.empty() else []

    assert asyncio.run(go()) == ([expected] if expected else [])
