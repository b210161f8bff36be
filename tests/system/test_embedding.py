"""Embedding: two supervisors on two buses inside a host's own pykka actor system, in one process.

The host's actors drive the supervisors with typed messages (`ComposeNode`, `Status`, `Stop`), one supervisor runs
on the host's own NATS connection and event loop, and stopping one supervisor leaves the other and the host's
actors running. The seat keeps no global state: it stops only its own actors (never `ActorRegistry.stop_all`),
installs no signal handler and configures no logging (design.md, "Supervision").
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pykka
import pytest
from helpers import NatsServer, wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, seat_config, settle

from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import ComposeNode, SeatStatus, Status, Stop
from mesh_provisioner.rules.view import WANTS


class Host(pykka.ThreadingActor):
    """The host's actor that talks to a seat: asks it to compose and how it is, and may stop it."""

    def on_receive(self, message: Any) -> Any:
        sup_ref, what = message
        if what == "compose":
            return sup_ref.ask(ComposeNode("ace"), timeout=30)
        if what == "status":
            return sup_ref.ask(Status(), timeout=30)
        if what == "stop":
            sup_ref.tell(Stop())
        return None


class Pinger(pykka.ThreadingActor):
    """Another actor of the host's, which has nothing to do with the seats."""

    def on_receive(self, message: Any) -> Any:
        return "pong"


def subjects(nc: Any) -> list[str]:
    """What a connection is subscribed to, but nats-py's own inbox for replies (made at its first request)."""
    return sorted(sub.subject for sub in nc._subs.values() if not sub.subject.startswith("_INBOX."))


@pytest.fixture
def second(tmp_path: Path) -> Iterator[NatsServer]:
    root = tmp_path / "second"
    root.mkdir()
    server = NatsServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def host_loop() -> Iterator[EventLoopThread]:
    """The host's own event loop, on a thread of its own."""
    with EventLoopThread("host-loop") as loop:
        yield loop


def test_two_supervisors_in_a_host_actor_system(
    nats_server: NatsServer,
    second: NatsServer,
    seats: Seats,
    host_loop: EventLoopThread,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stop_all: list[bool] = []
    monkeypatch.setattr(pykka.ActorRegistry, "stop_all", lambda *a, **kw: stop_all.append(True))
    handlers = list(logging.getLogger().handlers)
    level = logging.getLogger().level
    sigterm, sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    bus_a, bus_b = Bus(nats_server.url), Bus(second.url)
    host = Host.start()
    pinger = Pinger.start()
    host_nc = host_loop.run(nats.connect(second.url, name="host"), 10)
    try:
        for bus in (bus_a, bus_b):
            load_sample(bus.url)
            bus.create_asks_stream()
        # A runs on a connection of its own; B on the host's connection and loop.
        subscriptions = subjects(host_nc)
        sup_a = seats.start(seat_config(bus_a.url))
        sup_b = seats.start(seat_config(bus_b.url), nc=host_nc, loop=host_loop.loop)
        settle(sup_a)
        settle(sup_b)

        for sup in (sup_a, sup_b):
            composed = host.ask((sup.ref, "compose"), timeout=30)
            assert isinstance(composed, r.Composed) and composed.node == "ace"
            status = host.ask((sup.ref, "status"), timeout=30)
            assert isinstance(status, SeatStatus) and status.children and all(status.children.values())
            assert status.failed == ""

        host.ask((sup_a.ref, "stop"), timeout=30)
        assert sup_a.failed.result(timeout=30) == ""  # stopped as asked, not failed
        wait_until(lambda: not sup_a.ref.is_alive(), 10, what="A's supervisor stopped")
        assert not any(ref.is_alive() for ref in sup_a.children().values())

        # B and the host's own actors keep running, and B still composes on changes and when asked.
        assert all(ref.is_alive() for ref in sup_b.children().values()) and sup_b.ref.is_alive()
        assert pinger.ask("ping", timeout=10) == "pong" and host.is_alive()
        bus_b.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
        settle(sup_b)
        held = bus_b.refusal("bee.mailer")
        assert held is not None and "ml9" in held.why
        assert host.ask((sup_b.ref, "compose"), timeout=30).node == "ace"
        assert_fixed_point(bus_b)

        sup_b.stop()
        # B stopped its own actors only: the host's connection and loop are the host's, and still work; and it left
        # nothing subscribed on that connection (a seat started again on it, as a standby taking the lease back
        # does, must not hear the router twice).
        assert host_nc.is_connected and host_loop.loop.is_running()
        assert subjects(host_nc) == subscriptions
        host_loop.run(host_nc.flush(), 10)
        assert host.is_alive() and pinger.is_alive()
        assert pykka.ActorRegistry.get_by_class(Host) == [host]
        assert pykka.ActorRegistry.get_by_class(Pinger) == [pinger]
    finally:
        host.stop()
        pinger.stop()
        host_loop.run(host_nc.close(), 10)
        bus_a.close()
        bus_b.close()

    assert not stop_all, "a supervisor stopped every actor of the process"
    assert logging.getLogger().handlers == handlers and logging.getLogger().level == level
    assert signal.getsignal(signal.SIGTERM) == sigterm and signal.getsignal(signal.SIGINT) == sigint
