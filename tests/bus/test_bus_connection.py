"""The seat's connection and its own buckets."""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
import pytest
from helpers import NatsServer, raw_publish, wait_until
from nats.aio.client import Client
from nats.aio.msg import Msg

from mesh_provisioner.bus.connection import LOAD_CONNECTION, connect, ensure_buckets
from mesh_provisioner.bus.link import link, unless_closed
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import LEASE_SECONDS, PLACEMENT, SEAT, SEAT_STATES


def test_ensure_buckets_makes_the_seats_own_once(loop: EventLoopThread, nc: Client) -> None:
    js = nc.jetstream()
    made = loop.run(ensure_buckets(js), 10)
    assert made == [
        "mesh-provisioner_plans",
        "mesh-provisioner_provisions",
        "mesh-provisioner_refused",
        "mesh-provisioner_needs",
        "mesh-provisioner_registry",
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


@pytest.mark.parametrize("subject", [b"x.a\x0bb", b"x.a\x0cb", b"x.a\xff\xfeb"], ids=["vertical tab", "form feed",
                                                                                        "not utf-8"])
def test_a_subject_nats_py_could_not_parse_is_delivered_and_the_connection_stays(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer, subject: bytes
) -> None:
    # The server takes these subjects (its delimiters are space and tab). nats-py's parser split the line at the
    # vertical tab or form feed and, with 4 KB and more behind it, waited for ever; a subject not UTF-8 ended its read
    # loop. Either way the client read nothing more, and still counted itself connected.
    got: list[str] = []

    async def keep(msg: Msg) -> None:
        got.append(msg.subject)

    loop.run(nc.subscribe("x.>", cb=keep), 5)
    loop.run(nc.flush(), 5)
    raw_publish(nats_server.url, subject, b"y" * 5000)
    raw_publish(nats_server.url, b"x.after", b"ok")
    wait_until(lambda: len(got) == 2, what="both messages delivered")
    assert got[0] == subject.decode("utf-8", "replace") and got[1] == "x.after"
    assert link(nc).reconnects == 0 and nc.is_connected


def test_a_read_loop_that_ends_while_connected_is_replaced_by_a_new_connection(
    loop: EventLoopThread, nc: Client, other: Client
) -> None:
    # nats-py's read loop ends on an error it did not foresee (as "read() called while another coroutine is already
    # waiting for incoming data") without reconnecting: its client counted itself connected and read nothing more.
    got: list[bytes] = []

    async def keep(msg: Msg) -> None:
        got.append(msg.data)

    loop.run(nc.subscribe("x.>", cb=keep), 5)
    loop.run(nc.flush(), 5)
    parse = nc._ps.parse

    async def fails_once(data: bytes = b"") -> None:
        nc._ps.parse = parse  # type: ignore[method-assign]
        raise RuntimeError("read() called while another coroutine is already waiting for incoming data")

    nc._ps.parse = fails_once  # type: ignore[method-assign]
    loop.run(other.publish("x.lost", b"lost"), 5)
    wait_until(lambda: link(nc).reconnects == 1, 15, what="a new connection")
    loop.run(other.publish("x.after", b"after"), 5)
    wait_until(lambda: b"after" in got, what="a message after the new connection")


def test_a_request_whose_server_is_lost_fails_at_once_not_at_its_timeout(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    # nats-py waits for the answer of a request sent before a disconnect until the request's timeout, though it never
    # comes (a watch dropped during a reconnect waited that long to delete its consumer, and the resync behind it).
    nats_server.pause()  # the request goes out, and a frozen server does not answer it
    future = loop.submit(nc.request("$JS.API.INFO", b"", timeout=60))
    wait_until(lambda: nc._resp_map, what="the request waits for its answer")
    nats_server.kill()
    # nats-py's own timeout, well inside the request's 60 s (waiting longer here would raise the builtin one).
    with pytest.raises(nats.errors.TimeoutError):
        future.result(30)
    nats_server.start()
    wait_until(lambda: nc.is_connected, 30, what="the client reconnected")
    assert loop.run(nc.request("$JS.API.INFO", b"", timeout=10), 15).data  # and asks again as before


def test_ensure_buckets_asks_again_while_jetstream_does_not_answer(
    loop: EventLoopThread, nc: Client, nats_server: NatsServer
) -> None:
    # A cluster electing its leaders after a server came back answers nothing for a while: a seat starting then
    # failed at once. It asks again, for its patience at most.
    js = nc.jetstream(timeout=0.3)
    nats_server.pause()
    asked = link(nc).requests
    made = loop.submit(ensure_buckets(js, [SEAT], patience=30))
    wait_until(lambda: link(nc).requests >= asked + 2, what="asked, and asked again")
    nats_server.resume()
    assert made.result(30) == ["mesh-provisioner_seat"]
    # With no patience, the first silence is the answer.
    nats_server.pause()
    try:
        with pytest.raises(nats.errors.TimeoutError):
            loop.run(ensure_buckets(js, [PLACEMENT]), 10)
    finally:
        nats_server.resume()


def test_a_request_unanswered_while_connected_is_said_as_one_of_jetstreams_on_that_server(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    # nats-py reports a watch's consumer it could not make again (a stream without a leader during a cluster's
    # election) through the error callback: "did not answer in time: is the host reachable" misled, the seat working.
    async def report() -> None:
        await nc._error_cb(nats.errors.TimeoutError())

    with caplog.at_level(logging.WARNING, logger="mesh_provisioner.bus.connection"):
        loop.run(report(), 10)
    said = [r.getMessage() for r in caplog.records]
    host = nats_server.url.removeprefix("nats://")
    assert said == [f"a JetStream request on {host} was not answered in time (a stream without a leader, while a "
                    "cluster elects one, answers nothing); it is made again"], said


def test_a_connection_says_its_name_when_it_connects_and_when_it_closes(
    loop: EventLoopThread, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A process holds several (the seat's, its lease's, a load's): the log says which one came and went.
    with caplog.at_level(logging.INFO, logger="mesh_provisioner.bus.connection"):
        own = loop.run(connect([nats_server.url], name=LOAD_CONNECTION), 10)
        loop.run(own.close(), 10)
    said = [r.getMessage() for r in caplog.records]
    assert any(s.startswith("connected to NATS at ") and s.endswith(f" as {LOAD_CONNECTION}") for s in said), said
    assert f"the NATS connection {LOAD_CONNECTION} is closed" in said, said


def test_work_on_a_connection_closed_for_good_meanwhile_ends_at_once_not_at_its_timeout(
    loop: EventLoopThread, nc: Client
) -> None:
    # A flush or request nats-py sent before its connection closed for good is never answered: waited for as it is,
    # a seat whose connection is gone would wait its whole timeout before it could say so and exit.
    async def go() -> float:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(unless_closed(nc, never))
        await asyncio.sleep(0.05)
        began = time.monotonic()
        await nc.close()
        with pytest.raises(nats.errors.ConnectionClosedError):
            await asyncio.wait_for(waiting, 5)
        assert never.cancelled(), "the work is given up"
        return time.monotonic() - began

    assert loop.run(go(), 10) < 1.0
    with pytest.raises(nats.errors.ConnectionClosedError):
        loop.run(unless_closed(nc, asyncio.sleep(0)), 10)
