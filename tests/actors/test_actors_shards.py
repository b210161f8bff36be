"""A partitioned seat's runtime (contract 8.1) on a real nats-server: what it keeps, composes and makes of the nodes
of the shards it holds, and of a shard it takes."""

from __future__ import annotations

import json

from nats.aio.msg import Msg
from seatbus import Bus, Seats, assert_fixed_point, plans, provisions, seat_config, settle

from mesh_provisioner.bus.connection import subject_of
from mesh_provisioner.contract import (
    BUILDS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    PLANS,
    PROVISIONS,
    REFUSED,
    RESOLVED,
    WANTS,
    bound,
)
from mesh_provisioner.rules.kept import CATALOGUE, kept_states
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
    assert not sup.holds_all(PROVISIONS, "bee"), "the verb reads bee's keys from the bus until they are read again"
    before = composed()
    sup.took(lambda node: shard_of(node, shards) == 2, lambda: ready.add(2))
    settle(sup)
    assert sup.holds_all(PROVISIONS, "bee") and not sup.holds_all(PROVISIONS)
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


def _place(mesh: Bus, node: str, module: str, manifest: dict[str, object]) -> None:
    """Place a module of its own manifest on a node, wanted and running healthy."""
    mesh.put(MANIFESTS, f"m-{module}", manifest)
    mesh.put(MODULES, module, {"module": module, "fp": "1", "manifest": f"m-{module}"})
    mesh.put(BUILDS, f"{module}.1", {"module": module, "fp": "1", "manifest": f"m-{module}"})
    placement = json.loads(mesh.get(PLACEMENT, node) or b"{}")
    mesh.put(PLACEMENT, node, {"node": node, "modules": [*placement["modules"], {"module": module}]})
    mesh.put(WANTS, f"want.{node}.{module}", {"fp": "1"})
    mesh.put(HAVE, f"{node}.{module}", {"fp": "1", "phase": "running", "health": "ok"})


def _held(sup: object, node: str) -> dict[str, list[str]]:
    """The keys of a node a seat's memory holds, by state, of the states a partitioned seat keeps in part."""
    view = sup.view  # type: ignore[attr-defined]
    return {state: keys for state in (PLANS, PROVISIONS, REFUSED, WANTS, HAVE)
            if (keys := sorted(k for k in view.keys(state) if k.split(".")[1 if state == WANTS else 0] == node))}


def test_8_1_a_process_keeps_of_another_nodes_keys_only_its_providers_modules_and_who_depends_on_its_own(
    mesh: Bus, seats: Seats
) -> None:
    # Of 3 shards, ace (the providers, and wiki, which provides nothing) is in 0, bee (the consumers) in 2. Each
    # process's judgments read of the other node only its providers' modules' keys (a consumer's depends-on names
    # them, 5.1) and the keys that depend on its own (who a shared credential is made from, 5.2): it keeps no more.
    shards = 3
    _place(mesh, "ace", "wiki", {"name": "wiki", "requires": [{"provision": "postgres-database", "local": "main"}]})
    of_ace = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 0)
    of_bee = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 2)
    settle(of_ace)
    settle(of_bee)
    settle(of_ace)
    assert "ace.wiki" in plans(mesh) and "ace.wiki.postgres-database.main" in provisions(mesh)
    ace = _held(of_bee, "ace")
    assert not [key for keys in ace.values() for key in keys if ".wiki" in key], ace
    assert "ace.gitea" in ace[PLANS] and "ace.gitea.postgres-database.main" in ace[PROVISIONS], \
        "a provider's plan and own keys, which its consumers' keys depend on, are kept"
    assert "ace.postgres" in ace[HAVE] and "want.ace.postgres" in ace[WANTS], "a provider's have and want are kept"
    assert REFUSED not in _held(of_ace, "bee"), "another node's refusals are not kept"
    # webapp's keys of postgres and of gitea depend on ace's (the shared credential, gitea's own database); its key
    # of keycloak, which needs nothing, does not.
    assert "bee.webapp.oidc-client" in provisions(mesh)
    assert _held(of_ace, "bee")[PROVISIONS] == ["bee.webapp.forge-account", "bee.webapp.postgres-database"], \
        "of another node's keys not a provider's, only those depending on this process's are kept"
    of_ace.stop()
    of_bee.stop()
    assert_fixed_point(mesh)


