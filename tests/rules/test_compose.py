"""Contract 5.1: composing a node's plans, `compose(view, node, kept_at)`."""

from __future__ import annotations

import pytest
from mesh import NOW, Mesh, helper, req

from mesh_provisioner.contract import PLACEMENT, REFUSED
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.compose import CannotCompose, compose
from mesh_provisioner.rules.node import compose_node


def pp(provision: str, provider: str, module: str, local: str = "", credential: str = "") -> r.PlanProvision:
    return r.PlanProvision(provision=provision, local=local, provider=provider, provider_module=module,
                           credential=credential)


def db_mesh() -> Mesh:
    """`app` needs a database; `postgres` and `pg-b` provide one; nothing is placed yet."""
    m = Mesh()
    m.module("app", "1", requires=["postgres-database"])
    m.module("postgres", "1", provides=["postgres-database"])
    m.module("pg-b", "1", provides=["postgres-database"])
    return m


def test_5_1_modules_composed_are_the_placed_and_every_module_kept_at_names() -> None:
    m = db_mesh()
    m.module("tool", "1")
    m.place("ace", "postgres", "app")
    c = compose(m.view, "ace", {"tool": "1"})
    assert sorted(c.plans) == ["app", "postgres", "tool"]
    assert c.held == {}
    assert compose(m.view, "ace", {}).plans.keys() == {"app", "postgres"}


def test_5_1_build_is_kept_at_else_registered() -> None:
    m = db_mesh()
    m.build("app", "0", requires=[])  # an older build that needed nothing
    m.place("ace", "postgres", "app")
    assert compose(m.view, "ace", {"app": "0"}).plans["app"] == r.Plan(provisions=())
    assert compose(m.view, "ace", {}).plans["app"] == r.Plan(provisions=(pp("postgres-database", "ace", "postgres"),))


def test_5_1_plan_sorted_by_provision_and_local_with_locals_and_credentials() -> None:
    m = Mesh()
    m.module("app", "1", requires=[req("pg", "zz", "own"), "cache", req("pg", "aa", "shared"), req("pg")])
    m.module("postgres", "1", provides=["pg"])
    m.module("redis", "1", provides=["cache"])
    m.place("ace", "app", "postgres", "redis")
    assert compose(m.view, "ace", {}).plans["app"].provisions == (
        pp("cache", "ace", "redis"),
        pp("pg", "ace", "postgres"),
        pp("pg", "ace", "postgres", local="aa", credential="shared"),
        pp("pg", "ace", "postgres", local="zz", credential="own"),
    )


def test_5_1_provider_resolved_node_wins() -> None:
    m = db_mesh()
    m.place("ace", "postgres")
    m.place("bee", "postgres", "app")
    m.resolved("bee", "app", {"postgres-database": "ace"})
    assert compose(m.view, "bee", {}).plans["app"].provisions == (pp("postgres-database", "ace", "postgres"),)


def test_5_1_provider_resolved_node_without_a_provider_there_is_passed_over() -> None:
    m = db_mesh()
    m.place("ace", "postgres")
    m.place("bee", "postgres", "app")
    m.place("cat")
    m.resolved("bee", "app", {"postgres-database": "cat"})
    assert compose(m.view, "bee", {}).plans["app"].provisions == (pp("postgres-database", "bee", "postgres"),)


def test_5_1_provider_on_the_consumers_own_node() -> None:
    m = db_mesh()
    m.place("ace", "postgres")
    m.place("bee", "postgres", "app")
    m.place("cat", "postgres")
    assert compose(m.view, "bee", {}).plans["app"].provisions == (pp("postgres-database", "bee", "postgres"),)


def test_5_1_provider_the_one_node_where_one_is_placed() -> None:
    m = db_mesh()
    m.place("ace", "postgres", "pg-b")
    m.place("bee", "app")
    assert compose(m.view, "bee", {}).plans["app"].provisions == (pp("postgres-database", "ace", "pg-b"),)


def test_5_1_two_providers_on_a_node_first_by_name() -> None:
    m = db_mesh()
    m.place("ace", "postgres", "pg-b", "app")
    assert compose(m.view, "ace", {}).plans["app"].provisions == (pp("postgres-database", "ace", "pg-b"),)


def test_5_1_held_when_no_placed_module_provides() -> None:
    m = db_mesh()  # postgres and pg-b provide it, but neither is placed
    m.place("ace", "app")
    c = compose(m.view, "ace", {})
    assert c.held == {"app": "no placed module provides postgres-database"}
    assert c.plans == {}


def test_5_1_held_names_every_requirement_without_a_provider() -> None:
    m = Mesh()
    m.module("app", "1", requires=["object-storage", "queue", req("queue", "b")])
    m.place("ace", "app")
    assert compose(m.view, "ace", {}).held == {
        "app": "no placed module provides object-storage; no placed module provides queue"
    }


def test_5_1_held_when_several_nodes_and_nothing_resolved_names_them() -> None:
    m = db_mesh()
    m.place("ace", "postgres")
    m.place("bee", "pg-b")
    m.place("cat", "app")
    c = compose(m.view, "cat", {})
    assert c.held == {
        "app": "postgres-database is provided on several nodes (ace, bee) and mesh-config resolves none for app on cat"
    }


