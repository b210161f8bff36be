"""A partitioned seat's runtime (contract 8.1) on a real nats-server: shards taken while it starts."""

from __future__ import annotations

from seatbus import Bus, Seats, assert_fixed_point, provisions, seat_config, settle

from mesh_provisioner.contract import RESOLVED, bound
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


def test_8_1_a_shared_credential_only_another_processs_keys_depend_on_is_made_by_its_nodes_holder_at_its_start(
    mesh: Bus, seats: Seats
) -> None:
    # Of 3 shards, ace (postgres, mesh-vault) is in 0 and bee (webapp, needing postgres with its shared credential)
    # in 2. The process of bee's shard writes bee's key, which depends on ace's shared credential, and cannot write
    # that credential; the process of ace's shard, started after, finds the key on the bus: no change wakes anything
    # there, and its start makes the credential.
    shards = 3
    assert (shard_of("ace", shards), shard_of("bee", shards)) == (0, 2)
    credential = "ace.postgres.postgres-database-credential"
    of_bee = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 2)
    settle(of_bee)
    on_bus = provisions(mesh)
    assert credential in on_bus["bee.webapp.postgres-database"].depends_on and credential not in on_bus
    of_bee.stop()
    of_ace = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 0)
    settle(of_ace)
    made = provisions(mesh).get(credential)
    assert made is not None and made.state == "provided", made
    # Both halves served again, the bus ends where a whole seat would.
    of_bee = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 2)
    settle(of_bee)
    settle(of_ace)
    of_bee.stop()
    of_ace.stop()
    assert_fixed_point(mesh)


def test_8_1_a_process_keeps_only_its_nodes_providers_entries_and_resolutions_and_loads_those_of_shards_it_takes(
    mesh: Bus, seats: Seats
) -> None:
    # Only the composition of their own node reads a node's providers' entries and mesh-config's resolutions.
    shards = 3
    mesh.put(RESOLVED, "ace.gitea", {"providers": {"postgres-database": "ace"}})
    mesh.put(RESOLVED, "bee.webapp", {"providers": {"postgres-database": "ace"}})
    held = {0}
    sup = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) in held)
    settle(sup)

    def kept(node: str) -> dict[str, list[str]]:
        return {state: keys for state in (RESOLVED, bound("postgres"), bound("gitea"))
                if (keys := [key for key in sup.view.keys(state) if key.startswith(f"{node}.")])}

    assert kept("ace") == {RESOLVED: ["ace.gitea"], bound("postgres"): ["ace.gitea.postgres-database.main"]}
    assert kept("bee") == {}, "another process's nodes' entries and resolutions are not kept"
    held.add(2)
    sup.took(lambda node: shard_of(node, shards) == 2)
    settle(sup)
    assert kept("bee") == {RESOLVED: ["bee.webapp"], bound("postgres"): ["bee.webapp.postgres-database"],
                           bound("gitea"): ["bee.webapp.forge-account"]}
    sup.stop()
    assert_fixed_point(mesh)
