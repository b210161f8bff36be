"""Contract section 6: what a change wakes, by the read sets the judgments recorded (rules/reads.py), and that the
wakes bring the seat to its fixed point.

The section 6 table is the least a change wakes: for each row, every judgment it names is woken, or did not read what
changed, so that running it again writes nothing (`covers`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from mesh import Mesh, Woken, keeper, req, run, sample_mesh, settle, wake_settle

from mesh_provisioner.contract import (
    ASK_RECORDS,
    BUILDS,
    MANIFESTS,
    MODULES,
    PLANS,
    PROVISIONS,
    REFUSED,
    RESOLVED,
    WANTS,
    bound,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k


def mesh() -> Mesh:
    """ace: postgres (entries), redis (have), mesh-vault; bee: app needing both, one with its own credential;
    cat: web needing postgres with its shared credential. Settled."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    keeper(m, "mesh-vault", "secret")
    m.module("redis", "1", provides=["cache"])
    m.module("app", "1", requires=[req("postgres-database", "main", "own"), "cache"])
    m.module("web", "1", requires=[req("postgres-database", "", "shared")])
    m.place("ace", "postgres", "redis", "mesh-vault")
    m.place("bee", "app")
    m.place("cat", "web")
    settle(m.view)
    return m


def covers(m: Mesh, woken: Woken, nodes: set[str] = frozenset(), keys: set[str] = frozenset(),
           decide: set[str] = frozenset()) -> None:
    """A row of the table holds: each judgment it names is woken, or did not read what changed (run again now, it
    writes nothing)."""
    for kind, names, got in (("compose", nodes, woken.nodes), ("judge", keys, woken.keys),
                             ("look", decide, woken.decide)):
        for name in sorted(set(names) - got):
            writes, _, _ = run(m.view.copy(), (kind, name))
            assert writes == [], f"{kind} {name} is not woken, yet it would write {writes}"


def settles_by_wakes(m: Mesh, change: Callable[[Mesh], Woken]) -> None:
    """The wakes of a change, followed, leave nothing for a full round to do."""
    wake_settle(m.view, change(m))
    assert settle(m.view).rounds[0] == [], "a full round still writes after the wakes: a wake-up is missing"


# ---- the table, row by row --------------------------------------------------------------------------------------


def test_6_placement_wakes_its_node_and_the_nodes_needing_what_moved() -> None:
    m = mesh()
    assert m.place("dog").nodes == {"dog"}
    woken = m.place("ace", "postgres", "mesh-vault")  # redis goes: bee needs its cache
    assert woken.nodes == {"ace", "bee"}
    woken = m.place("dog", "redis")  # redis comes back elsewhere: bee needs it, and held nodes may
    assert woken.nodes >= {"dog", "bee"}


def test_6_placement_of_mesh_vault_wakes_every_node_with_a_credential() -> None:
    m = mesh()
    assert m.place("ace", "postgres", "redis").nodes == {"ace", "bee", "cat"}
    settle(m.view)
    assert m.place("dog", "mesh-vault").nodes >= {"bee", "cat", "dog"}


def test_6_want_wakes_its_node_and_the_keys_its_module_provides_there() -> None:
    m = mesh()
    # Every key woken is redis' on ace: ace's actor judges them together.
    covers(m, m.want("ace", "redis", "1"), nodes={"ace"}, keys={"bee.app.cache"})
    covers(m, m.want("bee", "app", "1"), nodes={"bee"})


def test_6_module_build_and_manifest_wake_where_it_is_placed_provides_and_is_needed() -> None:
    m = mesh()
    covers(m, m.register("redis", "1"), nodes={"ace", "bee"})
    covers(m, m.put(BUILDS, "redis.1", {"module": "redis", "fp": "1", "manifest": "redis-1"}), nodes={"ace", "bee"})
    # A manifest that no longer provides what another node needs.
    woken = m.put(MANIFESTS, "redis-1", {"name": "redis"})
    assert woken.nodes >= {"ace", "bee"}
    settle(m.view)
    # A module that now provides what a held module waits for.
    m.module("minio", "1")
    m.module("reports", "1", requires=["object-storage"])
    m.place("dog", "reports", "minio")
    settle(m.view)
    assert m.refusal("dog.reports").why == "no placed module provides object-storage"
    assert "dog" in m.put(MANIFESTS, "minio-1", {"name": "minio", "provides": ["object-storage"]}).nodes


def test_6_have_wakes_its_node_and_the_keys_its_module_provides_there() -> None:
    m = mesh()
    covers(m, m.have("ace", "redis", "1"), nodes={"ace"}, keys={"bee.app.cache"})
    covers(m, m.have("ace", "ace", "1"), nodes={"ace"})


def test_6_resolved_wakes_its_node() -> None:
    m = mesh()
    covers(m, m.put(RESOLVED, "bee.app", {"providers": {}}), nodes={"bee"})


def test_6_bound_entry_wakes_its_key() -> None:
    m = mesh()
    key = "bee.app.postgres-database.main"
    assert key in m.bound("postgres", key, state="provided").keys


