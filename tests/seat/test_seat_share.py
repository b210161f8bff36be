"""A partitioned seat's process (contract 8.1) coming to hold its share.

Starting while another process still hands its share over, it waits a moment for the rest of it before it starts
composing, so that its nodes are read and composed from the start rather than taken once the runtime runs (read again
whole, composed late, and their consumers elsewhere composed twice). One whose reads of the bus make no headway goes
back to waiting for the seat, and holds its share again, rather than exiting; one whose start outlasts the time it
was given (`reconcile --timeout`) ends holding and says why."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import nats
import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import ensure_buckets, open_bucket
from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.cli.process import Interrupted
from mesh_provisioner.config import Config
from mesh_provisioner.contract import SEAT, SEAT_STATES
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.shards import member_key, shard_key
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.samples import sample_mesh
from mesh_provisioner.seat import LeaseKeeper, Seat

SHARDS = 4
LEASE = 10.0  # a look a second: the share waited for that long at most


@pytest.fixture
def bus(nats_server: NatsServer) -> Iterator[tuple[NatsServer, EventLoopThread]]:
    with EventLoopThread() as loop:
        loop.run(load_states(nats_server.url, sample_mesh()), 30)
        yield nats_server, loop


async def a_holds(server: NatsServer, shards: Iterable[int]) -> tuple[Client, KeyValue]:
    """Process "a" (no process of these tests: its keys alone) announced live, holding the shards; a connection and
    the lease bucket, to give them back."""
    nc = await nats.connect(server.url)
    await ensure_buckets(nc.jetstream(), SEAT_STATES, lease=LEASE)
    kv, _ = await open_bucket(nc.jetstream(), SEAT)
    a = r.encode(r.Lease(holder="a", pid=1, shards=SHARDS))
    await kv.put(member_key("a"), a)
    for shard in shards:
        await kv.put(shard_key(shard), a)
    return nc, kv


def process_b(server: NatsServer) -> Seat:
    """Process b: a seat of the mesh's shards, connected, holding none yet."""
    return Seat(Config(nats=server.url, lease_seconds=LEASE, shards=SHARDS))


