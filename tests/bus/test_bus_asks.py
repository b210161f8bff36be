"""The operator's channel against a real server: no router, de-duplication by ask id, hearing decisions."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import nats.errors
import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.asks import Asks, NoRouter
from mesh_provisioner.bus.link import link
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import ASK_SUBJECT, DECIDED_SUBJECT
from mesh_provisioner.messages.records import Ask, Option, decode

ASK = Ask(
    id="retire-ace-gitea-postgres-database-1700000000",
    headline="Remove ace.gitea.postgres-database?",
    who="operator",
    expires=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(hours=23, minutes=50),
    options=(Option(id="yes", label="Remove", level="approve", binds="sha256:00"),),
)


def test_without_a_stream_there_is_no_router(loop: EventLoopThread, nc: Client) -> None:
    with pytest.raises(NoRouter, match="no router yet"):
        loop.run(Asks(nc).publish(ASK), 10)


def test_a_publish_gives_up_after_its_timeout(
    loop: EventLoopThread, nc: Client, other: Client, nats_server: NatsServer
) -> None:
    # Config.request_timeout bounds every call to the bus; nats-py's own default for a JetStream publish is 5 s.
    loop.run(other.jetstream().add_stream(name="asks", subjects=["asks.>"]), 10)
    nats_server.pause()
    try:
        began = time.monotonic()
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            loop.run(Asks(nc, timeout=0.5).publish(ASK), 10)
        assert time.monotonic() - began < 4, "the publish waited past its timeout"
    finally:
        nats_server.resume()


def test_the_same_ask_published_twice_is_kept_once(loop: EventLoopThread, nc: Client, other: Client) -> None:
    # The router's stream, as a router would make it.
    loop.run(other.jetstream().add_stream(name="asks", subjects=["asks.>"]), 10)
    asks = Asks(nc)
    first = loop.run(asks.publish(ASK), 10)
    again = loop.run(asks.publish(ASK), 10)
    assert not first.duplicate and again.duplicate and again.seq == first.seq
    info = loop.run(other.jetstream().stream_info("asks"), 10)
    assert info.state.messages == 1
    msg = loop.run(other.jetstream().get_last_msg("asks", ASK_SUBJECT), 10)
    assert decode(Ask, msg.data or b"") == ASK
    assert msg.headers is not None and msg.headers.get("Nats-Msg-Id") == ASK.id
    assert (asks.published, asks.duplicates) == (1, 1)


def test_decisions_are_heard_across_a_server_restart(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    heard: list[bytes] = []
    loop.run(Asks(nc).subscribe_decided(lambda: heard.append(b"decided")), 10)

    async def decide(payload: bytes) -> None:
        import nats

        router = await nats.connect(nats_server.url)
        await router.publish(DECIDED_SUBJECT, payload)
        await router.flush()
        await router.close()

    loop.run(decide(b"one"), 10)
    wait_until(lambda: len(heard) == 1, what="the first decision")
    nats_server.stop()
    nats_server.start()
    wait_until(lambda: link(nc).reconnects >= 1 and nc.is_connected, what="the seat reconnected")
    loop.run(decide(b"two"), 10)
    wait_until(lambda: len(heard) == 2, what="a decision after the restart")
