"""A seat's attachment to NATS: a host's client borrowed and given back as it was, and what is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.attachment import Attachment
from mesh_provisioner.bus.link import SeatClient, borrow, give_back, link
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.store import Store
from mesh_provisioner.config import Config


@pytest.fixture
def host(loop: EventLoopThread, nats_server: NatsServer) -> Iterator[Client]:
    """A host's client as nats-py makes it, reconnecting quickly."""
    client = loop.run(nats.connect(nats_server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1), 10)
    yield client
    if not client.is_closed:
        loop.run(client.close(), 10)


def subjects(nc: Client) -> list[str]:
    return sorted(sub.subject for sub in nc._subs.values())


def test_a_borrowed_client_is_followed_by_its_state_and_given_back_as_it_was(
    loop: EventLoopThread, host: Client, nats_server: NatsServer
) -> None:
    before, attributes = subjects(host), dict(vars(host))
    tie = loop.run(borrow(host), 5)
    assert link(host) is tie
    heard: list[str] = []
    tie.on_disconnected(lambda: heard.append("disconnected"))
    tie.on_reconnected(lambda: heard.append("reconnected"))
    tie.on_closed(lambda: heard.append("closed"))
    store = Store(host)
    assert loop.run(store._acks._inbox(), 5)  # the store's inbox of acknowledgements, kept by the link
    assert len(subjects(host)) == len(before) + 1

    nats_server.restart()  # the host's own callbacks are nats-py's defaults: nothing of the seat's is in them
    wait_until(lambda: heard == ["disconnected", "reconnected"] and tie.reconnects == 1, 20, what="followed")

    loop.run(give_back(host), 5)
    assert subjects(host) == before and host.is_connected
    # Its attributes are nats-py's own (their values moved with the reconnect): no method or callback replaced.
    assert set(vars(host)) == set(attributes)
    assert all(vars(host)[name] is value for name, value in attributes.items() if callable(value))
    assert link(host) is not tie  # nothing of it is kept
    loop.run(host.close(), 10)
    assert "closed" not in heard  # given back, it is not followed any more


def test_a_host_closing_a_borrowed_client_is_told(loop: EventLoopThread, host: Client) -> None:
    tie = loop.run(borrow(host), 5)
    heard: list[str] = []
    tie.on_closed(lambda: heard.append("closed"))
    loop.run(host.close(), 10)
    wait_until(lambda: heard == ["closed"], what="the close told")
    loop.run(give_back(host), 5)


def test_seats_holding_one_client_share_its_link_until_the_last_gives_it_back(
    loop: EventLoopThread, host: Client
) -> None:
    first, second = loop.run(borrow(host), 5), loop.run(borrow(host), 5)
    assert first is second
    loop.run(give_back(host), 5)
    assert link(host) is first
    loop.run(give_back(host), 5)
    assert link(host) is not first


def test_a_seats_own_client_is_its_own_link(loop: EventLoopThread) -> None:
    nc = SeatClient()
    assert loop.run(borrow(nc), 5) is nc.link is link(nc)


def config(server: NatsServer) -> Config:
    return Config(nats=server.url, request_timeout=2.0)


def test_what_a_seat_cannot_run_on_is_refused_at_once(
    loop: EventLoopThread, host: Client, nats_server: NatsServer
) -> None:
    with pytest.raises(ValueError, match="loop="):
        Attachment.open(config(nats_server), nc=host)
    stopped = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="does not run"):
            Attachment.open(config(nats_server), loop=stopped)
    finally:
        stopped.close()
    not_a_loop: Any = object()
    with pytest.raises(TypeError):
        Attachment.open(config(nats_server), loop=not_a_loop)

    async def on_the_loop() -> None:
        Attachment.open(config(nats_server), nc=host, loop=asyncio.get_running_loop())

    with pytest.raises(ValueError, match="another thread"):
        loop.run(on_the_loop(), 5)
    loop.run(host.close(), 10)
    with pytest.raises(ValueError, match="closed"):
        Attachment.open(config(nats_server), nc=host, loop=loop.loop)
