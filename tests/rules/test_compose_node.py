"""Contract 5.2 (composing a node, `compose_node`) and section 4 (what the seat writes: keys, credentials,
depends-on)."""

from __future__ import annotations

import gc
import json
import types
from datetime import timedelta

import msgspec
from mesh import NOW, Mesh, apply, ask_id, keeper, req, sample_mesh, settle

from mesh_provisioner.contract import NEEDS, PLANS, PROVISIONS, REFUSED
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Delete, Put
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.node import compose_node
from mesh_provisioner.rules.retire import retire_needs
from mesh_provisioner.rules.writing import same

LATER = NOW + timedelta(hours=1)
UNIX = int(NOW.timestamp())


def db_mesh() -> Mesh:
    """`app` on bee needs a database of `postgres` on ace, which keeps its outcomes in its entries."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("app", "1", requires=["postgres-database"])
    m.place("ace", "postgres")
    m.place("bee", "app")
    return m


def written(res_writes: list[Put | Delete]) -> list[str]:
    return [f"{'-' if isinstance(w, Delete) else ''}{w.state} {w.key}" for w in res_writes]


# ---- 5.2: refusals, held modules, the two compositions, plans ----------------------------------------------------


def test_5_2_refused_written_and_deleted_once_composed() -> None:
    m = Mesh()
    m.module("app", "1", requires=["postgres-database"])
    m.place("bee", "app")
    res = compose_node(m.view, "bee", NOW)
    assert res.composed.modules_held == {"app": "no placed module provides postgres-database"}
    assert written(res.writes) == [f"{REFUSED} bee.app"]
    assert m.view.get(REFUSED, "bee.app") is None  # a rule only says what to write
    settle(m.view)
    assert m.view.get(REFUSED, "bee.app").raw == (  # type: ignore[union-attr]
        b'{"node":"bee","module":"app","why":"no placed module provides postgres-database",'
        b'"since":"2026-12-03T05:00:00Z"}'
    )
    # Held for the same reason later: not written again, `since` stays.
    assert settle(m.view, LATER).writes == []
    keeper(m, "postgres", "postgres-database")
    m.place("ace", "postgres")
    res = compose_node(m.view, "bee", LATER)
    assert res.composed.modules_held == {}
    assert f"-{REFUSED} bee.app" in written(res.writes)
    assert res.composed.plans_written == ["bee.app"]


def test_5_2_refusal_rewritten_when_why_changes() -> None:
    m = Mesh()
    m.module("app", "1", requires=["postgres-database"])
    m.place("bee", "app")
    settle(m.view)
    m.module("app", "2", requires=["object-storage"])
    settle(m.view, LATER)
    assert m.refusal("bee.app") == r.Refusal(
        node="bee", module="app", why="no placed module provides object-storage", since=LATER
    )


def test_5_2_held_module_keeps_last_plan_and_provisions() -> None:
    m = db_mesh()
    m.want("bee", "app", "1")
    settle(m.view)
    plan_before = m.view.get(PLANS, "bee.app")
    key_before = m.view.get(PROVISIONS, "bee.app.postgres-database")
    assert plan_before is not None and key_before is not None
    # Its only build's manifest breaks: held at its wanted build and at its newest.
    m.raw("mesh-indexer.manifests", "app-1", b"{not json")
    res = compose_node(m.view, "bee", LATER)
    assert set(res.composed.modules_held) == {"app"}
    assert res.composed.modules_held["app"].startswith("the manifest of app (app-1) does not parse: ")
    assert written(res.writes) == [f"{REFUSED} bee.app"]
    settle(m.view, LATER)
    assert m.view.get(PLANS, "bee.app") == plan_before
    assert m.view.get(PROVISIONS, "bee.app.postgres-database") == key_before


def test_5_2_held_at_wanted_build_only_keeps_its_plan_and_says_so() -> None:
    m = db_mesh()
    m.want("bee", "app", "1")
    settle(m.view)
    plan_before = m.view.get(PLANS, "bee.app")
    m.want("bee", "app", "9")  # a build the builder does not hold
    m.module("app", "2", requires=[])  # its newest needs nothing
    res = compose_node(m.view, "bee", LATER)
    assert res.composed.modules_held == {"app": "the builder holds no build app.9"}
    assert res.composed.plans_removed == []
    settle(m.view, LATER)
    assert m.view.get(PLANS, "bee.app") == plan_before
    assert m.refusal("bee.app").why == "the builder holds no build app.9"
    # Neither composition needs the key, and the held module's keys are left as they were.
    assert m.provision("bee.app.postgres-database").state == "asked"


def test_5_2_held_at_newest_build_only_is_a_problem_and_no_refusal() -> None:
    m = db_mesh()
    m.want("bee", "app", "1")
    m.module("app", "2", requires=["postgres-database", "object-storage"])
    res = compose_node(m.view, "bee", NOW)
    assert res.composed.modules_held == {}
    assert res.composed.problems == [
        "app at its newest build is not composed: no placed module provides object-storage"
    ]
    assert f"{REFUSED} bee.app" not in written(res.writes)
    assert res.composed.plans_written == ["bee.app"]


def test_5_2_composed_at_wanted_build_then_newest() -> None:
    m = db_mesh()
    keeper(m, "redis", "cache")
    m.place("ace", "postgres", "redis")
    m.want("bee", "app", "1")
    m.module("app", "2", requires=["postgres-database", "cache"])  # the newest build needs a cache too
    settle(m.view)
    # The plan is the wanted build's; the newest build's key is there before its want.
    assert m.plan("bee.app").plan.provisions == (
        r.PlanProvision(provision="postgres-database", provider="ace", provider_module="postgres"),
    )
    assert m.states() == {"bee.app.cache": "asked", "bee.app.postgres-database": "asked"}
    m.want("bee", "app", "2")
    settle(m.view)
    assert [p.provision for p in m.plan("bee.app").plan.provisions] == ["cache", "postgres-database"]


def test_5_2_module_with_no_want_composed_at_have_build() -> None:
    m = db_mesh()
    m.build("app", "0", requires=[])  # the build the node runs needs nothing
    m.have("bee", "app", "0")
    m.module("app", "2", requires=[])  # the newest needs nothing either
    settle(m.view)
    assert m.plan("bee.app").plan.provisions == ()
    # A want names the build, whatever the have says.
    m.want("bee", "app", "1")
    settle(m.view)
    assert [p.provision for p in m.plan("bee.app").plan.provisions] == ["postgres-database"]


def test_5_2_want_removed_or_without_fp_is_no_want() -> None:
    m = db_mesh()
    m.build("app", "0", requires=[])
    m.want("bee", "app", "0", removed=True)
    settle(m.view)
    assert [p.provision for p in m.plan("bee.app").plan.provisions] == ["postgres-database"]
    m.want("bee", "app", "")
    m.build("app", "0", requires=["object-storage"])
    settle(m.view)
    assert [p.provision for p in m.plan("bee.app").plan.provisions] == ["postgres-database"]
    assert m.view.get(REFUSED, "bee.app") is None


def test_5_2_wanted_module_not_placed_is_composed() -> None:
    m = db_mesh()
    m.module("tool", "1")
    m.want("bee", "tool", "1")
    settle(m.view)
    assert m.plan("bee.tool").plan.provisions == ()


def test_5_2_plan_unchanged_is_not_written_again() -> None:
    m = db_mesh()
    res = compose_node(m.view, "bee", NOW)
    plan = next(w for w in res.writes if w.state == PLANS)
    assert isinstance(plan, Put)
    assert plan.value == (
        b'{"node":"bee","module":"app","plan":{"provisions":'
        b'[{"provision":"postgres-database","provider":"ace","provider-module":"postgres"}]}}'
    )
    settle(m.view)
    res = compose_node(m.view, "bee", LATER)
    assert res.writes == [] and res.composed.plans_written == []
    # The same plan made from a manifest that lists things in another order is byte-identical.
    m.module("app", "3", requires=[req("postgres-database", "b"), req("postgres-database")])
    settle(m.view, LATER)
    before = m.view.get(PLANS, "bee.app")
    m.module("app", "4", requires=[req("postgres-database"), req("postgres-database", "b")])
    res = compose_node(m.view, "bee", LATER)
    assert res.composed.plans_written == []
    assert all(w.state != PLANS for w in res.writes)
    settle(m.view, LATER)
    assert m.view.get(PLANS, "bee.app") == before


def test_5_2_plans_of_modules_no_longer_composed_deleted() -> None:
    m = db_mesh()
    m.module("tool", "1")
    m.place("bee", "app", "tool")
    settle(m.view)
    m.place("bee", "app")
    res = compose_node(m.view, "bee", LATER)
    assert res.composed.plans_removed == ["bee.tool"]
    assert written(res.writes) == [f"-{PLANS} bee.tool"]


def test_5_2_unneeded_key_turns_retiring_and_the_operator_is_asked() -> None:
    m = db_mesh()
    settle(m.view)
    m.place("bee")
    res = compose_node(m.view, "bee", NOW)
    assert res.composed.plans_removed == ["bee.app"]
    assert res.composed.provisions_changed == ["bee.app.postgres-database retiring"]
    assert res.composed.retiring_asked == ["bee.app.postgres-database"]
    settle(m.view)
    p = m.provision("bee.app.postgres-database")
    assert p.state == "retiring"
    assert p.why == "no build wanted or placed on bee requires postgres-database of postgres on ace any more"
    assert p.ask == ask_id("bee.app.postgres-database", UNIX)
    assert p.warrant is None


def test_5_2_retiring_key_needed_again_returns_to_its_outcome() -> None:
    m = db_mesh()
    m.bound("postgres", "bee.app.postgres-database", state="provided")
    settle(m.view)
    m.place("bee")
    settle(m.view)
    assert m.provision("bee.app.postgres-database").state == "retiring"
    m.place("bee", "app")
    settle(m.view, LATER)
    p = m.provision("bee.app.postgres-database")
    assert (p.state, p.why, p.ask, p.warrant) == ("provided", "", "", None)


def test_5_2_composed_report_uses_the_seeds_field_names() -> None:
    report = r.Composed(node="ace", plans_written=["ace.a"], plans_removed=["ace.b"], provisions_changed=["x asked"],
                        retiring_asked=["y"], modules_held={"c": "why"}, problems=["p"])
    assert json.loads(r.encode(report)) == {
        "node": "ace", "plans-written": ["ace.a"], "plans-removed": ["ace.b"], "provisions-changed": ["x asked"],
        "retiring-asked": ["y"], "modules-held": {"c": "why"}, "problems": ["p"],
    }
    assert r.encode(r.Composed(node="ace")) == b'{"node":"ace"}'
    assert not r.Composed(node="ace", modules_held={"c": "why"})


# ---- section 4: credentials, depends-on -------------------------------------------------------------------------


def vault_mesh(form: str) -> Mesh:
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    keeper(m, "mesh-vault", "secret")
    m.module("gitea", "1", requires=[req("postgres-database", "main", form)])
    m.place("ace", "postgres", "gitea")
    m.place("bee", "mesh-vault")
    return m


def test_4_credential_own_key_and_shared_key() -> None:
    m = vault_mesh("own")
    settle(m.view)
    assert m.states() == {
        "ace.gitea.postgres-database-credential.main": "asked", "ace.gitea.postgres-database.main": "asked"
    }
    cred = m.provision("ace.gitea.postgres-database-credential.main")
    assert (cred.provision, cred.local, cred.consumer, cred.provider, cred.depends_on) == (
        "postgres-database-credential", "main", r.End("gitea", "ace"), r.End("mesh-vault", "bee"), ()
    )
    m = vault_mesh("shared")
    m.place("ace", "postgres")
    m.place("cat", "gitea")
    settle(m.view)
    assert m.states() == {
        "ace.postgres.postgres-database-credential": "asked", "cat.gitea.postgres-database.main": "asked"
    }
    cred = m.provision("ace.postgres.postgres-database-credential")
    assert (cred.provision, cred.local, cred.consumer, cred.provider) == (
        "postgres-database-credential", "", r.End("postgres", "ace"), r.End("mesh-vault", "bee")
    )


def test_4_credential_provided_by_vault_on_first_node_in_sorted_order() -> None:
    m = vault_mesh("own")
    m.place("dog", "mesh-vault")
    m.place("cat", "mesh-vault")
    m.place("bee")
    settle(m.view)
    assert m.provision("ace.gitea.postgres-database-credential.main").provider == r.End("mesh-vault", "cat")


def test_4_shared_credential_is_one_key_for_all_consumers() -> None:
    m = vault_mesh("shared")
    m.module("wiki", "1", requires=[req("postgres-database", "", "shared")])
    m.place("ace", "postgres")
    m.place("cat", "gitea")
    m.place("dog", "wiki")
    settle(m.view)
    assert m.states() == {
        "ace.postgres.postgres-database-credential": "asked",
        "cat.gitea.postgres-database.main": "asked",
        "dog.wiki.postgres-database": "asked",
    }
    assert m.provision("dog.wiki.postgres-database").depends_on == ("ace.postgres.postgres-database-credential",)


def test_4_depends_on_credential_first_then_provider_plan() -> None:
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    keeper(m, "redis", "cache")
    keeper(m, "mesh-vault", "secret")
    m.module("gitea", "1", requires=[req("postgres-database", "main", "own"), "cache"],
             provides=[{"name": "forge-account", "answered-by": "helper"}], state=["bound"], reads=[PLANS])
    m.module("webapp", "1", requires=[req("forge-account", "", "shared")])
    m.module("hook", "1", requires=["forge-account"])
    m.place("ace", "postgres", "redis", "gitea", "mesh-vault", "hook")
    m.place("bee", "webapp")
    settle(m.view)
    # Elsewhere: the provider's plan as `plans` keeps it, after the credential.
    assert m.provision("bee.webapp.forge-account").depends_on == (
        "ace.gitea.forge-account-credential", "ace.gitea.cache", "ace.gitea.postgres-database.main"
    )
    # On the provider's node: this composition's plan, in plan order.
    assert m.provision("ace.hook.forge-account").depends_on == ("ace.gitea.cache", "ace.gitea.postgres-database.main")
    # A provider with no plan (none in `plans`): only the credential.
    m.view.delete(PLANS, "ace.gitea")
    res = compose_node(m.view, "bee", NOW)
    [put] = [w for w in res.writes if w.key == "bee.webapp.forge-account"]
    assert isinstance(put, Put)
    assert msgspec.json.decode(put.value, type=r.Provision).depends_on == ("ace.gitea.forge-account-credential",)


def test_4_depends_on_follows_the_plan_kept_in_plans_for_a_provider_elsewhere() -> None:
    m = Mesh()
    m.module("gitea", "1", provides=["forge-account"])
    m.module("webapp", "1", requires=["forge-account"])
    m.place("ace", "gitea")
    m.place("bee", "webapp")
    kept = r.PlanRecord(node="ace", module="gitea", plan=r.Plan(provisions=(
        r.PlanProvision(provision="zz", local="x", provider="cat", provider_module="q"),
    )))
    m.put(PLANS, "ace.gitea", kept)
    res = compose_node(m.view, "bee", NOW)
    [put] = [w for w in res.writes if w.key == "bee.webapp.forge-account"]
    assert isinstance(put, Put)
    assert msgspec.json.decode(put.value, type=r.Provision).depends_on == ("ace.gitea.zz.x",)


def test_4_no_vault_problem_and_no_key() -> None:
    m = vault_mesh("own")
    m.place("bee")
    m.module("postgres", "1", provides=["postgres-database"])  # judged by its have
    m.have("ace", "postgres", "1")
    res = compose_node(m.view, "ace", NOW)
    assert "no node runs mesh-vault, so the credential ace.gitea.postgres-database-credential.main has no provider" in (
        res.composed.problems
    )
    settle(m.view)
    assert m.states() == {"ace.gitea.postgres-database.main": "asked"}
    p = m.provision("ace.gitea.postgres-database.main")
    assert p.depends_on == ("ace.gitea.postgres-database-credential.main",)
    assert p.why == (
        "waits for ace.gitea.postgres-database-credential.main (not composed yet) before postgres on ace can provide it"
    )


def test_5_2_needed_credential_of_another_node_is_judged_there_too() -> None:
    m = vault_mesh("shared")
    m.place("ace", "postgres")
    m.place("cat", "gitea")
    m.bound("mesh-vault", "ace.postgres.postgres-database-credential", state="provided", vault_name="v/pg",
            generation=2)
    res = compose_node(m.view, "cat", NOW)
    assert written(res.writes) == [
        f"{PLANS} cat.gitea",
        f"{PROVISIONS} cat.gitea.postgres-database.main",
        f"{PROVISIONS} ace.postgres.postgres-database-credential",
    ]
    assert "ace.postgres.postgres-database-credential provided" in res.composed.provisions_changed
    settle(m.view)
    assert m.provision("ace.postgres.postgres-database-credential").reference == r.Reference(id="v/pg", generation=2)


def test_5_2_key_depended_on_by_other_node_stays_needed() -> None:
    m = vault_mesh("shared")
    m.place("ace", "postgres")
    m.place("cat", "gitea")
    settle(m.view)
    # ace needs nothing itself; its shared credential stays needed while cat's key depends on it.
    assert compose_node(m.view, "ace", LATER).writes == []
    assert m.provision("ace.postgres.postgres-database-credential").state == "asked"
    # A provider's own needs stay needed while a consumer elsewhere depends on them.
    m2 = Mesh()
    keeper(m2, "postgres", "postgres-database")
    m2.module("gitea", "1", requires=["postgres-database"], provides=["forge-account"])
    m2.module("webapp", "1", requires=["forge-account"])
    m2.place("ace", "postgres", "gitea")
    m2.place("bee", "webapp")
    settle(m2.view)
    assert m2.provision("bee.webapp.forge-account").depends_on == ("ace.gitea.postgres-database",)
    m2.module("gitea", "2", provides=["forge-account"])  # gitea's newest build needs no database ...
    m2.want("ace", "gitea", "2")
    res = compose_node(m2.view, "ace", LATER)
    assert res.composed.provisions_changed == []  # ... but bee's key still depends on its key
    settle(m2.view, LATER)
    assert m2.provision("bee.webapp.forge-account").depends_on == ()
    assert m2.provision("ace.gitea.postgres-database").state == "retiring"


def test_5_2_held_modules_keys_depended_on_elsewhere_are_not_retired() -> None:
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("gitea", "1", requires=["postgres-database"], provides=["forge-account"])
    m.module("webapp", "1", requires=["forge-account"])
    m.place("ace", "postgres", "gitea")
    m.place("bee", "webapp")
    settle(m.view)
    m.raw("mesh-indexer.manifests", "gitea-1", b"[]")  # gitea is held on ace, and is no provider any more
    settle(m.view, LATER)
    assert m.provision("ace.gitea.postgres-database").state == "asked"


# ---- section 4: what a provision is, and when it is written -----------------------------------------------------


def test_4_provision_written_exactly() -> None:
    m = vault_mesh("own")
    m.place("ace", "postgres", "gitea", "mesh-vault")
    m.place("bee")
    m.bound("postgres", "ace.gitea.postgres-database.main", state="provided", vault_name="vault/ace/gitea/pg",
            generation=3)
    settle(m.view)
    assert m.view.get(PROVISIONS, "ace.gitea.postgres-database.main").raw == (  # type: ignore[union-attr]
        b'{"provision":"postgres-database","local":"main","consumer":{"module":"gitea","node":"ace"},'
        b'"provider":{"module":"postgres","node":"ace"},"depends-on":["ace.gitea.postgres-database-credential.main"],'
        b'"state":"provided","reference":{"id":"vault/ace/gitea/pg","generation":3},"at":"2026-12-03T05:00:00Z","v":1}'
    )


def test_4_key_written_only_when_what_it_says_changes() -> None:
    m = vault_mesh("own")
    settle(m.view)
    before = {key: m.view.get(PROVISIONS, key) for key in m.states()}
    assert settle(m.view, LATER).writes == []
    assert {key: m.view.get(PROVISIONS, key) for key in m.states()} == before
    m.bound("mesh-vault", "ace.gitea.postgres-database-credential.main", state="failed", why="sealed")
    settled = settle(m.view, LATER)
    assert settled.written() == [f"{PROVISIONS} ace.gitea.postgres-database-credential.main"]
    assert m.provision("ace.gitea.postgres-database-credential.main").at == LATER


def test_4_provisions_same_ignores_at_and_v() -> None:
    a = r.Provision(provision="pg", consumer=r.End("app", "ace"), state="asked", why="w", at=NOW, v=1)
    assert same(a, msgspec.structs.replace(a, at=LATER, v=2))
    assert same(a, msgspec.structs.replace(a, at=None, v=0))
    for change in ({"state": "provided"}, {"why": "x"}, {"ask": "a"}, {"depends_on": ("k",)},
                   {"reference": r.Reference(id="v")}, {"local": "l"}, {"provider": r.End("p", "bee")},
                   {"warrant": r.ProvisionWarrant(option="yes")}):
        assert not same(a, msgspec.structs.replace(a, **change)), change


def test_4_needs_retired() -> None:
    view = MemoryView()
    view.put(NEEDS, "ace.app", b"{}", 4)
    view.put(NEEDS, "bee.x.y", b"junk", 9)
    view.put(PLANS, "ace.app", b"{}", 5)
    writes = retire_needs(view)
    assert sorted(writes, key=lambda w: w.key) == [Delete(NEEDS, "ace.app", 4), Delete(NEEDS, "bee.x.y", 9)]
    assert retire_needs(MemoryView()) == []


def test_4_requirement_named_like_a_credential_is_refused_and_the_seat_settles() -> None:
    """`db-credential` is the key of db's shared credential: a requirement of that name would share it."""
    m = Mesh()
    keeper(m, "mesh-vault", "secret")
    m.module("pg", "1", provides=["db"], requires=["db-credential"])
    m.module("kms", "1", provides=["db-credential"])
    m.module("app", "1", requires=[req("db", "", "shared")])
    m.place("ace", "mesh-vault")
    m.place("bee", "pg", "kms")
    m.place("cat", "app")
    settle(m.view)
    assert m.refusal("bee.pg").why == (
        "the manifest of pg is not usable: the requirement db-credential names a credential, which the vault "
        "provides to a requirement through its credential form (own or shared), never as a provision of its own"
    )
    assert m.provision("bee.pg.db-credential").provider == r.End("mesh-vault", "ace")


