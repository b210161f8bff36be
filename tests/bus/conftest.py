"""Fixtures of the bus tests: the bus loop, a seat's connection to the test server, and another module's."""

from __future__ import annotations

from collections.abc import Iterator

import nats
import pytest
from helpers import NatsServer
from nats.aio.client import Client

from mesh_provisioner.bus.connection import connect
from mesh_provisioner.bus.loop import EventLoopThread


@pytest.fixture
def loop() -> Iterator[EventLoopThread]:
    """The bus loop on its own thread, as the seat runs it."""
    with EventLoopThread("test-bus") as running:
        yield running


@pytest.fixture
def nc(loop: EventLoopThread, nats_server: NatsServer) -> Iterator[Client]:
    """The seat's connection (reconnecting forever, quickly, for the restart tests)."""
    client = loop.run(connect([nats_server.url], reconnect_time_wait=0.2), 10)
    yield client
    loop.run(client.close(), 10)


@pytest.fixture
def other(loop: EventLoopThread, nats_server: NatsServer) -> Iterator[Client]:
    """Another module's connection: what writes the states the seat reads."""
    client = loop.run(nats.connect(nats_server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1), 10)
    yield client
    loop.run(client.close(), 10)
