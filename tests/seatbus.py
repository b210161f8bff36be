"""What the actor and system tests share: another module's connection to the bus, the seat's states read back,
and the fixed-point check (contract section 6: a quiet seat composing everything again writes nothing).

A test plays the other modules of the mesh: it writes their states through a connection of its own (`Bus`), as
the controller, the assigner or a provider would, and reads the seat's states back from the server, never from
the seat's memory. The connection, the readers and the checks are `meshcheck`'s (`meshcheck.bus`,
`meshcheck.check`), which the fault runner uses too: one implementation for both; this module adds the tests'
assertions and fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import NatsServer

from mesh_provisioner.config import Config
from mesh_provisioner.runtime import Runtime
from meshcheck import bus as meshcheck_bus
from meshcheck import check
from meshcheck.bus import (
    Bus,
    comparable,
    diff,
    load_sample,
    plans,
    provisions,
    raw,
    seat_state,
)

__all__ = [
    "Bus", "Seats", "assert_fixed_point", "bus", "comparable", "diff", "load_sample", "mesh", "plans", "provisions",
    "raw", "seat_config", "seat_state", "seats", "settle", "sup",
]


def seat_config(url: str, **overrides: Any) -> Config:
    """A seat's config for a test server: quick restarts, short timeouts (5 s a bus call, the store's own timeout
    too; an actor waits `Config.work_timeout` for the store, longer)."""
    return meshcheck_bus.seat_config(url, **{"request_timeout": 5.0, **overrides})


def settle(sup: Runtime, timeout: float = 30.0) -> None:
    """Wait until the seat is settled; fail the test if it is not within `timeout` seconds."""
    assert sup.wait_settled(timeout), f"the seat did not settle within {timeout} s: {sup.status()}"


def assert_fixed_point(bus: Bus, config: Config | None = None, timeout: float = 30.0) -> None:
    """A fresh seat over the same bus composes every node and judges every key again, and writes nothing.

    Contract section 6: a quiet seat off its fixed point has found a missing wake-up. Compared both by the fresh
    seat's own count of writes and by every bucket's last revision, and any difference is named.
    """
    problems = check.fixed_point(bus, config or seat_config(bus.url), timeout)
    assert not problems, "\n".join(problems)


# ---- fixtures (imported by the conftests of tests/actors and tests/system) ----------------------------------


class Seats:
    """Supervisors a test started, each stopped after it, whatever happened."""

    def __init__(self) -> None:
        self.started: list[Runtime] = []

    def start(self, config: Config, **options: Any) -> Runtime:
        """Start a supervisor (as `Runtime.start`) and keep it to stop after the test."""
        sup = Runtime.start(config, **options)
        self.started.append(sup)
        return sup

    def stop_all(self) -> None:
        """Stop every supervisor started, last first."""
        for sup in reversed(self.started):
            sup.stop()


@pytest.fixture
def bus(nats_server: NatsServer) -> Iterator[Bus]:
    """Another module's connection to the test server."""
    b = Bus(nats_server.url)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def mesh(bus: Bus) -> Bus:
    """The sample mesh on the test server, and the router's stream of asks and its records bucket."""
    load_sample(bus.url)
    bus.create_asks_stream()
    return bus


@pytest.fixture
def seats() -> Iterator[Seats]:
    """A way to start supervisors that are stopped after the test."""
    s = Seats()
    try:
        yield s
    finally:
        s.stop_all()


@pytest.fixture
def sup(mesh: Bus, seats: Seats) -> Runtime:
    """A seat serving the sample mesh, settled."""
    s = seats.start(seat_config(mesh.url))
    settle(s)
    return s