def test_5_sample_mesh_shows_every_state() -> None:
    m = sample_mesh()
    settled = settle(m.view)
    assert len(settled.rounds) == 2  # one round writes, the next finds nothing to do
    assert {key: (m.provision(key).state, m.provision(key).why) for key in m.states()} == {
        "ace.gitea.postgres-database-credential.main": ("provided", ""),
        "ace.gitea.postgres-database.main": ("provided", ""),
        "ace.postgres.postgres-database-credential": ("provided", ""),
        "bee.mailer.postgres-database-credential.mail": (
            "asked", "waits for mesh-vault to answer: its entries hold nothing for "
            "bee.mailer.postgres-database-credential.mail yet"),
        "bee.mailer.postgres-database.mail": (
            "asked",
            "waits for postgres to answer: its entries hold nothing for bee.mailer.postgres-database.mail yet",
        ),
        "bee.oldapp.postgres-database": (
            "retiring", "no build wanted or placed on bee requires postgres-database of postgres on ace any more"),
        "bee.webapp.forge-account": ("waits", "an administrator of the forge accepts the account"),
        "bee.webapp.oidc-client": ("provided", ""),
        "bee.webapp.postgres-database": ("failed", "the database quota of bee is used up"),
    }
    assert m.provision("ace.gitea.postgres-database.main").reference == r.Reference("vault/ace/gitea/pg", 3)
    assert m.provision("bee.webapp.forge-account").depends_on == ("ace.gitea.postgres-database.main",)
    assert m.provision("bee.oldapp.postgres-database").ask == ask_id("bee.oldapp.postgres-database", UNIX)
    assert m.refusal("bee.reports").why == "no placed module provides object-storage"
    assert sorted(m.view.keys(PLANS)) == ["ace.gitea", "ace.keycloak", "ace.mesh-vault", "ace.postgres", "bee.mailer",
                                          "bee.webapp"]


