"""The supervisor: a child that dies however it dies is restarted and resynchronises from the bus; past the restart
intensity every child is stopped in reverse order and the owner is told why (design.md, "Supervision")."""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest
from helpers import wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, seat_config, settle

from mesh_provisioner.actors import base
from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.actors.dispatch import JUDGE
from mesh_provisioner.contract import HAVE, PROVISIONS, WANTS, bound
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import Wake
from mesh_provisioner.runtime import Runtime


def dead(sup: Runtime, name: str) -> bool:
    """Whether a child is down, waiting for its restart."""
    return not sup.children()[name].is_alive()


def restarted(sup: Runtime, name: str, old: pykka.ActorRef[Any]) -> bool:
    """Whether a child runs again as another instance than `old`."""
    ref = sup.children()[name]
    return ref.actor_urn != old.actor_urn and ref.is_alive()


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_child_killed_or_stopped_is_restarted_and_resyncs_from_the_bus(
    how: str, mesh: Bus, seats: Seats
) -> None:
    # A restart far enough off that the change below reaches the supervisor while bee's actor is down.
    sup = seats.start(seat_config(mesh.url, backoff_first=1.0))
    settle(sup)
    old = sup.children()["node:bee"]
    if how == "kill":
        sup.kill("node:bee")
    else:
        old.stop()
    wait_until(lambda: dead(sup, "node:bee"), 10, what="bee's actor down")
    # What the dead actor's mailbox would have held is recovered by its successor's resync.
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    settle(sup)
    assert restarted(sup, "node:bee", old)
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert sup.status().restarts == {"node:bee": 1}
    assert_fixed_point(mesh)