def test_6_own_plan_wakes_the_nodes_its_module_provides_to() -> None:
    m = mesh()
    needs = r.Plan(provisions=(r.PlanProvision(provision="x", provider="ace", provider_module="y"),))
    woken = m.put(PLANS, "ace.redis", r.PlanRecord(node="ace", module="redis", plan=needs))
    assert "bee" in woken.nodes
    wake_settle(m.view, woken)
    covers(m, m.delete(PLANS, "ace.postgres"), nodes={"bee", "cat"})


def test_6_provision_state_wakes_the_keys_that_depend_on_it() -> None:
    m = mesh()
    cred = "bee.app.postgres-database-credential.main"
    woken = m.bound("mesh-vault", cred, state="failed", why="sealed")
    assert woken.keys == {cred}
    wake_settle(m.view, woken)
    assert m.provision(cred).state == "failed"
    before = m.view.get(PROVISIONS, cred)
    assert before is not None
    woken = m.another_writer(PROVISIONS, cred, before.raw.replace(b'"failed"', b'"provided"'))
    covers(m, woken, keys={"bee.app.postgres-database.main"})


def test_6_provision_state_wakes_its_dependents_on_other_nodes() -> None:
    m = mesh()
    (shared,) = {d for key in m.view.keys(PROVISIONS) if k.node_of(key) != "ace"
                 for d in m.view.get(PROVISIONS, key).get(r.Provision).depends_on if k.node_of(d) == "ace"}
    dependents = m.view.dependents(shared)
    assert {k.node_of(d) for d in dependents} - {"ace"}
    before = m.view.get(PROVISIONS, shared)
    assert before is not None and before.get(r.Provision) is not None
    woken = m.another_writer(PROVISIONS, shared, r.encode(r.Provision(provision="x", state="failed", why="w")))
    covers(m, woken, keys=dependents)


def test_6_provision_depends_on_or_deleted_wakes_the_nodes_it_names() -> None:
    m = mesh()
    key = "cat.web.postgres-database"
    before = m.view.get(PROVISIONS, key)
    assert before is not None
    woken = m.another_writer(PROVISIONS, key, r.encode(r.Provision(provision="postgres-database", state="asked")))
    covers(m, woken, nodes={"ace"})
    wake_settle(m.view, woken)
    covers(m, m.another_writer(PROVISIONS, key, None), nodes={"ace", "cat"})


def test_6_retiring_key_with_ask_and_its_record_wake_its_answer() -> None:
    m = mesh()
    woken = m.place("cat")
    wake_settle(m.view, woken)
    p = m.provision("cat.web.postgres-database")
    assert p.state == "retiring"
    assert m.put(ASK_RECORDS, p.ask, {"state": "open"}).decide == {"cat.web.postgres-database"}
    assert m.put(ASK_RECORDS, "retire-nobody-1", {"state": "open"}) == Woken()


def test_6_what_no_rule_reads_wakes_nothing() -> None:
    m = mesh()
    assert not m.put("mesh-provisioner.applied", "bee.app", {})
    assert not m.put(WANTS, "want.bee", {"fp": "1"})


def forged(m: Mesh, key: str, **changes: Any) -> dict[str, Any]:
    """A provision as it is, with some fields another writer changed."""
    p = m.view.get(PROVISIONS, key)
    assert p is not None and isinstance(p.value, r.Provision)
    return msgspec.to_builtins(msgspec.structs.replace(p.value, **changes))


def test_6_a_seat_state_another_writer_made_wakes_the_node_that_writes_it() -> None:
    m = mesh()
    key = "cat.web.postgres-database"
    woken = m.another_writer(PROVISIONS, key, forged(m, key, state=r.FAILED, why="forged"))
    assert "cat" in woken.nodes and key in woken.keys
    assert "cat" in m.another_writer(PLANS, "cat.web", {"node": "cat", "module": "web"}).nodes
    assert m.another_writer(REFUSED, "cat.web", {"node": "cat", "module": "web", "why": "forged"}).nodes == {"cat"}


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.another_writer(PROVISIONS, "cat.web.postgres-database",
                                   forged(m, "cat.web.postgres-database", state=r.FAILED, why="forged")),
        lambda m: m.another_writer(PROVISIONS, "bee.app.cache",
                                   forged(m, "bee.app.cache", state=r.FAILED, why="forged")),
        lambda m: m.another_writer(PROVISIONS, "bee.app.object-storage",
                                   forged(m, "bee.app.cache", provision="object-storage")),
        lambda m: m.another_writer(PROVISIONS, "dog.web.cache", forged(m, "bee.app.cache")),
        lambda m: m.another_writer(PROVISIONS, "bee.app.cache", None),
        lambda m: m.another_writer(PLANS, "cat.web", {"node": "cat", "module": "web"}),
        lambda m: m.another_writer(PLANS, "cat.web", None),
        lambda m: m.another_writer(REFUSED, "cat.web", {"node": "cat", "module": "web", "why": "forged"}),
    ],
    ids=["state-forged", "have-judged-state-forged", "key-made-on-a-node", "key-made-on-a-node-placed-nowhere",
         "key-deleted", "plan-forged", "plan-deleted", "refusal-made"],
)
def test_6_wakes_suffice_when_another_writer_changes_the_seats_own_states(change: Callable[[Mesh], Woken]) -> None:
    settles_by_wakes(mesh(), change)