def test_5_1_providers_are_those_whose_trunk_manifest_provides() -> None:
    m = Mesh()
    m.module("app", "1", requires=["postgres-database"])
    m.module("postgres", "2", provides=["postgres-database"])  # the trunk provides it ...
    m.build("postgres", "1")  # ... the build placed and wanted does not
    m.module("old-db", "2")  # the trunk no longer provides it ...
    m.build("old-db", "1", provides=["postgres-database"])  # ... an older build did
    m.place("ace", "postgres", "old-db")
    m.place("bee", "app")
    m.want("ace", "postgres", "1")
    m.want("ace", "old-db", "1")
    assert compose(m.view, "bee", {}).plans["app"].provisions == (pp("postgres-database", "ace", "postgres"),)


def test_5_1_held_missing_registration() -> None:
    m = Mesh()
    m.place("ace", "app")
    assert compose(m.view, "ace", {}).held == {
        "app": "the indexer registers no build of app: mesh-indexer.modules has no app"
    }


def test_5_1_kept_at_build_needs_no_registration() -> None:
    m = Mesh()
    m.build("app", "1")
    m.place("ace", "app")
    assert compose(m.view, "ace", {"app": "1"}).plans == {"app": r.Plan(provisions=())}


def test_5_1_held_missing_build_record() -> None:
    m = Mesh()
    m.register("app", "1")
    m.place("ace", "app")
    assert compose(m.view, "ace", {}).held == {"app": "the builder holds no build app.1"}
    assert compose(m.view, "ace", {"app": "7"}).held == {"app": "the builder holds no build app.7"}


def test_5_1_held_missing_manifest() -> None:
    m = Mesh()
    m.register("app", "1", "m-app")
    m.put("mesh-builder.builds", "app.1", {"module": "app", "fp": "1", "manifest": "m-app"})
    m.place("ace", "app")
    assert compose(m.view, "ace", {}).held == {"app": "the indexer holds no manifest of app (m-app)"}


def test_5_1_held_manifest_does_not_parse() -> None:
    m = Mesh()
    m.module("app", "1")
    m.raw("mesh-indexer.manifests", "app-1", b'{"name": "app", "requires": "postgres-database"}')
    m.place("ace", "app")
    why = compose(m.view, "ace", {}).held["app"]
    assert why.startswith("the manifest of app (app-1) does not parse: mesh-indexer.manifests app-1 does not decode: ")
    assert "$.requires" in why


def test_5_1_held_bad_credential_word() -> None:
    m = db_mesh()
    m.module("app", "1", requires=[req("postgres-database", "main", "mine")])
    m.place("ace", "app", "postgres")
    assert compose(m.view, "ace", {}).held == {
        "app": "the manifest of app is not usable: the requirement postgres-database says credential 'mine', "
        "which is neither own nor shared"
    }


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        (req("postgres.database"), "a requirement names 'postgres.database', which is not a provision (a token)"),
        (req(""), "a requirement names '', which is not a provision (a token)"),
        (req("pg", "a b"), "the requirement pg has local 'a b', which is not a token"),
    ],
)
def test_5_1_held_manifest_of_the_wrong_shape(requirement: dict[str, str], why: str) -> None:
    m = Mesh()
    m.module("app", "1", requires=[requirement])
    m.place("ace", "app")
    assert compose(m.view, "ace", {}).held == {"app": "the manifest of app is not usable: " + why}


def test_5_1_one_held_module_does_not_hold_the_others() -> None:
    m = db_mesh()
    m.module("mailer", "1", requires=["smtp"])
    m.place("ace", "app", "postgres", "mailer", "ghost")
    c = compose(m.view, "ace", {})
    assert sorted(c.plans) == ["app", "postgres"]
    assert c.held == {
        "ghost": "the indexer registers no build of ghost: mesh-indexer.modules has no ghost",
        "mailer": "no placed module provides smtp",
    }


def test_5_1_compose_fails_only_when_placement_unreadable() -> None:
    m = db_mesh()
    m.place("ace", "postgres", "app")
    m.raw(PLACEMENT, "bee", b'{"node": "bee", "modules": "app"}')
    # Another node's unreadable placement is not this node's failure.
    assert sorted(compose(m.view, "ace", {}).plans) == ["app", "postgres"]
    with pytest.raises(CannotCompose, match=r"^the placement of bee cannot be read: mesh-controller.placement bee "):
        compose(m.view, "bee", {})
    res = compose_node(m.view, "bee", NOW)
    assert res.writes == []
    assert len(res.composed.problems) == 1
    assert res.composed.problems[0].startswith("the placement of bee cannot be read: ")


def test_5_1_every_module_held_still_composes_the_node() -> None:
    m = Mesh()
    m.place("ace", "ghost")
    res = compose_node(m.view, "ace", NOW)
    assert res.composed.problems == []
    assert [(w.state, w.key) for w in res.writes] == [(REFUSED, "ace.ghost")]


def test_5_1_helper_offers_provide_like_any_other() -> None:
    m = Mesh()
    m.module("app", "1", requires=["forge-account"])
    m.module("gitea", "1", provides=[helper("forge-account")], state=["bound"])
    m.place("ace", "gitea")
    m.place("bee", "app")
    assert compose(m.view, "bee", {}).plans["app"].provisions == (pp("forge-account", "ace", "gitea"),)