def test_a_child_whose_work_raises_is_restarted(
    mesh: Bus, seats: Seats, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = node_actor.compose_node
    failures = []

    def fails_once(view: Any, node: str, now: Any, writes_on: Any = None) -> Any:
        if node == "bee" and not failures:
            failures.append(node)
            raise RuntimeError("a bug in a rule")
        return real(view, node, now, writes_on)

    sup = seats.start(seat_config(mesh.url))
    settle(sup)
    monkeypatch.setattr(node_actor, "compose_node", fails_once)
    old = sup.children()["node:bee"]
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    settle(sup)
    assert failures == ["bee"]
    assert restarted(sup, "node:bee", old)
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert_fixed_point(mesh)


def test_each_kind_of_child_is_restarted(sup: Runtime, mesh: Bus) -> None:
    names = sorted(sup.children())
    assert {"asker", "bound:postgres", "node:ace", "node:bee"} <= set(names)
    for name in names:
        old = sup.children()[name]
        sup.kill(name)
        wait_until(lambda n=name, o=old: restarted(sup, n, o), 10, what=f"{name} restarted")
    settle(sup)
    assert sup.status().restarts == dict.fromkeys(names, 1)
    assert_fixed_point(mesh)


def test_a_restarted_bound_actor_judges_its_providers_keys_not_entries_no_composition_made(
    mesh: Bus, seats: Seats
) -> None:
    sup = seats.start(seat_config(mesh.url, backoff_first=1.0))
    settle(sup)
    # An entry for a key no composition made: its judgment would find no provision and write nothing (5.3).
    mesh.put(bound("postgres"), "zed.nobody.postgres-database", {"state": "provided"})
    settle(sup)
    old = sup.children()["bound:postgres"]
    sup.kill("bound:postgres")
    wait_until(lambda: dead(sup, "bound:postgres"), 10, what="postgres's bound actor down")
    # What the dead actor's mailbox would have held is recovered by its successor's resync.
    mesh.put(bound("postgres"), "bee.webapp.postgres-database", {"state": "failed", "why": "disk full"})
    settle(sup)
    assert restarted(sup, "bound:postgres", old)
    p = mesh.provision("bee.webapp.postgres-database")
    assert p is not None and p.state == r.FAILED and p.why == "disk full"
    assert not sup.dispatcher.knows((JUDGE, "zed.nobody.postgres-database"))
    assert mesh.provision("zed.nobody.postgres-database") is None
    assert_fixed_point(mesh)


def test_keys_judged_together_are_written_in_batches_of_at_most_a_batch(
    mesh: Bus, seats: Seats, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A provider with thousands of consumers would otherwise hold every other change's writes behind all of its own.
    monkeypatch.setattr(base, "BATCH", 1)
    sup = seats.start(seat_config(mesh.url, backoff_first=1.0))
    settle(sup)
    batches: list[int] = []
    real = sup.apply

    def recording(writes: list[Any], writers: Any) -> Any:
        if writers and all(kind == JUDGE for kind, _ in writers.values()):
            batches.append(len(writes))
        return real(writes, writers)

    monkeypatch.setattr(sup, "apply", recording)
    sup.kill("bound:postgres")
    wait_until(lambda: dead(sup, "bound:postgres"), 10, what="postgres's bound actor down")
    # Both keys change while the actor is down: its successor judges them together, at its start.
    for key in ("bee.webapp.postgres-database", "ace.gitea.postgres-database.main"):
        mesh.put(bound("postgres"), key, {"state": "failed", "why": "disk full"})
    settle(sup)
    for key in ("bee.webapp.postgres-database", "ace.gitea.postgres-database.main"):
        p = mesh.provision(key)
        assert p is not None and p.state == r.FAILED, key
    assert sum(batches) >= 2 and max(batches) == 1, batches
    assert_fixed_point(mesh)


def test_composing_a_node_whose_actor_is_down_does_not_stay_in_flight(mesh: Bus, seats: Seats) -> None:
    sup = seats.start(seat_config(mesh.url, backoff_first=1.0))
    settle(sup)
    sup.kill("node:ace")
    wait_until(lambda: dead(sup, "node:ace"), 10, what="ace's actor down")
    answer = sup.compose("ace")
    with pytest.raises(pykka.ActorDeadError):
        answer.get(timeout=10)
    settle(sup)
    assert sup.status().in_flight == 0
    assert sup.compose("ace").get(timeout=10).node == "ace"


def test_past_the_restart_intensity_children_stop_in_reverse_order_and_the_owner_is_told_why(
    mesh: Bus, seats: Seats, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped: list[str] = []
    lock = threading.Lock()
    real_on_stop = base.SeatActor.on_stop

    def on_stop(self: base.SeatActor) -> None:
        with lock:
            stopped.append(self.name)
        real_on_stop(self)

    monkeypatch.setattr(base.SeatActor, "on_stop", on_stop)
    sup = seats.start(seat_config(mesh.url, restart_intensity=2, restart_period=60.0))
    settle(sup)
    order = list(sup.children())
    for _ in range(2):
        old = sup.children()["node:ace"]
        sup.kill("node:ace")
        wait_until(lambda o=old: restarted(sup, "node:ace", o), 10, what="ace restarted")
    assert not sup.failed.done()
    sup.kill("node:ace")  # the third stop within the period: past the intensity of 2
    why = sup.failed.result(timeout=20)
    assert "node:ace" in why and "3 times" in why, why
    assert stopped == [n for n in reversed(order) if n != "node:ace"]
    assert not any(ref.is_alive() for ref in sup.children().values())
    assert not sup.ref.is_alive()
    assert sup.status().failed == why


def test_a_connection_closed_for_good_fails_the_supervisor_and_the_owner_is_told_why(sup: Runtime) -> None:
    # A server's error nats-py takes as final closes the connection for good (here a subject past the server's
    # control line, as the seat's writes at a key too long once made): the seat can neither write nor hear again.
    sup.loop.run(sup.nc.publish("x" * 5000, b""), 5)
    why = sup.failed.result(timeout=30)
    assert "closed for good" in why and "maximum control line exceeded" in why, why
    assert not any(ref.is_alive() for ref in sup.children().values())
    assert sup.status().failed == why


def test_a_restart_within_the_intensity_does_not_fail(sup: Runtime) -> None:
    old = sup.children()["node:bee"]
    sup.kill("node:bee")
    wait_until(lambda: restarted(sup, "node:bee", old), 10, what="bee restarted")
    sup.tell("node:bee", Wake((("compose", "bee"),)))
    settle(sup)
    assert not sup.failed.done()
    assert all(sup.status().children.values())
    assert sup.compose("bee").get(timeout=10).node == "bee"
    assert r.Composed(node="bee").node == "bee"


# bee's reports is held (nothing places a provider of object-storage), but a seat before this one composed it with
# keycloak on ace as its provider: its key is kept, not retired, and its state still follows its provider (5.3).
HELD_KEY = "bee.reports.object-storage"
HELD = {
    PROVISIONS: {
        HELD_KEY: r.encode(
            r.Provision(
                provision="object-storage",
                consumer=r.End(module="reports", node="bee"),
                provider=r.End(module="keycloak", node="ace"),
                state=r.PROVIDED,
                v=1,
            )
        )
    }
}


def test_a_restarted_node_actor_judges_its_held_modules_keys_again(bus: Bus, seats: Seats) -> None:
    load_sample(bus.url, extra=HELD)
    bus.create_asks_stream()
    sup = seats.start(seat_config(bus.url, backoff_first=1.0))
    settle(sup)
    assert bus.refusal("bee.reports") is not None
    p = bus.provision(HELD_KEY)
    assert p is not None and p.state == r.PROVIDED
    sup.kill("node:bee")
    wait_until(lambda: dead(sup, "node:bee"), 10, what="bee's actor down")
    # keycloak fails while bee's actor is down: the key's judgement told to it is lost with its mailbox.
    bus.put(HAVE, "ace.keycloak", {"fp": "kc1", "phase": "failed", "health": "failed", "detail": "oom"})
    settle(sup)
    p = bus.provision(HELD_KEY)
    assert p is not None and p.state == r.FAILED, p
    assert_fixed_point(bus)


def test_reconcile_judges_every_key_of_a_node_held_modules_too(bus: Bus, seats: Seats) -> None:
    stale = {PROVISIONS: {HELD_KEY: HELD[PROVISIONS][HELD_KEY].replace(b'"provided"', b'"failed"')}}
    load_sample(bus.url, extra=stale)
    bus.create_asks_stream()
    # keycloak is not among the providers whose entries are read: no bound actor judges its keys.
    sup = seats.start(seat_config(bus.url, bound_reads=("postgres", "mesh-vault", "gitea")))
    settle(sup)
    p = bus.provision(HELD_KEY)
    assert p is not None and p.state == r.PROVIDED, p  # keycloak runs healthy at its want


def test_a_key_naming_no_node_gets_no_actor(sup: Runtime, mesh: Bus) -> None:
    children = set(sup.children())
    # Valid key-value keys whose node is not a token (contract 1, 7): bad input, named, and no actor made for it.
    mesh.put(HAVE, "a=b.gitea", {"fp": "gt1", "phase": "running", "health": "ok"})
    mesh.put(WANTS, "want.c=d.gitea", {"fp": "gt1"})
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})  # and everything else keeps working
    settle(sup)
    assert set(sup.children()) == children
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert_fixed_point(mesh)


def test_a_write_that_failed_for_another_reason_than_a_conflict_is_made_again(mesh: Bus, seats: Seats) -> None:
    # The bus refuses every write at first (as a JetStream briefly unavailable would): nothing is lost, every
    # failed piece of work comes back after its backoff and lands once writes go through, with no change on the bus.
    refusing = threading.Event()
    refusing.set()
    def guard(write: object) -> str:
        return "the bus is briefly unavailable" if refusing.is_set() else ""

    sup = seats.start(seat_config(mesh.url), guard=guard)
    wait_until(lambda: sup.store.errors >= 3, 30, 0.01, "writes refused and tried again")
    assert mesh.provision("ace.gitea.postgres-database.main") is None  # nothing went through yet
    assert not sup.wait_settled(0.5)  # retries are work in flight: the seat is not settled while they fail
    refusing.clear()
    settle(sup)
    assert mesh.provision("bee.oldapp.postgres-database").state == r.RETIRING  # type: ignore[union-attr]
    assert mesh.provision("ace.gitea.postgres-database.main").state == r.PROVIDED  # type: ignore[union-attr]
    assert_fixed_point(mesh)


def test_an_actor_that_does_not_stop_in_time_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()

    class Busy(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> Any:
            return release.wait(10)

    ref = Busy.start()
    try:
        ref.tell("work")
        with caplog.at_level("WARNING", logger="mesh_provisioner.actors"):
            base.stop_actor(ref, 0.1)
        assert any("did not stop within 0.1 s" in m and "Busy" in m for m in caplog.messages), caplog.messages
    finally:
        release.set()
        ref.actor_stopped.wait(10)
    assert not ref.is_alive()
    with caplog.at_level("WARNING", logger="mesh_provisioner.actors"):
        base.stop_actor(ref, 0.1)  # one stopped already: nothing to say
    assert len([m for m in caplog.messages if "did not stop" in m]) == 1
