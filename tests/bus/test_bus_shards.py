"""A partitioned seat's leases on a real nats-server (contract 8.1): taken up to the fair share, given back when
another process joins, and every write checked against its key's shard's lease."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import nats.errors
import pytest
from helpers import wait_until
from nats.aio.client import Client

from mesh_provisioner.bus.connection import ensure_buckets
from mesh_provisioner.bus.lease import SeatLease, read_leases
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.shards import ShardLeases
from mesh_provisioner.bus.store import Store
from mesh_provisioner.contract import NEEDS, PLANS, PROVISIONS, REGISTRY, SEAT_STATES
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.shards import shard_key, shard_of

SHARDS = 4
LEASE = 2.0


def node_in(shard: int) -> str:
    """A node name in a shard."""
    return next(n for i in range(1000) if shard_of(n := f"n{i}", SHARDS) == shard)


def test_8_1_a_process_takes_every_free_shard_alone_and_gives_back_half_when_another_joins(
    loop: EventLoopThread, nc: Client
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    a, b = ShardLeases(nc, SHARDS, LEASE, holder="a"), ShardLeases(nc, SHARDS, LEASE, holder="b")
    assert loop.run(a.take(), 10)
    assert a.mine() == [0, 1, 2, 3] and a.taken() == {0, 1, 2, 3}
    assert not loop.run(b.take(), 10)  # announced, nothing free yet
    assert b.missing == 2, "its share is a's until a gives it back"
    assert loop.run(a.renew(), 10)  # a sees b and gives back past its share
    assert a.mine() == [0, 1]
    assert a.dropped() == {2, 3} and a.dropped() == set(), "memory lets go of what only 2's and 3's nodes read, once"
    assert loop.run(b.take(), 10)
    assert b.mine() == [2, 3] and b.taken() == {2, 3} and b.missing == 0
    assert a.holds(node_in(0)) and not a.holds(node_in(2)) and b.holds(node_in(3))
    loop.run(a.give_back(), 10)
    assert not a.held and a.dropped() == {0, 1}
    assert loop.run(b.renew(), 10)
    assert b.mine() == [0, 1, 2, 3], "a clean exit's shards are taken at the next look"


def test_8_1_a_process_composes_a_shards_nodes_once_told_they_are_read_and_again_only_once_told_after_a_new_take(
    loop: EventLoopThread, nc: Client
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    a, b = ShardLeases(nc, SHARDS, LEASE, holder="a"), ShardLeases(nc, SHARDS, LEASE, holder="b")
    assert loop.run(a.take(), 10)
    assert a.holds(node_in(2)) and not a.owns(node_in(2)), "held: kept from now on, composed once read"
    loop.run(a.ready({0, 1, 2, 3}), 10)
    assert not a.owns(node_in(2)), "not handed over yet (`taken`): not read yet either"
    assert a.taken() == {0, 1, 2, 3}
    loop.run(a.ready({0, 1, 2, 3}), 10)
    assert all(a.owns(node_in(s)) for s in range(SHARDS))
    loop.run(b.take(), 10)
    loop.run(a.renew(), 10)  # a gives 2 and 3 back to b
    loop.run(b.give_back(), 10)
    # a takes them again once their keys are deleted: what it kept of them may have missed changes meanwhile.
    wait_until(lambda: loop.run(a.renew(), 10) and a.mine() == [0, 1, 2, 3], 10, 0.05, "a takes 2 and 3 again")
    assert a.owns(node_in(0)) and a.holds(node_in(2)) and not a.owns(node_in(2))
    assert a.taken() == {2, 3}
    loop.run(a.ready({2, 3}), 10)
    assert a.owns(node_in(2))


def test_8_1_a_process_joining_or_leaving_moves_the_shares_at_once_without_waiting_for_a_look(
    loop: EventLoopThread, nc: Client
) -> None:
    # Neither process looks at the bucket after its first take (nothing calls `renew`): only its watch of the bucket
    # (`_follow`) moves the shares. Without it, processes started together split the shards a look (a second) apart.
    lease = 30.0
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=lease), 10)
    a, b = ShardLeases(nc, SHARDS, lease, holder="a"), ShardLeases(nc, SHARDS, lease, holder="b")
    assert loop.run(a.take(), 10) and a.mine() == [0, 1, 2, 3]
    loop.run(b.take(), 10)
    wait_until(lambda: a.mine() == [0, 1] and b.mine() == [2, 3], 5, what="the shares moved when b joined")
    loop.run(a.give_back(), 10)
    wait_until(lambda: b.mine() == [0, 1, 2, 3], 5, what="a clean exit's shards taken as they are freed")
    assert not a.held and a.mine() == [], "a process that gave its shards back takes none again"


def test_8_1_every_write_checks_its_shards_lease_and_the_registry_and_needs_go_with_shard_0(
    loop: EventLoopThread, nc: Client
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    a, b = ShardLeases(nc, SHARDS, LEASE, holder="a"), ShardLeases(nc, SHARDS, LEASE, holder="b")
    loop.run(a.take(), 10)
    loop.run(b.take(), 10)
    loop.run(a.renew(), 10)
    loop.run(b.take(), 10)
    store = Store(nc)
    store.guard = b.guard
    mine, theirs = node_in(2), node_in(0)
    made = loop.run(store.apply([Put(PLANS, f"{mine}.gitea", b"{}", 0)]), 10)
    assert made.ok and len(made.done) == 1
    refused = loop.run(store.apply([Put(PROVISIONS, f"{theirs}.gitea.db", b"{}", 0)]), 10)
    assert refused.done == [] and "does not hold shard 0" in refused.error
    for state in (REGISTRY, NEEDS):
        assert "shard 0" in b.guard(Put(state, "default", b"{}", 0))
        assert a.guard(Put(state, "default", b"{}", 0)) == ""
    a.lapse()
    assert "does not hold shard" in a.guard(Put(PLANS, f"{theirs}.gitea", b"{}", 0)), "a lapsed lease writes nothing"


def test_8_1_a_process_of_another_shard_count_is_said_and_not_counted_and_the_mesh_stays_composed(
    loop: EventLoopThread, nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    a, b = ShardLeases(nc, SHARDS, LEASE, holder="a"), ShardLeases(nc, 2 * SHARDS, LEASE, holder="b")
    assert loop.run(a.take(), 10)
    with caplog.at_level(logging.ERROR, logger="mesh_provisioner.bus"):
        assert not loop.run(b.take(), 10), "a process of another count takes nothing a process of this one holds"
        assert loop.run(a.renew(), 10)
    assert a.mine() == [0, 1, 2, 3], "the process of the other count is not counted: nothing is given to it"
    assert "holds shard.0 (--shards 4): this process takes no shard" in b.waiting_for(), "why it waits, said"
    assert "every shard is held by others" in ShardLeases(nc, SHARDS, LEASE, holder="c").waiting_for()
    said = [rec.getMessage() for rec in caplog.records]
    assert any("runs with --shards 4, this one with --shards 8" in m for m in said), said
    assert any("runs with --shards 8, this one with --shards 4" in m for m in said), said


def test_8_1_a_whole_seat_does_not_take_the_lease_while_a_partitioned_seat_holds_shards(
    loop: EventLoopThread, nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    # Started after the shards were taken, a `--shards 1` seat would have written every node beside their holders.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    a, whole = ShardLeases(nc, SHARDS, LEASE, holder="a"), SeatLease(nc, LEASE)
    assert loop.run(a.take(), 10)
    with caplog.at_level(logging.ERROR, logger="mesh_provisioner.bus"):
        assert not loop.run(whole.take(), 10)
        assert not loop.run(whole.take(), 10)
    said = [rec.getMessage() for rec in caplog.records]
    assert len(said) == 1, "said once"
    assert "holds shard.0 (--shards 4), this one with --shards 1" in said[0], said
    assert "holds shards of the seat (--shards 4): this process takes no lease" in whole.waiting_for()
    loop.run(a.give_back(), 10)
    assert loop.run(whole.take(), 10), "the shards given back, the whole seat is taken"


def test_8_1_a_shard_given_back_keeps_its_key_until_the_writes_sent_under_it_are_answered(
    loop: EventLoopThread, nc: Client
) -> None:
    # The writes go out on the seat's connection and the key's delete on the lease's, which the server does not
    # order: deleted at once, a key let another process take the shard while a write under it was still to be stored.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    a, b = ShardLeases(nc, SHARDS, LEASE, holder="a"), ShardLeases(nc, SHARDS, LEASE, holder="b")
    assert loop.run(a.take(), 10)
    assert a.taken() == {0, 1, 2, 3}
    in_flight = a.unanswered.sent([Put(PLANS, f"{node_in(2)}.gitea", b"{}", 0)])  # as the store counts a batch
    assert in_flight == [2]
    loop.run(b.take(), 10)
    assert loop.run(a.renew(), 10)
    assert a.mine() == [0, 1]
    assert "does not hold shard 2" in a.guard(Put(PLANS, f"{node_in(2)}.gitea", b"{}", 0)), "its writes stop at once"

    def holder_of(shard: int) -> str:
        lease = loop.run(read_leases(nc, LEASE), 10).get(shard_key(shard))
        return lease[0].holder if lease is not None else ""

    # b takes each shard as it is given back: it follows the bucket (`_follow`).
    wait_until(lambda: holder_of(3) == "b", 10, what="shard 3 given back, none of its writes in flight, and taken")
    assert holder_of(2) == "a", "shard 2's key stays while a write sent under it is unanswered"
    assert loop.run(a.renew(), 10) and a.mine() == [0, 1]
    assert a.taken() == set(), "a shard being given back is not taken back"
    a.unanswered.answered(in_flight)
    wait_until(lambda: holder_of(2) == "b", 10, what="shard 2 given back once its write was answered, and taken")
    assert loop.run(b.renew(), 10) and b.mine() == [2, 3]


def test_8_1_a_take_that_fails_is_raised_only_once_every_other_take_of_its_rebalance_has_ended(
    loop: EventLoopThread, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Free shards are taken all at once. Had the first failure been raised while another take ran on, that take would
    # change what is held after its rebalance was over, outside the lock every change of what is held is made under.
    loop.run(ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE), 10)
    real = ShardLeases._take
    gate: list[asyncio.Event] = []
    ended: list[int] = []

    async def take(leases: ShardLeases, kv: Any, shard: int) -> int | None:
        if not gate:
            gate.append(asyncio.Event())
        if shard == 0:  # fails at once, and lets the others go on a moment later
            asyncio.get_running_loop().call_later(0.05, gate[0].set)
            raise nats.errors.TimeoutError
        await gate[0].wait()
        got = await real(leases, kv, shard)
        ended.append(shard)
        return got

    monkeypatch.setattr(ShardLeases, "_take", take)
    a = ShardLeases(nc, SHARDS, LEASE, holder="a")

    async def take_all() -> tuple[list[int], list[int]]:
        with pytest.raises(nats.errors.TimeoutError):
            await a.take()
        return sorted(ended), a.mine()  # as the failure is raised

    assert loop.run(take_all(), 10) == ([1, 2, 3], [1, 2, 3])
