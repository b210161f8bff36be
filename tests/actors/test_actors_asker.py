"""AskerActor: each retiring key's ask reaches the router once, whenever the router comes (contract 5.4)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from helpers import wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, provisions, raw, seat_config, settle

from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import ASK_RECORDS, BUILDS, DECIDED_SUBJECT, MANIFESTS, MODULE, MODULES, PLACEMENT
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.retire import ask_of
from mesh_provisioner.runtime import Runtime

OLDAPP = "bee.oldapp.postgres-database"  # retiring in the sample mesh: nothing places oldapp any more


def test_a_retiring_keys_ask_is_published_once_with_its_id(
    sup: Runtime, mesh: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    p = mesh.provision(OLDAPP)
    assert p is not None and p.state == r.RETIRING and p.ask
    asks = mesh.asks_published()
    assert [(msg_id, ask.about) for msg_id, ask in asks] == [(p.ask, "provision." + OLDAPP)]
    raised = sup.metrics.registry.get_sample_value("mesh_provisioner_asks_raised_total")
    # The asker restarted re-publishes what it cannot know it published: the router's stream keeps one.
    with caplog.at_level(logging.INFO, logger="mesh_provisioner"):
        for _ in range(3):
            old = sup.children()["asker"]
            sup.kill("asker")
            wait_until(lambda o=old: sup.children()["asker"].actor_urn != o.actor_urn, 10, what="the asker restarted")
            settle(sup)
    assert [msg_id for msg_id, _ in mesh.asks_published()] == [p.ask]
    assert sup.asks.duplicates >= 3
    # Said and counted once: the operator was asked once (a new holder of the seat re-publishes the same way).
    assert sup.metrics.registry.get_sample_value("mesh_provisioner_asks_raised_total") == raised == 1
    assert not [m for m in caplog.messages if "asked the operator" in m], caplog.messages


def test_an_ask_waits_for_a_router_that_comes_later(bus: Bus, seats: Seats) -> None:
    load_sample(bus.url)
    sup = seats.start(seat_config(bus.url))
    settle(sup)
    p = bus.provision(OLDAPP)
    assert p is not None and p.state == r.RETIRING and p.ask  # raised, but no router takes it yet
    bus.create_asks_stream()  # the router comes
    wait_until(bus.asks_published, 10, interval=0.05, what="the ask published to the router")
    settle(sup)
    assert [msg_id for msg_id, _ in bus.asks_published()] == [p.ask]
    assert_fixed_point(bus)


def _ended(key: str, p: r.Provision, outcome: str) -> bytes:
    """The router's record of a key's ask that ended with no choice."""
    ask = ask_of(key, p)
    assert ask is not None
    w = r.Warrant(asker=MODULE, ask=p.ask, outcome=outcome, at=datetime.now(UTC).replace(microsecond=0))
    return r.encode(r.AskRecord(state=outcome, ask=ask, warrant=w))


@pytest.mark.parametrize("outcome", ["expired", "withdrawn"])
def test_5_4_ask_ended_undecided_is_asked_again(sup: Runtime, mesh: Bus, outcome: str) -> None:
    p = mesh.provision(OLDAPP)
    assert p is not None and p.ask
    first = ask_of(OLDAPP, p)
    assert first is not None
    mesh.put(ASK_RECORDS, p.ask, _ended(OLDAPP, p, outcome))
    mesh.publish(DECIDED_SUBJECT, b"{}")
    wait_until(lambda: (q := mesh.provision(OLDAPP)) is not None and q.ask != p.ask, 10, what="a new ask in the key")
    wait_until(lambda: len(mesh.asks_published()) == 2, 10, interval=0.05, what="the new ask published")
    settle(sup)
    q = mesh.provision(OLDAPP)
    assert q is not None and (q.state, q.warrant) == (r.RETIRING, None)
    # The dead ask is cleared from the key, and a new one (a new id, a new expiry) went out at once.
    [(old_id, _), (new_id, new)] = mesh.asks_published()
    assert (old_id, new_id) == (p.ask, q.ask)
    assert new.expires is not None and first.expires is not None and new.expires > first.expires
    # The settled bus holds no retiring key whose ask ended undecided.
    for key, kept in provisions(mesh).items():
        if kept.state == r.RETIRING and kept.ask and kept.warrant is None:
            record = mesh.get(ASK_RECORDS, kept.ask)
            assert record is None or r.decode(r.AskRecord, record).state in ("open", "decided"), key
    assert_fixed_point(mesh)


def test_5_4_ask_whose_expiry_passed_before_it_went_out_is_made_again(bus: Bus, seats: Seats) -> None:
    load_sample(bus.url)
    now = [datetime.now(UTC).replace(microsecond=0)]
    sup = seats.start(seat_config(bus.url), clock=lambda: now[0])
    settle(sup)
    p = bus.provision(OLDAPP)
    assert p is not None and p.state == r.RETIRING and p.ask  # raised, but no router takes it
    now[0] += timedelta(hours=24)  # a day without a router: the ask expires before it goes out
    bus.create_asks_stream()
    wait_until(bus.asks_published, 10, interval=0.05, what="an ask published to the router")
    settle(sup)
    q = bus.provision(OLDAPP)
    assert q is not None and q.ask != p.ask
    [(published, ask)] = bus.asks_published()
    assert published == q.ask
    assert ask.expires is not None and ask.expires > now[0]


def test_5_4_ask_ids_of_keys_alike_but_for_dots_and_dashes_never_collide(bus: Bus, seats: Seats) -> None:
    """`ace.my-app.db` and `ace.my.app-db`, retiring in the same second, are two asks, both published."""
    manifests = {
        "m-store": {"name": "store", "provides": ["db", "app-db"]},
        "m-my-app": {"name": "my-app", "requires": [{"provision": "db"}]},
        "m-my": {"name": "my", "requires": [{"provision": "app-db"}]},
    }
    states: dict[str, dict[str, bytes]] = {
        MANIFESTS: {mid: raw(m) for mid, m in manifests.items()},
        MODULES: {m["name"]: raw({"module": m["name"], "fp": "f1", "manifest": mid}) for mid, m in manifests.items()},
        BUILDS: {f"{m['name']}.f1": raw({"module": m["name"], "fp": "f1", "manifest": mid})
                 for mid, m in manifests.items()},
        PLACEMENT: {"ace": raw({"node": "ace", "modules": [{"module": "store"}, {"module": "my-app"},
                                                           {"module": "my"}]})},
    }
    with EventLoopThread() as loop:
        loop.run(load_states(bus.url, states), 30)
    bus.create_asks_stream()
    at = datetime.now(UTC).replace(microsecond=0)
    sup = seats.start(seat_config(bus.url), clock=lambda: at)
    settle(sup)
    assert set(provisions(bus)) == {"ace.my-app.db", "ace.my.app-db"}
    bus.put(PLACEMENT, "ace", {"node": "ace", "modules": [{"module": "store"}]})
    wait_until(lambda: len(bus.asks_published()) == 2, 10, interval=0.05, what="both asks published")
    settle(sup)
    kept = provisions(bus)
    assert {key: p.state for key, p in kept.items()} == {"ace.my-app.db": r.RETIRING, "ace.my.app-db": r.RETIRING}
    assert sorted(i for i, _ in bus.asks_published()) == sorted(p.ask for p in kept.values())
    assert len({p.ask for p in kept.values()}) == 2
