"""A partitioned seat's runtime (contract 8.1) on a real nats-server: shards taken while it starts."""

from __future__ import annotations

from seatbus import Bus, Seats, assert_fixed_point, seat_config, settle

from mesh_provisioner.contract import bound
from mesh_provisioner.rules.shards import shard_of

SHARDS = 2


def test_8_1_shards_taken_while_the_cache_loads_have_their_providers_entries_read_again(
    mesh: Bus, seats: Seats
) -> None:
    # Both nodes of the sample are in shard 1. The process holds shard 0 while its cache loads, so it keeps none of
    # their providers' entries (a partitioned process keeps its nodes' alone); shard 1 is taken before its actors start.
    assert {shard_of(n, SHARDS) for n in ("ace", "bee")} == {1}
    held = {0}
    asked: list[set[int]] = []

    def taken() -> set[int]:
        out = set() if 1 in held else {1}
        held.update(out)
        asked.append(out)
        return out

    sup = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, SHARDS) in held, taken=taken)
    settle(sup)
    assert asked == [{1}], "the runtime asks once, after its cache loaded, which shards were taken meanwhile"
    assert sup.view.get(bound("postgres"), "bee.webapp.postgres-database") is not None
    # Judged from the entries read again: a whole seat over the same bus writes nothing.
    sup.stop()
    assert_fixed_point(mesh)
