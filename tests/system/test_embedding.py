"""Embedding: supervisors inside a host's own pykka actor system, on the host's NATS client and loop or their own.

The host's actors drive the supervisors with typed messages (`ComposeNode`, `Status`, `Stop`), one supervisor runs
on the host's own NATS connection and event loop, and stopping one supervisor leaves the other and the host's
actors running. The seat keeps no global state: it stops only its own actors (never `ActorRegistry.stop_all`),
installs no signal handler and configures no logging (design.md, "Supervision"). It leaves nothing behind on a
host's client and loop (no subscription, no task, no method replaced), after a failed start or a lost server too;
it notices a host closing its client; it refuses a client without its loop. The embedding example
(examples/embed_host.py) checks the same as a host would, and reports the host loop's stall.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pykka
import pytest
from helpers import NatsServer, wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, seat_config, settle

from mesh_provisioner import supervisor
from mesh_provisioner.actors.base import stop_actor
from mesh_provisioner.bus.embedded import free_port
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import WANTS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import ComposeNode, SeatStatus, Status, Stop
from mesh_provisioner.runtime import Runtime


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
    """What a connection is subscribed to (nats-py has no public listing), its own inbox for replies included."""
    return sorted(sub.subject for sub in nc._subs.values())


def tasks(loop: EventLoopThread) -> set[asyncio.Task[Any]]:
    """The tasks on a loop not done yet."""

    async def pending() -> set[asyncio.Task[Any]]:
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}

    return loop.run(pending(), 10)


def seat_threads() -> list[str]:
    """The threads of a seat's own loop."""
    return [t.name for t in threading.enumerate() if t.name == "mesh-provisioner-bus"]


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
    host_loop.run(host_nc.request("$JS.API.INFO", b"", timeout=10), 15)  # nats-py's own reply inbox, made now
    client = (type(host_nc), dict(vars(host_nc)))
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
        assert subjects(host_nc) == subscriptions  # the store's inbox of acknowledgements is gone too
        # The host's client is as nats-py made it: no method of it replaced, nothing of the seat's kept on it.
        assert (type(host_nc), set(vars(host_nc))) == (client[0], set(client[1]))
        assert all(vars(host_nc)[name] is value for name, value in client[1].items() if callable(value))
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


def test_nc_without_loop_is_refused_at_once(nats_server: NatsServer, host_loop: EventLoopThread) -> None:
    host_nc = host_loop.run(nats.connect(nats_server.url, name="host"), 10)
    try:
        began = time.monotonic()
        with pytest.raises(ValueError, match="loop="):
            Runtime.start(seat_config(nats_server.url), nc=host_nc)
        assert time.monotonic() - began < 1.0
        assert not seat_threads() and pykka.ActorRegistry.get_all() == []
    finally:
        host_loop.run(host_nc.close(), 10)


def test_a_start_against_no_server_raises_and_leaves_nothing_running(host_loop: EventLoopThread) -> None:
    nowhere = seat_config(f"nats://127.0.0.1:{free_port()}", request_timeout=0.5)
    with pytest.raises(TimeoutError):
        Runtime.start(nowhere)
    assert not seat_threads()
    before = tasks(host_loop)
    with pytest.raises(TimeoutError):
        Runtime.start(nowhere, loop=host_loop.loop)
    wait_until(lambda: tasks(host_loop) <= before, what="no task of the seat's left on the host's loop")
    assert not seat_threads() and pykka.ActorRegistry.get_all() == []


def test_a_seat_stopped_after_its_server_went_away_leaves_no_task_on_the_hosts_loop(
    mesh: Bus, nats_server: NatsServer, host_loop: EventLoopThread
) -> None:
    before = tasks(host_loop)
    sup = Runtime.start(seat_config(mesh.url, request_timeout=2.0), loop=host_loop.loop)
    settle(sup)
    nats_server.kill()
    wait_until(lambda: not sup.nc.is_connected, what="the seat lost its server")
    # A write on its way: nats-py keeps it for the reconnect, and its close then raised before ending the
    # subscriptions' tasks.
    host_loop.run(sup.nc.publish("mesh.in-flight", b"w" * 100), 5)
    sup.stop()
    wait_until(lambda: tasks(host_loop) <= before, 15, what="no task of the seat's left on the host's loop")
    assert pykka.ActorRegistry.get_all() == []