# ---- the wakes suffice: after one change, following the wakes leaves the seat at its fixed point ----------------


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.place("bee"),
        lambda m: m.place("ace", "postgres", "mesh-vault"),
        lambda m: m.place("ace", "postgres", "redis"),
        lambda m: m.place("dog", "postgres"),
        lambda m: m.want("ace", "redis", "2"),
        lambda m: m.have("ace", "redis", "1"),
        lambda m: m.have("ace", "redis", "1", phase="failed", detail="oom"),
        lambda m: m.resolved("bee", "app", {"cache": "dog"}),
        lambda m: m.bound("mesh-vault", "bee.app.postgres-database-credential.main", state="provided"),
        lambda m: m.bound("mesh-vault", "ace.postgres.postgres-database-credential", state="waits", waits="a person"),
        lambda m: m.module("app", "2", requires=["cache"]),
        lambda m: m.module("redis", "2", provides=["cache"], state=["bound"], reads=[PLANS]),
        lambda m: m.put(MANIFESTS, "postgres-1", {"name": "postgres", "provides": ["postgres-database"]}),
        lambda m: m.delete(MODULES, "app"),
        lambda m: m.raw(BUILDS, "app.1", b"junk"),
        lambda m: m.raw(bound("postgres"), "cat.web.postgres-database", b"junk"),
    ],
    ids=["unplace-consumer", "unplace-have-provider", "unplace-vault", "second-provider", "want", "have-ok",
         "have-failed", "resolved", "vault-entry", "shared-credential-entry", "newer-consumer-build",
         "provider-turns-keeper", "provider-stops-keeping", "consumer-registration-gone", "build-junk", "entry-junk"],
)
def test_6_wakes_suffice(change: Callable[[Mesh], Woken]) -> None:
    settles_by_wakes(mesh(), change)


def test_6_wakes_suffice_for_the_sample_mesh() -> None:
    m = sample_mesh()
    settle(m.view)
    settles_by_wakes(m, lambda m: m.place("ace", "postgres", "gitea", "keycloak"))


def held_at_newest_only() -> Mesh:
    m = mesh()
    m.want("bee", "app", "1")
    m.module("app", "2", requires=["object-storage"])  # the newest build needs what no placed module provides
    m.module("minio", "1", provides=["object-storage"])
    settle(m.view)
    assert "bee.app.object-storage" not in m.states()
    return m


def held_consumer() -> Mesh:
    m = mesh()
    m.raw(MANIFESTS, "app-1", b"junk")  # app is held on bee: its keys are kept as they were
    settle(m.view)
    assert m.provision("bee.app.postgres-database.main").why.startswith("waits for postgres to answer")
    return m


def test_6_wakes_suffice_for_a_module_held_at_its_newest_build_only() -> None:
    m = held_at_newest_only()
    settles_by_wakes(m, lambda m: m.place("dog", "minio"))
    assert "bee.app.object-storage" in m.states()


def test_6_wakes_suffice_for_a_module_held_at_its_newest_build_only_when_a_provider_registers() -> None:
    m = held_at_newest_only()
    m.place("dog", "minio")
    m.delete(MODULES, "minio")
    settle(m.view)
    settles_by_wakes(m, lambda m: m.register("minio", "1"))
    assert "bee.app.object-storage" in m.states()


def test_6_wakes_suffice_for_a_held_modules_keys_when_their_providers_manifest_changes() -> None:
    m = held_consumer()
    # postgres no longer keeps its outcomes in its entries: app's key is judged by its have now.
    manifest = {"name": "postgres", "provides": ["postgres-database"]}
    settles_by_wakes(m, lambda m: m.put(MANIFESTS, "postgres-1", manifest))


def test_6_wakes_suffice_for_a_held_modules_keys_when_their_providers_registration_goes() -> None:
    m = mesh()
    # redis is no longer registered: app, which needs its cache, is held; its key is kept, and says why.
    settles_by_wakes(m, lambda m: m.delete(MODULES, "redis"))


def test_6_a_warrant_written_into_a_retiring_key_wakes_the_key() -> None:
    key = "bee.old.db"
    p = r.Provision(provision="db", consumer=r.End("old", "bee"), provider=r.End("pg", "ace"),
                    state="retiring", ask="retire-bee-old-db-1")
    answered = msgspec.structs.replace(p, warrant=r.ProvisionWarrant(ask=p.ask, option="yes", by="the operator"))
    m = Mesh()
    m.another_writer(PROVISIONS, key, p)
    assert key in m.another_writer(PROVISIONS, key, answered).keys