def test_5_2_writes_are_compare_and_set_on_the_revision_judged() -> None:
    m = db_mesh()
    first = compose_node(m.view, "bee", NOW)
    assert {(w.key, w.revision) for w in first.writes} == {("bee.app", 0), ("bee.app.postgres-database", 0)}
    settle(m.view)
    m.bound("postgres", "bee.app.postgres-database", state="provided")
    m.place("bee")
    res = compose_node(m.view, "bee", NOW)
    plan = m.view.get(PLANS, "bee.app")
    key = m.view.get(PROVISIONS, "bee.app.postgres-database")
    assert plan is not None and key is not None
    assert res.writes == [
        Delete(PLANS, "bee.app", plan.revision),
        Put(PROVISIONS, "bee.app.postgres-database", res.writes[1].value, key.revision),  # type: ignore[union-attr]
    ]


def test_4_credential_judged_first_is_seen_by_the_key_depending_on_it() -> None:
    m = Mesh()
    m.module("postgres", "1", provides=["postgres-database"])  # judged by its have
    keeper(m, "mesh-vault", "secret")
    m.module("gitea", "1", requires=[req("postgres-database", "main", "own")])
    m.place("ace", "postgres", "gitea", "mesh-vault")
    m.have("ace", "postgres", "1")
    m.bound("mesh-vault", "ace.gitea.postgres-database-credential.main", state="provided")
    res = compose_node(m.view, "ace", NOW)
    assert res.composed.provisions_changed == [
        "ace.gitea.postgres-database-credential.main provided",
        "ace.gitea.postgres-database.main provided",
    ]


