"""The checks over a run's end state and its write history find what is planted in them (a check that cannot fail
proves nothing): a partitioned seat process on a real nats-server, its writes recorded and logged; the checks say
nothing of a clean run, then name a write by a process that does not hold the key's shard, and a write lost behind
the seat's back once it settled."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from faults.mesh import prepare
from faults.scenarios.sigkill import Processes
from faults.servers import server
from faults.spies import CasSpy
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.contract import DEFAULT_BOUND_READS, PLANS, PROVISIONS, REFUSED, bucket
from meshcheck import check, history
from meshcheck.bus import Bus, until

pytestmark = pytest.mark.slow

LEASE = 2.0
SHARDS = 8


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[EmbeddedServer]:
    s = server(tmp_path / "server").start()
    try:
        yield s
    finally:
        s.stop()


def settled(bus: Bus) -> bool:
    """The seat's states stopped moving and are what settle() of the bus's inputs says."""
    first = bus.last_seqs()
    return not check.settled_as(bus, DEFAULT_BOUND_READS)[1] and bus.last_seqs() == first


def test_the_write_history_and_settle_find_a_write_without_the_shard_and_a_lost_write(
    nats: EmbeddedServer, tmp_path: Path
) -> None:
    bus = Bus(nats.url)
    rogue = Bus(nats.url)
    procs = Processes(nats.url, tmp_path, lease=LEASE, more=("--shards", str(SHARDS)))
    try:
        prepare(bus)
        recorded = history.History(bus, lease_seconds=LEASE)
        seat = procs.start()
        until(lambda: settled(bus), 60, 0.25, "the seat process to settle")

        def found() -> list[str]:
            return history.check(recorded, [i for p in procs.writes for i in history.read_intents(p)] + spy.intents,
                                 shards=SHARDS)[1]

        spy = CasSpy()
        assert found() == []
        assert check.settled_as(bus, DEFAULT_BOUND_READS)[1] == []

        # A compare-and-set on a provision by another process (this one), while the seat process holds its shard.
        key = sorted(bus.entries(PROVISIONS))[0]
        spy.wrap(rogue.nc)

        async def forge() -> int:
            kv = await rogue.js.key_value(bucket(PROVISIONS))
            entry = await kv.get(key)
            return await kv.update(key, b'{"state": "provided"}', last=entry.revision)

        rogue.run(forge)
        until(lambda: settled(bus), 60, 0.25, "the seat process to write the key back")
        said = found()
        assert any(f"{key} (sequence" in p and f"by process {os.getpid()} while process {seat.pid} held it" in p
                   for p in said), said

        # The seat process stops (its shards given back), then a plan is deleted behind its back: lost.
        seat.send_signal(signal.SIGTERM)
        assert seat.wait(30) == 0
        plan = sorted(bus.entries(PLANS))[0]
        bus.delete(PLANS, plan)
        lost = check.settled_as(bus, DEFAULT_BOUND_READS)[1]
        assert any(p.startswith(f"against settle() of the final inputs: plan {plan}:") for p in lost), lost
        said = found()
        assert any(f"a delete of {PLANS} {plan}" in p and "was sent by no seat process" in p for p in said), said
        recorded.close()
    finally:
        procs.stop()
        rogue.close()
        bus.close()


def test_an_acknowledged_write_names_its_writer_where_two_processes_sent_the_same_compare_and_set() -> None:
    # A process killed with its create sent, and the key's next holder sending the same create: the server stored
    # one of them; its acknowledgement says whose.
    subject = "$KV.mesh-provisioner_refused.bee.gitea"
    stored_at = datetime(2026, 12, 4, 14, 0, 5, tzinfo=UTC)
    entry = history.Entry(REFUSED, "bee.gitea", subject, 1, stored_at, "put", b"{}")
    sent = [history.Intent(111, subject, 0, stored_at.timestamp() - 3), history.Intent(222, subject, 0,
                                                                                        stored_at.timestamp() - 0.01)]
    ambiguous = history.attribute([entry], sent)
    assert ambiguous.writes == [] and "cannot be told apart" in ambiguous.problems[0]
    acked = history.attribute([entry], [*sent, history.Intent(222, subject, 0, stored_at.timestamp(), 1)])
    assert acked.problems == [] and acked.writes == [(entry, 222)]
