"""A server frozen (SIGSTOP) while the seat writes: the write times out on the seat's side, the server makes it once
it runs again, and the seat settles at a fixed point with it, neither losing it nor making it twice."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import NatsServer, wait_until
from seatbus import Bus, Seats, assert_fixed_point, seat_config, settle

from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.contract import WANTS
from mesh_provisioner.runtime import Runtime

Events = tuple[threading.Event, threading.Event, threading.Event]


def hold_composition_of_bee(monkeypatch: pytest.MonkeyPatch) -> Events:
    """Hold node bee's next composition once it has read the bus and judged, before it writes: `read` is set then,
    the composition goes on when `gate` is set, and `done` is set once it has."""
    real = node_actor.compose_node
    read, gate, done = threading.Event(), threading.Event(), threading.Event()

    def held_after_reading(view: Any, node: str, now: Any, writes_on: Any = None) -> Any:
        result = real(view, node, now, writes_on)
        if node == "bee" and not gate.is_set():
            read.set()
            assert gate.wait(30)
            done.set()
        return result

    monkeypatch.setattr(node_actor, "compose_node", held_after_reading)
    return read, gate, done


def test_a_write_timed_out_on_a_paused_server_is_not_lost(
    nats_server: NatsServer, mesh: Bus, seats: Seats, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = seats.start(seat_config(mesh.url, request_timeout=10.0))
    assert sup.wait_settled(30)
    read, gate, done = hold_composition_of_bee(monkeypatch)
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    assert read.wait(30)
    nats_server.pause()
    try:
        gate.set()
        assert done.wait(30)
        # The composition's write waits for an answer that does not come, and fails.
        wait_until(lambda: sup.store.counts()["failed writes"] > 0, 30, interval=0.05, what="the write failed")
    finally:
        nats_server.resume()
    settle(sup)
    assert sup.store.counts()["failed writes"] >= 1
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert_fixed_point(mesh)


def test_wait_settled_answers_false_on_a_server_that_does_not_answer(nats_server: NatsServer, sup: Runtime) -> None:
    # Asking the bus whether every change has reached the cache waits for answers that do not come: past the
    # deadline the seat is not settled, as `wait_settled` promises, rather than a TimeoutError out of the bus loop.
    nats_server.pause()
    try:
        assert sup.wait_settled(1.0) is False
    finally:
        nats_server.resume()
    settle(sup)


def test_a_write_slower_than_the_stores_timeout_fails_in_the_store_not_the_actor(
    nats_server: NatsServer, mesh: Bus, seats: Seats, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The actor waits for the store longer than the store waits for the bus (both from `request_timeout`): a write
    # on a server that does not answer fails in the store, which says why and has it made again; it does not time the
    # actor's wait out first, which crashed the actor.
    sup = seats.start(seat_config(mesh.url, request_timeout=1.0))
    settle(sup)
    read, gate, _ = hold_composition_of_bee(monkeypatch)
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    assert read.wait(30)
    nats_server.pause()
    try:
        gate.set()
        wait_until(lambda: sup.store.counts()["failed writes"] > 0 or sup.status().restarts, 30, interval=0.05,
                   what="the write failed or its actor crashed")
    finally:
        nats_server.resume()
    assert sup.status().restarts == {}
    settle(sup)
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert_fixed_point(mesh)
