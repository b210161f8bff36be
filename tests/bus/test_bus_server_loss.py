"""What the bus layer does when a server of a cluster goes: a watch whose consumer went with it, an answer that never
comes, a lease renewal in flight, a lease lapsed here while its key is still on the bus.

One server stands in for the cluster: a consumer deleted is a consumer lost with its server, and a frozen server
(SIGSTOP) is a leader that answers nothing until another is elected.
"""

from __future__ import annotations

import asyncio

from helpers import NatsServer, seed_buckets, wait_until
from nats.aio.client import Client
from nats.aio.msg import Msg

from mesh_provisioner.bus.acknowledgements import acks_of
from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import ensure_buckets, stream_of
from mesh_provisioner.bus.lease import SeatLease
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.shards import ShardLeases
from mesh_provisioner.bus.store import Store
from mesh_provisioner.contract import HOLDER_KEY, PLACEMENT, PLANS, SEAT, SEAT_STATES, bucket
from mesh_provisioner.messages.writes import Put

LEASE = 8.0


def sent(nc: Client) -> int:
    """Messages the client has sent so far."""
    return int(nc.stats["out_msgs"])


def test_a_watch_whose_consumer_went_with_its_server_hears_the_next_change_within_a_second_or_two(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client, other: Client
) -> None:
    # nats-py's default heartbeat (5 s) left such a watch blind for 10 to 15 s: two heartbeats missed, then made again.
    seed_buckets(nats_server.url, [PLACEMENT])
    cache = Cache(nc, states=[PLACEMENT])
    loop.run(cache.start(), 10)
    try:
        loop.run(cache.wait_synced(10), 15)
        consumer = cache._watchers[PLACEMENT].consumer
        assert consumer is not None
        loop.run(other.jetstream().delete_consumer(stream_of(PLACEMENT), consumer), 10)

        async def put() -> int:
            kv = await other.jetstream().key_value(bucket(PLACEMENT))
            return await kv.put("ace", b'{"node": "ace", "modules": []}')

        revision = loop.run(put(), 10)
        wait_until(lambda: (e := cache.view.get(PLACEMENT, "ace")) is not None and e.revision == revision, 3.0,
                   what="the change after the consumer was lost")
    finally:
        loop.run(cache.stop(), 10)


def test_a_message_whose_answer_never_comes_is_sent_again_and_the_second_answer_taken(
    loop: EventLoopThread, nc: Client, other: Client
) -> None:
    # A stream's leader that dies with a message in flight never answers it; the next leader answers it sent again.
    heard: list[Msg] = []

    async def answer_the_second(msg: Msg) -> None:
        heard.append(msg)
        if len(heard) > 1:
            await msg.respond(b'{"seq": 7}')

    loop.run(other.subscribe("leader.lost", cb=answer_the_second), 10)
    loop.run(other.flush(), 10)
    acks = acks_of(nc)
    (answer,), resent = loop.run(acks.publish([("leader.lost", b"x", {})], 8.0, resend=lambda i: True), 15)
    assert isinstance(answer, Msg) and answer.data == b'{"seq": 7}'
    assert resent == {0} and len(heard) >= 2


def test_a_message_is_not_sent_again_when_its_sender_says_no(
    loop: EventLoopThread, nc: Client, other: Client
) -> None:
    # The store says no once its lease lapsed (contract 8): nothing goes out again without it.
    heard: list[Msg] = []

    async def never_answer(msg: Msg) -> None:
        heard.append(msg)

    loop.run(other.subscribe("leader.lost", cb=never_answer), 10)
    loop.run(other.flush(), 10)
    (answer,), resent = loop.run(acks_of(nc).publish([("leader.lost", b"x", {})], 2.5, resend=lambda i: False), 10)
    assert isinstance(answer, TimeoutError)
    assert resent == set() and len(heard) == 1


def test_a_write_whose_first_sending_landed_unanswered_is_made_not_a_conflict(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client
) -> None:
    # Frozen, the server holds both sendings; woken, it makes the first and refuses the second's revision: the key then
    # holds this write's value at a later revision, and the write is made, with no judgment again for a conflict.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES), 10)
    store = Store(nc)
    assert loop.run(store.apply([Put(PLANS, "bee.gitea", b"{}", 0)]), 10).ok  # the bucket opened
    before = sent(nc)
    nats_server.pause()
    try:
        applying = asyncio.run_coroutine_threadsafe(store.apply([Put(PLANS, "ace.gitea", b'{"a": 1}', 0)]), loop.loop)
        wait_until(lambda: sent(nc) >= before + 2, 10, what="the write sent twice")
    finally:
        nats_server.resume()
    applied = applying.result(15)
    assert applied.ok, applied.error
    ((write, revision),) = applied.done
    assert write.key == "ace.gitea" and revision > 0
    assert store.resent == 1 and store.conflicts == 0


