"""NodeActor: one node never composes twice at once, a slow node delays no other, and changes coalesce.

`compose_node` is wrapped (not replaced: the real rule runs) to count compositions and concurrent entries per node,
and to hold one node's composition on an Event while the test does what it wants around it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime

import msgspec
import pytest
from helpers import wait_until
from seatbus import Bus, Seats, assert_fixed_point, seat_config, settle

from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.contract import BUILDS, MANIFESTS, MODULES, PLACEMENT, PROVISIONS, WANTS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import Resync, Wake
from mesh_provisioner.rules.node import Result
from mesh_provisioner.rules.view import View
from mesh_provisioner.runtime import Runtime

HOLD = 30.0  # the most a held composition waits for its release: a failing test ends, it does not hang


class ComposeSpy:
    """Wraps `compose_node`: counts each node's compositions and concurrent entries, and can hold a node."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.lock = threading.Lock()
        self.running: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.count: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}

    def hold(self, node: str) -> threading.Event:
        """Hold the node's next compositions until the returned event is set."""
        gate = self.gates[node] = threading.Event()
        self.entered[node] = threading.Event()
        return gate

    def __call__(self, view: View, node: str, now: datetime, writes_on: Callable[[str], bool] | None = None) -> Result:
        with self.lock:
            self.running[node] += 1
            self.count[node] += 1
            self.most[node] = max(self.most[node], self.running[node])
        try:
            # Held after it read the view: a change arriving while it is held is not in what it writes.
            result: Result = self.real(view, node, now, writes_on)  # type: ignore[operator]
            gate = self.gates.get(node)
            if gate is not None:
                self.entered[node].set()
                assert gate.wait(HOLD), f"the composition of {node} was never released"
            return result
        finally:
            with self.lock:
                self.running[node] -= 1
                self.finished[node] += 1


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ComposeSpy]:
    """compose_node as the node actors call it, wrapped; every held gate is opened after the test."""
    s = ComposeSpy(node_actor.compose_node)
    monkeypatch.setattr(node_actor, "compose_node", s)
    try:
        yield s
    finally:
        for gate in s.gates.values():
            gate.set()


def test_a_node_never_composes_twice_at_once(spy: ComposeSpy, sup: Runtime, mesh: Bus) -> None:
    gate = spy.hold("ace")
    sup.tell("node:ace", Wake((("compose", "ace"),)))
    assert spy.entered["ace"].wait(HOLD)
    # Everything that can ask ace to compose, while it composes: changes on the bus, wakes, resyncs, a host's
    # ComposeNode, and its own restart (a crash is handled after the composition, as any other message).
    futures = [sup.compose("ace") for _ in range(3)]
    mesh.put(WANTS, "want.ace.keycloak", {"fp": "kc2"})
    mesh.put(PLACEMENT, "ace", {"node": "ace", "modules": [{"module": m} for m in ("postgres", "gitea", "keycloak",
                                                                                      "mesh-vault", "mailer")]})
    for _ in range(20):
        sup.tell("node:ace", Wake((("compose", "ace"),)))
        sup.tell("node:ace", Resync())
    sup.kill("node:ace")
    assert spy.running["ace"] == 1
    gate.set()
    settle(sup)
    for f in futures:
        try:
            f.get(timeout=HOLD)
        except Exception as err:  # the kill may come before an asked composition: answered as dead, never twice
            assert "ActorDeadError" in type(err).__name__ or "killed" in str(err), err
    assert spy.most["ace"] == 1, spy.most
    assert max(spy.most.values()) == 1
    assert mesh.plan("ace.mailer") is not None
    assert_fixed_point(mesh)