@contextlib.contextmanager
def serving(seat: Seat) -> Iterator[threading.Thread]:
    """The seat serving (`Seat.serve`) on a thread of its own until the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=seat.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(30)


def test_8_1_a_process_whose_share_is_still_being_given_back_starts_composing_once_it_holds_all_of_it(
    bus: tuple[NatsServer, EventLoopThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, loop = bus
    # Process "a" (no process of this test: its keys alone) holds all 4 shards and is live: b's share is 2 and 3.
    nc, kv = loop.run(a_holds(server, range(SHARDS)), 30)
    started_with: list[list[int]] = []
    real = Runtime.start

    def start(config: Config, **options: Any) -> Runtime:
        started_with.append(held.lease.mine())  # type: ignore[attr-defined]
        return real(config, **options)

    monkeypatch.setattr(Runtime, "start", start)
    held = process_b(server)
    try:
        with serving(held):
            loop.run(kv.delete(shard_key(2)), 10)  # a gives shard 2 back first
            wait_until(lambda: held.lease.held, 30, 0.005, "b takes shard 2")
            assert held.lease.mine() == [2]  # type: ignore[attr-defined]
            loop.run(kv.delete(shard_key(3)), 10)  # then shard 3, b already holding
            wait_until(lambda: held.ready() == "", 30, 0.05, "b composes")
            assert started_with == [[2, 3]], "b began composing before it held its whole share"
    finally:
        loop.run(nc.close(), 10)


def test_8_1_a_process_whose_load_makes_no_headway_goes_back_to_waiting_and_holds_its_share_again(
    bus: tuple[NatsServer, EventLoopThread], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server, loop = bus
    # Process "a" (its keys alone) holds shards 0 and 1 and is live: b takes 2 and 3, then 0 and 1 once a has left. The
    # bus goes quiet (the load makes no headway: bus/cache.py `wait_loaded`) as b first starts, then as it reads the
    # shards it took: each time b goes back to waiting for the seat, and holds its share again, rather than exiting.
    nc, kv = loop.run(a_holds(server, (0, 1)), 30)
    started_with: list[list[int]] = []
    real_start, real_took = Runtime.start, Runtime.took
    stalled: list[str] = []

    def start(config: Config, **options: Any) -> Runtime:
        started_with.append(held.lease.mine())  # type: ignore[attr-defined]
        if not stalled:  # the first start: the bus goes quiet as the cache loads
            stalled.append("start")
            raise TimeoutError("the cache's load of mesh-controller.placement made no headway in 60 s")
        return real_start(config, **options)

    def took(runtime: Runtime, *args: Any, **options: Any) -> None:
        if stalled == ["start"]:  # the first shards taken while running: the bus goes quiet as their keys are read
            stalled.append("took")
            raise TimeoutError("the cache's load of mesh-provisioner.provisions made no headway in 60 s")
        real_took(runtime, *args, **options)

    monkeypatch.setattr(Runtime, "start", start)
    monkeypatch.setattr(Runtime, "took", took)
    held = process_b(server)

    async def a_leaves() -> None:
        await kv.delete(member_key("a"))
        for shard in (0, 1):
            await kv.delete(shard_key(shard))

    try:
        with serving(held) as thread:
            wait_until(lambda: held.ready() == "", 30, 0.05, "b composes its share")
            assert started_with == [[2, 3], [2, 3]]
            loop.run(a_leaves(), 10)
            wait_until(lambda: len(started_with) == 3 and held.ready() == "", 30, 0.05, "b holds every shard again")
            assert stalled == ["start", "took"]
            assert started_with[2] == [0, 1, 2, 3]
            assert thread.is_alive(), "the process ended when what it holds could not be read"
        said = [rec.getMessage() for rec in caplog.records if "back to waiting for the seat" in rec.getMessage()]
        assert len(said) == 2
        assert said[0].startswith("the seat could not start: the cache's load of mesh-controller.placement")
        assert said[1].startswith("the shards taken were not taken over: the cache's load of mesh-provisioner")
    finally:
        loop.run(nc.close(), 10)


@pytest.mark.parametrize("read", ["its first load", "the shards it took"])
def test_8_1_a_process_reading_what_it_holds_stops_as_soon_as_it_is_asked_to(
    bus: tuple[NatsServer, EventLoopThread], monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    server, loop = bus
    # Process "a" (its keys alone) holds shards 0 and 1 and leaves once b composes 2 and 3: b takes them over. Reading
    # what b holds (its cache's first load, or the keys of the shards it took, runtime.py `took`) never ends here; at
    # 100,000 nodes it takes minutes. A stop meanwhile (a host's, or the process's signal) ends holding at once, the
    # read cancelled, not once the read is done.
    nc, kv = loop.run(a_holds(server, (0, 1)), 30)
    reading = threading.Event()
    cancelled: list[bool] = []
    real_start, real_reload = Cache.start, Cache.reload

    async def forever() -> None:
        reading.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def start(cache: Cache) -> None:
        await real_start(cache)
        if read == "its first load":
            cache.wait_loaded = lambda *_, **__: forever()  # type: ignore[method-assign]

    async def reload(cache: Cache, states: Iterable[str], widening: bool = False, stall: float | None = None) -> None:
        if stall is None:  # not the read of shards taken
            return await real_reload(cache, states, widening, stall)
        await forever()

    monkeypatch.setattr(Cache, "start", start)
    monkeypatch.setattr(Cache, "reload", reload)
    held = process_b(server)
    stop = threading.Event()
    thread = threading.Thread(target=held.serve, args=(stop,), daemon=True)
    try:
        thread.start()
        if read == "the shards it took":
            wait_until(lambda: held.ready() == "", 30, 0.05, "b composes its share")
            loop.run(kv.delete(member_key("a")), 10)
            for shard in (0, 1):
                loop.run(kv.delete(shard_key(shard)), 10)
        assert reading.wait(30), f"b did not begin reading {read}"
        stop.set()
        thread.join(30)  # its actors stopped and its lease given back: seconds on a loaded machine, not the read's end
        assert not thread.is_alive(), f"b went on reading {read} after it was asked to stop"
        assert cancelled, f"reading {read} was not cancelled"
    finally:
        stop.set()
        thread.join(30)
        loop.run(nc.close(), 10)


class Signalled(threading.Event):
    """A stop that a signal sets (cli/process.py `Signals`) as soon as it is first waited on; with `raising`, the
    signal is raised there too (the handler raises where the main thread runs the package's own code)."""

    def __init__(self, raising: bool) -> None:
        super().__init__()
        self.raising = raising

    def wait(self, timeout: float | None = None) -> bool:
        self.set()
        if self.raising:
            raise Interrupted(signal.SIGTERM)
        return True


@pytest.mark.parametrize("raising", [False, True], ids=["stop set", "raised"])
def test_8_1_a_signal_while_a_process_waits_for_the_rest_of_its_share_stops_its_lease_keeper(
    bus: tuple[NatsServer, EventLoopThread], monkeypatch: pytest.MonkeyPatch, raising: bool
) -> None:
    server, loop = bus
    nc, kv = loop.run(a_holds(server, range(SHARDS)), 30)
    loop.run(kv.delete(shard_key(2)), 10)  # a gives shard 2 back, not yet 3: b waits for it
    keepers: list[LeaseKeeper] = []
    real = LeaseKeeper.start

    def start(keeper: LeaseKeeper) -> None:
        keepers.append(keeper)
        real(keeper)

    monkeypatch.setattr(LeaseKeeper, "start", start)
    held = process_b(server)
    started: list[Runtime | None] = []
    held.on_hold = started.append
    try:
        assert held.take(threading.Event(), 10)
        assert held.lease.mine() == [2] and held.lease.missing == 1  # type: ignore[attr-defined]
        if raising:
            with pytest.raises(Interrupted):
                held.hold(Signalled(raising))
        else:
            assert held.hold(Signalled(raising)) == ("", False)
        assert not started, "the actors started after the signal"
        assert len(keepers) == 1
        assert not keepers[0]._thread.is_alive(), "the lease is still renewed after the signal"
    finally:
        held.close()
        loop.run(nc.close(), 10)


def test_8_a_start_its_load_outlasts_the_time_it_was_given_ends_holding_and_says_so(
    bus: tuple[NatsServer, EventLoopThread]
) -> None:
    # `reconcile --timeout` bounds the whole, the cache's first load too, which otherwise goes on while it makes
    # headway.
    server, _ = bus
    held = process_b(server)
    try:
        assert held.take(threading.Event(), 10)
        why, gave_up = held.hold(threading.Event(), within=0)
        assert why.startswith("the seat could not start: ") and "did not finish within 0 s" in why
        assert not gave_up and held.supervisor is None
    finally:
        held.close()