def test_8_a_renewal_unanswered_is_tried_again_while_the_lease_holds(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    lease = SeatLease(nc, LEASE)
    assert loop.run(lease.take(), 10)
    before = sent(nc)
    nats_server.pause()
    try:
        renewing = asyncio.run_coroutine_threadsafe(lease.renew(), loop.loop)
        wait_until(lambda: sent(nc) >= before + 2, 10, what="the renewal tried twice")
    finally:
        nats_server.resume()
    assert renewing.result(LEASE), "renewed once the server answered"
    assert lease.held
    current = loop.run(lease.current(), 10)
    assert current is not None and current.holder == lease.holder


def test_8_a_holder_whose_lease_lapsed_with_its_key_still_on_the_bus_takes_it_back_at_once(
    loop: EventLoopThread, nc: Client
) -> None:
    # Retaking by create failed on the process's own key: the seat waited for it to age out, writing nothing.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    lease, standby = SeatLease(nc, LEASE), SeatLease(nc, LEASE)
    assert loop.run(lease.take(), 10)
    lease.lapse()
    assert not lease.held
    assert not loop.run(standby.take(), 10), "the key is the holder's still: no one else takes it"
    assert loop.run(lease.take(), 10)
    assert lease.held


def test_8_1_shards_lapsed_here_with_their_keys_still_on_the_bus_are_taken_back(
    loop: EventLoopThread, nc: Client
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    leases = ShardLeases(nc, 4, LEASE, holder="a")
    assert loop.run(leases.take(), 10)
    assert leases.taken() == {0, 1, 2, 3}
    leases.lapse()
    assert not leases.held
    assert loop.run(leases.renew(), 10)
    assert leases.mine() == [0, 1, 2, 3] and leases.taken() == {0, 1, 2, 3}


def test_8_a_lease_lapsed_for_want_of_an_answer_is_not_over_and_the_next_renewal_holds_again(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client, other: Client
) -> None:
    # A cluster electing the lease stream's leader answers nothing for 5 to 10 s: the holder stops writing, but its
    # key is still its own, and holding goes on once a renewal is answered. Another's key ends it.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    lease = SeatLease(nc, LEASE)
    assert loop.run(lease.take(), 10)
    lease.lapse()  # as if the renewals met no answer until the lease's time here ran out
    nats_server.pause()
    try:
        assert not loop.run(lease.renew(), 10)
    finally:
        nats_server.resume()
    assert not lease.held and not lease.taken_over, "no answer: writes wait, holding is not over"
    lease.taken()
    assert loop.run(lease.renew(), 10) and lease.held, "answered, the key still its own: it holds again"
    assert lease.taken() == {0}, "held again, every node is composed anew: writes were refused meanwhile"

    async def take_over() -> None:
        kv = await other.jetstream().key_value(bucket(SEAT))
        await kv.put(HOLDER_KEY, b'{"holder": "another", "host": "elsewhere", "pid": 1}')

    loop.run(take_over(), 10)
    assert not loop.run(lease.renew(), 10)
    assert lease.taken_over, "another process's key: holding is over"


def test_a_bucket_opened_again_by_the_store_is_asked_for_again_when_its_request_was_lost(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client
) -> None:
    # On a cluster, a request about a stream whose leader was lost is never answered; one made again once another is
    # elected is. A write failed for want of a leader has its bucket opened again: asked once for the whole timeout, it
    # waited that long past the election (the fault runner's cluster scenario, one run in twenty). Here the request is
    # lost with a server killed while frozen, and the server started again stands for the new leader.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES), 10)
    store = Store(nc, timeout=10.0)
    nats_server.pause()
    try:
        before = sent(nc)
        applying = asyncio.run_coroutine_threadsafe(store.apply([Put(PLANS, "ace.gitea", b"{}", 0)]), loop.loop)
        wait_until(lambda: sent(nc) > before and nc.pending_data_size == 0, 10, what="the bucket asked for")
        nats_server.kill()
    finally:
        nats_server.resume()
    nats_server.start()
    applied = applying.result(30)
    assert applied.ok, applied.error
    assert [write.key for write, _ in applied.done] == ["ace.gitea"]
