"""AskerActor: each retiring key's ask reaches the router once, whenever the router comes (contract 5.4)."""

from __future__ import annotations

from helpers import wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, seat_config, settle

from mesh_provisioner.messages import records as r
from mesh_provisioner.supervisor import Supervisor

OLDAPP = "bee.oldapp.postgres-database"  # retiring in the sample mesh: nothing places oldapp any more


def test_a_retiring_keys_ask_is_published_once_with_its_id(sup: Supervisor, mesh: Bus) -> None:
    p = mesh.provision(OLDAPP)
    assert p is not None and p.state == r.RETIRING and p.ask
    asks = mesh.asks_published()
    assert [(msg_id, ask.about) for msg_id, ask in asks] == [(p.ask, "provision." + OLDAPP)]
    # The asker restarted re-publishes what it cannot know it published: the router's stream keeps one.
    for _ in range(3):
        old = sup.children()["asker"]
        sup.kill("asker")
        wait_until(lambda o=old: sup.children()["asker"].actor_urn != o.actor_urn, 10, what="the asker restarted")
        settle(sup)
    assert [msg_id for msg_id, _ in mesh.asks_published()] == [p.ask]
    assert sup.asks.duplicates >= 3


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