def test_5_2_shared_credential_only_the_newest_build_names_lets_the_seat_settle() -> None:
    m = Mesh()
    m.module("redis", "1", provides=["cache"])
    keeper(m, "mesh-vault", "secret")
    m.build("app", "1", requires=["cache"])  # the wanted build needs a cache, no credential
    m.module("app", "2", requires=[req("cache", "", "shared")])  # the newest needs redis's shared credential too
    m.want("ace", "app", "1")
    m.place("ace", "app", "mesh-vault")
    m.place("cat", "redis")
    settle(m.view)
    assert settle(m.view, LATER).writes == []


def test_a_provision_written_again_in_the_same_state_is_reported_with_the_fields_that_changed() -> None:
    # bee composed before ace's plans exist, then after: its key depends on postgres's plan now, and still waits. The
    # report said `bee.app.postgres-database asked` twice, which read as the same composition made twice.
    m = Mesh()
    keeper(m, "mesh-vault", "secret")
    m.module("postgres", "1", provides=["postgres-database"], requires=["secret"])
    m.module("app", "1", requires=["postgres-database"])
    m.place("ace", "postgres", "mesh-vault")
    m.place("bee", "app")
    first = compose_node(m.view, "bee", NOW)
    assert "bee.app.postgres-database asked" in first.composed.provisions_changed
    for w in first.writes:
        apply(m.view, w)
    for w in compose_node(m.view, "ace", NOW).writes:
        apply(m.view, w)
    again = compose_node(m.view, "bee", NOW)
    assert "bee.app.postgres-database asked (depends-on, why changed)" in again.composed.provisions_changed


def test_a_composition_leaves_no_reference_cycle_for_the_collector() -> None:
    # Each composition's garbage is freed as it goes, not by the collector: a seat process has young collections
    # come seldom (collector.py), and a cycle a composition made would hold its sets until one did.
    m = sample_mesh()
    settle(m.view)  # every key there, depending on its credentials: composing again judges them all
    nodes = sorted({k.split(".", 1)[0] for k in m.view.keys(PLANS)})
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for node in nodes:
            compose_node(m.view, node, LATER)
        gc.collect()
        # The package's functions among the garbage (a nested function in a cycle of its own, as that one was):
        # other threads of the test session may leave cycles of their own meanwhile.
        left = [o.__qualname__ for o in gc.garbage
                if isinstance(o, types.FunctionType) and o.__module__.startswith("mesh_provisioner")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert nodes and left == []