def test_8_1_a_process_giving_a_shard_back_lets_go_of_what_only_its_nodes_judgments_read(
    mesh: Bus, seats: Seats
) -> None:
    # Of 3 shards, ace is in 0 and bee in 2. A process holding both gives bee's shard back: memory then holds of every
    # state what a process started holding ace's shard alone holds, and nothing of bee's as deleted (taken again, bee's
    # keys are read again and composed from what they are).
    shards = 3
    _place(mesh, "ace", "wiki", {"name": "wiki", "requires": [{"provision": "postgres-database", "local": "main"}]})
    mesh.put(RESOLVED, "bee.webapp", {"providers": {"postgres-database": "ace"}})
    held = {0, 2}
    sup = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) in held)
    settle(sup)
    assert "bee.webapp.oidc-client" in provisions(mesh) and "ace.wiki.postgres-database.main" in provisions(mesh)
    alone = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 0)
    settle(alone)
    held.discard(2)
    sup.gave()

    def memory(seat: object) -> dict[str, dict[str, int]]:
        view = seat.view  # type: ignore[attr-defined]
        return {state: {key: entry.revision for key in view.keys(state) if (entry := view.get(state, key))}
                for state in (*kept_states(view.bound_reads), *CATALOGUE)}

    assert memory(sup) == memory(alone)
    kept_of_bee = ["bee.webapp.forge-account", "bee.webapp.postgres-database"]
    assert _held(sup, "bee")[PROVISIONS] == kept_of_bee, "of bee's keys, only those depending on ace's are kept"
    assert all(sup.cache.memory.held(PROVISIONS, key) == 0 for key in provisions(mesh)
               if key.startswith("bee.") and key not in kept_of_bee), "nothing let go is held as deleted"
    held.add(2)
    sup.took(lambda node: shard_of(node, shards) == 2)
    settle(sup)
    assert _held(sup, "bee")[PROVISIONS] == sorted(k for k in provisions(mesh) if k.startswith("bee."))
    alone.stop()
    sup.stop()
    assert_fixed_point(mesh)


def test_8_1_a_module_becoming_a_provider_has_its_keys_read_before_any_consumer_judges_them(
    mesh: Bus, seats: Seats
) -> None:
    # minio, on ace, provides nothing: bee's process keeps none of its keys. Its manifest then offers the
    # object-storage bee's reports requires: before bee's process sees that manifest, it reads minio's have again,
    # so that reports' key is judged provided at once, never "says nothing yet" from a have memory did not keep.
    shards = 3
    _place(mesh, "ace", "minio", {"name": "minio"})
    seen: list[bytes] = []
    key = "bee.reports.object-storage"

    async def watch() -> None:
        async def got(msg: Msg) -> None:
            seen.append(msg.data)
        await mesh.nc.subscribe(subject_of(PROVISIONS, key), cb=got)

    mesh.run(watch)
    of_ace = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 0)
    of_bee = seats.start(seat_config(mesh.url), owns=lambda node: shard_of(node, shards) == 2)
    settle(of_ace)
    settle(of_bee)
    assert mesh.refusal("bee.reports") is not None, "nothing provides what reports requires yet"
    assert HAVE not in _held(of_bee, "ace") or "ace.minio" not in _held(of_bee, "ace")[HAVE]
    mesh.put(MANIFESTS, "m-minio", {"name": "minio", "provides": ["object-storage"]})
    settle(of_ace)
    settle(of_bee)
    settle(of_ace)
    made = provisions(mesh).get(key)
    assert made is not None and made.state == "provided", made
    said = [json.loads(value).get("why", "") for value in seen if value]
    assert not [why for why in said if "says nothing yet" in why], said
    of_ace.stop()
    of_bee.stop()
    assert_fixed_point(mesh)