def test_a_slow_node_delays_no_other(spy: ComposeSpy, sup: Runtime, mesh: Bus) -> None:
    gate = spy.hold("ace")
    mesh.put(WANTS, "want.ace.keycloak", {"fp": "kc2"})  # wakes ace, which now composes until released
    assert spy.entered["ace"].wait(HOLD)
    before = spy.finished["bee"]
    # bee composes and writes while ace is held.
    mesh.put(PLACEMENT, "bee", {"node": "bee", "modules": [{"module": m} for m in ("webapp", "reports")]})
    mesh.put(WANTS, "want.bee.mailer", {"fp": "", "removed": True})

    def bee_written() -> bool:
        p = mesh.provision("bee.mailer.postgres-database.mail")  # the last of bee's writes (its plans go first)
        return mesh.plan("bee.mailer") is None and p is not None and p.state == r.RETIRING

    wait_until(bee_written, HOLD, what="bee's composition written while ace is held")
    assert spy.finished["bee"] > before
    assert not gate.is_set() and spy.running["ace"] == 1, "ace is still held while bee composed and wrote"
    gate.set()
    settle(sup)
    assert_fixed_point(mesh)


def test_a_hundred_changes_during_a_composition_give_one_more(spy: ComposeSpy, sup: Runtime) -> None:
    gate = spy.hold("bee")
    sup.tell("node:bee", Wake((("compose", "bee"),)))
    assert spy.entered["bee"].wait(HOLD)
    assert spy.count["bee"] - spy.finished["bee"] == 1
    started = spy.count["bee"]
    for _ in range(100):
        sup.tell("node:bee", Wake((("compose", "bee"),)))
    gate.set()
    settle(sup)
    # The held one, and exactly one more for the hundred: coalesced, and none lost.
    assert spy.count["bee"] == started + 1, spy.count
    assert spy.most["bee"] == 1


def test_a_change_arriving_during_a_composition_is_never_lost(spy: ComposeSpy, sup: Runtime, mesh: Bus) -> None:
    gate = spy.hold("bee")
    sup.tell("node:bee", Wake((("compose", "bee"),)))
    assert spy.entered["bee"].wait(HOLD)
    # The composition under way read the view before this change: only the one it causes can write it.
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    gate.set()
    settle(sup)
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why



