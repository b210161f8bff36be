"""Fixtures shared by the tests: a real nats-server with JetStream that a test can stop, restart and pause."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import NatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream for one test, stopped after it."""
    server = NatsServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_server_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for a whole session, for tests that only add buckets of their own (never stop it)."""
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
