"""A partitioned seat's runtime (contract 8.1) on a real nats-server: what it keeps, composes and makes of the nodes
of the shards it holds, and of a shard it takes."""

from __future__ import annotations

from seatbus import Bus, Seats, assert_fixed_point, plans, provisions, seat_config, settle

from mesh_provisioner.contract import RESOLVED, WANTS, bound
from mesh_provisioner.rules.shards import shard_of


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


def test_8_1_a_shard_taken_is_composed_once_its_nodes_providers_entries_and_resolutions_are_read_again(
    mesh: Bus, seats: Seats
) -> None:
    # Of 3 shards, ace is in 0 and bee in 2. A process keeps in memory only its nodes' providers' entries and
    # resolutions (only their own node's composition reads them); from the moment it holds bee's shard it keeps bee's,
    # but those that came before are read again first, and bee is composed only then, once: composed before, its keys
    # would be judged from entries memory missed, and written wrong until then.
    shards = 3
    assert (shard_of("ace", shards), shard_of("bee", shards)) == (0, 2)
    mesh.put(RESOLVED, "ace.gitea", {"providers": {"postgres-database": "ace"}})
    mesh.put(RESOLVED, "bee.webapp", {"providers": {"postgres-database": "ace"}})
    held, ready = {0}, {0}
    sup = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) in held & ready,
                      holds=lambda node: shard_of(node, shards) in held)
    settle(sup)

    def kept(node: str) -> dict[str, list[str]]:
        return {state: keys for state in (RESOLVED, bound("postgres"), bound("gitea"))
                if (keys := [key for key in sup.view.keys(state) if key.startswith(f"{node}.")])}

    def composed() -> float:
        return float(sup.metrics.compositions._value.get())

    assert kept("ace") == {RESOLVED: ["ace.gitea"], bound("postgres"): ["ace.gitea.postgres-database.main"]}
    assert kept("bee") == {}, "another process's nodes' entries and resolutions are not kept"
    held.add(2)  # taken: kept from now on, not composed yet
    mesh.put(WANTS, "want.bee.reports", {"fp": "rp1", "removed": True})
    settle(sup)
    assert not [key for key in plans(mesh) if key.startswith("bee.")], "bee is composed before its entries are read"
    before = composed()
    sup.took(lambda node: shard_of(node, shards) == 2, lambda: ready.add(2))
    settle(sup)
    assert kept("bee") == {RESOLVED: ["bee.webapp"], bound("postgres"): ["bee.webapp.postgres-database"],
                           bound("gitea"): ["bee.webapp.forge-account"]}
    assert composed() - before == 1, "bee is composed once"
    sup.stop()
    assert_fixed_point(mesh)


def test_8_1_a_shared_credential_missing_when_its_nodes_shard_is_taken_is_made_though_only_this_processs_keys_need_it(
    mesh: Bus, seats: Seats
) -> None:
    # ace's writer composed ace and stopped before any key depended on ace's shared credential. A process holding bee's
    # shard writes bee's key, which depends on it, and cannot write it; then it takes ace's shard. ace's composition
    # writes nothing new, so nothing bee's composition reads changes and bee is not composed again: the credential is
    # made by ace's writer from bee's key all the same (rules/node.py `shared_credential`), as a whole seat has it.
    shards = 3
    credential = "ace.postgres.postgres-database-credential"
    of_ace = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 0)
    settle(of_ace)
    of_ace.stop()
    held, ready = {2}, {2}
    sup = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) in held & ready,
                      holds=lambda node: shard_of(node, shards) in held)
    settle(sup)
    on_bus = provisions(mesh)
    assert credential in on_bus["bee.webapp.postgres-database"].depends_on and credential not in on_bus
    held.add(0)
    sup.took(lambda node: shard_of(node, shards) == 0, lambda: ready.add(0))
    settle(sup)
    made = provisions(mesh).get(credential)
    assert made is not None and made.state == "provided", made
    sup.stop()
    assert_fixed_point(mesh)
