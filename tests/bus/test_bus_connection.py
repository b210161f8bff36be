"""The seat's connection and its own buckets."""

from __future__ import annotations

from helpers import wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.connection import LEASE_SECONDS, SEAT_STATES, ensure_buckets, link
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.rules.view import PLACEMENT, SEAT


def test_ensure_buckets_makes_the_seats_own_once(loop: EventLoopThread, nc: Client) -> None:
    js = nc.jetstream()
    made = loop.run(ensure_buckets(js), 10)
    assert made == [
        "mesh-provisioner_plans",
        "mesh-provisioner_provisions",
        "mesh-provisioner_refused",
        "mesh-provisioner_needs",
        "mesh-provisioner_seat",
    ]
    assert loop.run(ensure_buckets(js, SEAT_STATES), 10) == []
    lease = loop.run(js.stream_info("KV_mesh-provisioner_seat"), 10)
    assert lease.config.max_age == LEASE_SECONDS
    plans = loop.run(js.stream_info("KV_mesh-provisioner_plans"), 10)
    assert not plans.config.max_age and plans.config.max_msgs_per_subject == 1
    assert SEAT in SEAT_STATES and PLACEMENT not in SEAT_STATES  # the read buckets are other modules'


def test_link_counts_requests_and_tells_reconnect_listeners(loop: EventLoopThread, nc: Client) -> None:
    tie = link(nc)
    before = tie.requests
    loop.run(nc.jetstream().account_info(), 10)
    assert tie.requests == before + 1
    told: list[int] = []
    tie.on_reconnected(lambda: told.append(1))
    loop.run(tie.reconnected(), 5)
    wait_until(lambda: told == [1])