def test_a_stopped_seat_has_no_actor_left_in_the_registry_once_stop_returns(
    mesh: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = Runtime.start(seat_config(mesh.url))
    settle(sup)
    status, answering, returned = sup.status, threading.Event(), threading.Event()

    def slow_status() -> SeatStatus:
        answering.set()
        returned.wait(2)  # a stop that does not wait for the host's mailbox has returned by then
        return status()

    monkeypatch.setattr(sup, "status", slow_status)
    asked = sup.ref.ask(Status(), block=False)
    assert answering.wait(10)
    sup.stop()
    left = pykka.ActorRegistry.get_all()
    returned.set()
    assert isinstance(asked.get(timeout=10), SeatStatus)
    assert left == []


def test_a_stop_asked_while_another_is_under_way_returns_once_the_seat_is_stopped(
    mesh: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = Runtime.start(seat_config(mesh.url))
    settle(sup)
    stopping, go, returned = threading.Event(), threading.Event(), threading.Event()
    left: list[list[Any]] = []

    def held_up(ref: pykka.ActorRef[Any], timeout: float) -> None:
        if not stopping.is_set():  # the first stop waits at its first actor until told to go on
            stopping.set()
            go.wait(10)
        stop_actor(ref, timeout)

    def second() -> None:
        sup.stop(0.5)  # its timeout bounds its own actors' stops: it waits for the first stop however long that takes
        left.append(pykka.ActorRegistry.get_all())
        returned.set()

    monkeypatch.setattr(supervisor, "stop_actor", held_up)
    sup.ref.tell(Stop())  # a host's stop, done on a thread of the seat's own
    assert stopping.wait(10)
    threading.Thread(target=second, daemon=True).start()
    returned.wait(2)  # a stop that does not wait for the one under way has returned by then
    go.set()
    assert returned.wait(20)
    assert left == [[]]
    assert sup.failed.result(timeout=10) == ""


def test_a_stop_cut_short_by_an_exception_still_lets_the_bus_go(mesh: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    sup = Runtime.start(seat_config(mesh.url))
    settle(sup)
    stop_children = sup.supervisor.stop

    def cut_short(timeout: float, why: str = "") -> bool:
        stop_children(timeout, why)
        raise KeyboardInterrupt  # as a signal's Interrupted, raised in a process's main thread during its stop

    monkeypatch.setattr(sup.supervisor, "stop", cut_short)
    try:
        with pytest.raises(KeyboardInterrupt):
            sup.stop()
        assert sup.nc.is_closed and not seat_threads()
        assert sup.failed.result(timeout=1) == ""
        sup.stop()  # a later stop finds the seat stopped
    finally:
        stop_actor(sup.ref, 10)


def test_a_host_closing_its_connection_is_noticed_by_the_seat(mesh: Bus, host_loop: EventLoopThread) -> None:
    host_nc = host_loop.run(nats.connect(mesh.url, name="host"), 10)
    before = tasks(host_loop)
    sup = Runtime.start(seat_config(mesh.url), nc=host_nc, loop=host_loop.loop)
    settle(sup)
    host_loop.run(host_nc.close(), 10)
    assert "closed" in sup.failed.result(timeout=15)
    wait_until(lambda: not any(ref.is_alive() for ref in sup.children().values()), what="the seat's actors stopped")
    wait_until(lambda: tasks(host_loop) <= before, 15, what="no task of the seat's left on the host's loop")


def test_the_embedding_example_passes_and_reports_the_host_loops_stall() -> None:
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "examples.embed_host", "--nodes", "200"], cwd=root,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    assert sum(line.startswith("ok: ") for line in lines) == 5, run.stdout
    stall = [line for line in lines if line.startswith("stall: ")]
    assert len(stall) == 1 and " ms " in stall[0], run.stdout