def test_a_composition_asked_for_that_fails_loses_no_pending_change(
    spy: ComposeSpy, sup: Runtime, mesh: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = spy.hold("bee")
    sup.tell("node:bee", Wake((("compose", "bee"),)))
    assert spy.entered["bee"].wait(HOLD)
    # While bee composes: a change (kept with the run under way), then a host's ComposeNode, whose composition
    # fails (say, the bus timed out). The ask answers the error; the change must still be composed.
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    wait_until(lambda: sup.view.get(WANTS, "want.bee.mailer") is not None, HOLD, what="the change in the cache")
    real, before, failed = spy.real, spy.count["bee"], []

    def fails_once(view: View, node: str, now: datetime, writes_on: Callable[[str], bool] | None = None) -> Result:
        if node == "bee" and spy.count["bee"] == before + 1 and not failed:  # the asked composition, after the held
            failed.append(node)
            raise TimeoutError("the bus did not answer in time")
        result: Result = real(view, node, now, writes_on)  # type: ignore[operator]
        return result

    spy.real = fails_once
    asked = sup.compose("bee")
    gate.set()
    with pytest.raises(TimeoutError):
        asked.get(timeout=HOLD)
    settle(sup)
    assert failed == ["bee"]
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert_fixed_point(mesh)


NOTE = "bee.notifier.postgres-database.note"  # its depends-on names bee: its own credential


def _place_notifier(mesh: Bus) -> None:
    """A module on bee needing a database with a credential of its own, on bee: its key's depends-on names bee."""
    mesh.put(MANIFESTS, "m-notifier", {"name": "notifier", "requires": [
        {"provision": "postgres-database", "local": "note", "credential": "own"}]})
    mesh.put(MODULES, "notifier", {"module": "notifier", "fp": "nt1", "manifest": "m-notifier"})
    mesh.put(BUILDS, "notifier.nt1", {"module": "notifier", "fp": "nt1", "manifest": "m-notifier"})


def test_a_wake_caused_by_the_nodes_own_composition_composes_nothing_again(
    spy: ComposeSpy, sup: Runtime, mesh: Bus
) -> None:
    _place_notifier(mesh)
    settle(sup)
    before = spy.count["bee"]
    mesh.put(PLACEMENT, "bee", {"node": "bee", "modules": [{"module": m} for m in ("webapp", "reports", "mailer",
                                                                                      "notifier")]})
    settle(sup)
    # The placement wakes bee once; its new key's depends-on names bee (contract section 6), but that change is
    # bee's own composition's: composing again would write nothing.
    written = mesh.provision(NOTE)
    assert written is not None and written.depends_on == ("bee.notifier.postgres-database-credential.note",)
    assert spy.count["bee"] - before == 1, spy.count
    assert_fixed_point(mesh)


def test_a_change_of_the_nodes_key_by_another_writer_still_wakes_it(
    spy: ComposeSpy, sup: Runtime, mesh: Bus
) -> None:
    _place_notifier(mesh)
    mesh.put(PLACEMENT, "bee", {"node": "bee", "modules": [{"module": m} for m in ("webapp", "reports", "mailer",
                                                                                      "notifier")]})
    settle(sup)
    before = spy.count["bee"]
    # The same key, written by someone else: its depends-on, which names bee, changed under bee (section 6).
    forged = mesh.provision(NOTE)
    assert forged is not None
    mesh.put(PROVISIONS, NOTE, r.encode(msgspec.structs.replace(forged, depends_on=())))
    settle(sup)
    assert spy.count["bee"] > before, spy.count
    assert_fixed_point(mesh)


def test_a_wake_for_a_change_the_last_composition_had_read_composes_nothing_again(
    spy: ComposeSpy, mesh: Bus, seats: Seats, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = seats.start(seat_config(mesh.url, max_parallel=1))
    settle(sup)
    turns = sup._turns
    assert turns is not None
    gate = spy.hold("ace")
    mesh.put(WANTS, "want.ace.gitea", {"fp": "gt9"})
    assert spy.entered["ace"].wait(HOLD), "ace never composed"  # and holds the one composition at once
    before = spy.count["bee"]
    # bee's composition for this change waits for ace's to end ...
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
    wait_until(lambda: turns.waiting() == 1, 10, what="bee waiting for its turn to compose")
    # ... and this change reaches the cache before it begins reading: kept with the run, which reads it.
    mesh.put(WANTS, "want.bee.reports", {"fp": "rp9"})
    wait_until(lambda: sup.view.get(WANTS, "want.bee.reports") is not None, 10, what="the second change cached")
    gate.set()
    settle(sup)
    assert spy.count["bee"] - before == 1, spy.count
    # That one composition read both changes: each module is held at the build its want names.
    for module, fp in (("mailer", "ml9"), ("reports", "rp9")):
        held = mesh.refusal(f"bee.{module}")
        assert held is not None and fp in held.why, held
    assert_fixed_point(mesh)


def test_a_composition_whose_writes_did_not_land_leaves_its_keys_to_their_own_judgments(
    sup: Runtime, mesh: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A composition keeps each key's read set and takes the key's queued judgment out of the queue (actors/dispatch.py
    # `_judged_within`): sound only once its writes landed. Refused, the keys may not say what it judged.
    _place_notifier(mesh)
    settle(sup)
    kept: list[dict[str, object]] = []
    real = sup.dispatcher.done

    def done(j: tuple[str, str], reads: object) -> None:
        if j == ("compose", "bee") and reads is not None:
            kept.append(dict(reads.judged))  # type: ignore[attr-defined]
        real(j, reads)  # type: ignore[arg-type]

    monkeypatch.setattr(sup.dispatcher, "done", done)
    sup.store.guard = lambda w: "refused by the test" if w.state == PROVISIONS and w.key == NOTE else ""
    mesh.put(PLACEMENT, "bee", {"node": "bee", "modules": [{"module": m} for m in ("webapp", "reports", "mailer",
                                                                                      "notifier")]})
    wait_until(lambda: kept, 10, what="bee composed with its write refused")
    assert mesh.provision(NOTE) is None
    assert all(not judged for judged in kept), "a composition whose write was refused kept its keys' read sets"
    sup.store.guard = None
    sup.compose("bee").get(timeout=10)
    settle(sup)
    assert any(kept[-1]), "a composition whose writes landed keeps its keys' read sets"
    assert_fixed_point(mesh)
