"""Contract section 7: every value the seat reads is untrusted; bad input is named, never fatal."""

from __future__ import annotations

import pytest
from mesh import NOW, Mesh, Woken, keeper, req, settle

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
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.keys import ask_raised_at
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import known_nodes
from mesh_provisioner.rules.retire import ask_of, decide
from mesh_provisioner.rules.view import not_a_node, not_nodes

KEY = "bee.app.postgres-database"
JUNK = b'{"fp": [1, {"x": null}], "modules": "none"'


def db_mesh() -> Mesh:
    """app on bee needs postgres on ace (judged by its entries); mesh-vault is not needed."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("app", "1", requires=["postgres-database"])
    m.module("tool", "1")
    m.place("ace", "postgres")
    m.place("bee", "app", "tool")
    m.want("bee", "app", "1")
    m.bound("postgres", KEY, state="provided")
    settle(m.view)
    return m


def test_7_bad_input_placement_is_a_problem_and_the_node_keeps_what_it_had() -> None:
    m = db_mesh()
    m.raw(PLACEMENT, "bee", JUNK)
    res = compose_node(m.view, "bee", NOW)
    assert res.writes == []
    [problem] = res.composed.problems
    assert problem.startswith("the placement of bee cannot be read: mesh-controller.placement bee does not decode: ")
    assert settle(m.view).writes == []
    assert m.states() == {KEY: "provided"}


def test_7_bad_input_want_holds_its_module_and_says_why() -> None:
    m = db_mesh()
    m.raw(WANTS, "want.bee.app", JUNK)
    res = compose_node(m.view, "bee", NOW)
    why = res.composed.modules_held["app"]
    assert why.startswith("its want cannot be read: mesh-assigner.wants want.bee.app does not decode: ")
    settle(m.view)
    assert m.refusal("bee.app").why == why
    assert m.states() == {KEY: "provided"}  # its plan and keys kept as they were
    assert m.view.get(PLANS, "bee.tool") is not None


def test_7_bad_input_module_registration_holds_its_module() -> None:
    m = db_mesh()
    m.raw(MODULES, "tool", JUNK)
    res = compose_node(m.view, "bee", NOW)
    assert res.composed.modules_held["tool"].startswith("mesh-indexer.modules tool does not decode: ")
    # A module with a want is composed at it, its registration aside; its newest build is said as a problem.
    m.raw(MODULES, "app", b'{"module": "app", "fp": 1}')
    res = compose_node(m.view, "bee", NOW)
    assert "app" not in res.composed.modules_held
    assert res.composed.problems == [
        "app at its newest build is not composed: mesh-indexer.modules app does not decode: "
        "Expected `str`, got `int` - at `$.fp`"
    ]


def test_7_bad_input_providers_registration_is_said_on_its_keys() -> None:
    m = db_mesh()
    m.raw(MODULES, "postgres", b"[]")
    assert rejudge(m.view, KEY, NOW).said == f"{KEY} asked"
    settled = settle(m.view)
    # No module provides it any more: app is held, its key kept and judged again.
    assert settled.report("bee").modules_held == {"app": "no placed module provides postgres-database"}
    assert settled.report("ace").modules_held == {
        "postgres": "mesh-indexer.modules postgres does not decode: Expected `object`, got `array`"
    }
    p = m.provision(KEY)
    assert (p.state, p.why) == (
        "asked",
        "the manifest of postgres cannot be read: mesh-indexer.modules postgres does not decode: "
        "Expected `object`, got `array`",
    )


def test_7_bad_input_providers_manifest_is_said_as_why() -> None:
    m = db_mesh()
    m.raw(MANIFESTS, "postgres-1", b'{"state": "bound"}')
    j = rejudge(m.view, KEY, NOW)
    assert j.said == f"{KEY} asked"
    m.view.put(PROVISIONS, KEY, j.writes[0].value, 10**9)  # type: ignore[union-attr]
    assert m.provision(KEY).why.startswith(
        "the manifest of postgres cannot be read: the manifest of postgres (postgres-1) does not parse: "
        "mesh-indexer.manifests postgres-1 does not decode: "
    )


def test_7_bad_input_manifest_holds_its_module() -> None:
    m = db_mesh()
    m.raw(MANIFESTS, "tool-1", b"\x00\x01")
    held = compose_node(m.view, "bee", NOW).composed.modules_held
    assert held["tool"].startswith("the manifest of tool (tool-1) does not parse: mesh-indexer.manifests tool-1 ")


def test_7_bad_input_build_holds_its_module() -> None:
    m = db_mesh()
    m.raw(BUILDS, "app.1", b'"app.1"')
    held = compose_node(m.view, "bee", NOW).composed.modules_held
    assert held == {"app": "mesh-builder.builds app.1 does not decode: Expected `object`, got `str`"}


def test_7_bad_input_have_is_said_on_the_keys_it_provides() -> None:
    m = Mesh()
    m.module("postgres", "1", provides=["postgres-database"])
    m.module("app", "1", requires=["postgres-database"])
    m.place("ace", "postgres")
    m.place("bee", "app")
    m.raw(HAVE, "ace.postgres", b'{"phase": 1}')
    settle(m.view)
    assert m.provision(KEY).why == (
        "the have of postgres on ace is not readable: node-engine.have ace.postgres does not decode: "
        "Expected `str`, got `int` - at `$.phase`"
    )


def test_7_bad_input_resolved_holds_the_module() -> None:
    m = db_mesh()
    m.raw(RESOLVED, "bee.app", b'{"providers": ["ace"]}')
    held = compose_node(m.view, "bee", NOW).composed.modules_held
    assert held["app"].startswith(
        "mesh-config.resolved bee.app cannot be read, so no provider is chosen: mesh-config.resolved bee.app "
        "does not decode: "
    )


def test_7_bad_input_bound_entry_is_said_as_why() -> None:
    m = db_mesh()
    m.raw(bound("postgres"), KEY, b'{"generation": "three"}')
    settle(m.view)
    p = m.provision(KEY)
    assert p.state == "asked"
    assert p.why.startswith(f"the provider's entry is not readable: postgres.bound {KEY} does not decode: ")


def test_7_bad_input_ask_record_is_said() -> None:
    m = db_mesh()
    m.place("bee", "tool")
    m.delete(WANTS, "want.bee.app")
    settle(m.view)
    p = m.provision(KEY)
    m.raw("asks.records", p.ask, b"{]")
    said = decide(m.view, KEY, NOW).said
    assert said.startswith(f"{KEY}: the router's record of {p.ask} is not readable: asks.records {p.ask} ")


def test_7_bad_input_own_states_undecodable_are_judged_again_or_left() -> None:
    m = db_mesh()
    m.raw(PROVISIONS, KEY, b"junk")
    m.raw(PLANS, "bee.app", b"junk")
    m.raw(REFUSED, "bee.tool", b"junk")
    m.raw(PROVISIONS, "bee.gone.x", b"junk")  # a key no composition needs
    settle(m.view)
    assert m.provision(KEY).state == "provided"
    assert m.plan("bee.app").module == "app"
    assert m.view.get(REFUSED, "bee.tool") is None
    assert m.view.get(PROVISIONS, "bee.gone.x").raw == b"junk"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("state", "key", "value"),
    [
        (PLACEMENT, "a.b", {"modules": [{"module": "app"}]}),
        (PLACEMENT, "bee", {"modules": [{"module": "a b"}, {"module": ""}, {"module": "tool"}]}),
        (WANTS, "want.bee", {"fp": "1"}),
        (WANTS, "want.bee.a b", {"fp": "1"}),
        (WANTS, "want.bee.tool", {"fp": "not a token"}),
        (HAVE, "bee.tool.x", {"fp": "1", "phase": "running", "health": "ok"}),
        (HAVE, "bee.tool", {"fp": "x.y", "phase": "running", "health": "ok"}),
        (MODULES, "a.b", {"module": "a.b", "fp": "1", "manifest": "a.b"}),
        (BUILDS, "tool", {"module": "tool", "fp": "", "manifest": ""}),
        (RESOLVED, "bee.app", {"providers": {"postgres-database": "a.b"}}),
        (bound("postgres"), "no key", {"state": "provided"}),
        (PROVISIONS, "bee", {"provision": "x", "state": "retiring", "ask": "retire-x-1"}),
        (PROVISIONS, "bee.app.x", {"provision": "x", "provider": {"module": "a.b", "node": ""}, "depends-on": ["..."]}),
    ],
)
def test_7_bad_input_keys_and_names_that_are_no_tokens_never_raise(state: str, key: str, value: object) -> None:
    m = db_mesh()
    m.put(state, key, value)
    settle(m.view)
    assert m.provision(KEY).state == "provided"


def test_7_bad_input_module_name_that_is_no_token_is_held_and_said() -> None:
    m = db_mesh()
    m.place("bee", "app", "tool", "a b")
    res = compose_node(m.view, "bee", NOW)
    assert res.composed.modules_held["a b"] == "'a b' is not a module name (a token)"
    assert "'a b' is not a token ([A-Za-z0-9_-]+)" in res.composed.problems


def test_7_bad_input_want_and_have_keys_that_are_no_keys_are_said() -> None:
    m = db_mesh()
    m.put(WANTS, "want.bee.a b", {"fp": "1"})
    m.put(HAVE, "bee.a b", {"fp": "1", "phase": "running", "health": "ok"})
    res = compose_node(m.view, "bee", NOW)
    assert res.composed.problems == [
        "the want want.bee.a b is ignored: 'want.bee.a b' is not a want key: 3 tokens joined by dots",
        "the have bee.a b is ignored: 'bee.a b' is not a have key: 1 or 2 tokens joined by dots",
    ]
    assert res.writes == []


@pytest.mark.parametrize("ask", ["retire-x-\u00b2", "retire-x-" + "9" * 5000, "retire-x-253402300800",
                                 "retire-x-99999999999999999999"])
def test_7_bad_input_ask_id_never_raises(ask: str) -> None:
    p = r.Provision(provision="pg", consumer=r.End("app", "bee"), provider=r.End("postgres", "ace"),
                    state="retiring", ask=ask)
    assert ask_of(KEY, p) is None
    assert ask_raised_at(ask) is None


# ---- the cases section 7 decides ----------------------------------------------------------------------------------


def vault_placed_under(*keys: str) -> Mesh:
    """gitea on ace needs postgres there with a credential of its own; mesh-vault is placed under each key."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    keeper(m, "mesh-vault", "secret")
    m.module("gitea", "1", requires=[req("postgres-database", "main", "own")])
    m.place("ace", "postgres", "gitea")
    for key in keys:
        m.place(key, "mesh-vault", "postgres")
    return m


@pytest.mark.parametrize("bad", ["0.bad", "", "a b"])
def test_7_a_placement_key_that_is_not_one_token_is_no_node(bad: str) -> None:
    m = vault_placed_under(bad, "bee")
    settle(m.view)
    # Never chosen as a provider, of a credential either: the vault is on bee, the only node that places it.
    assert m.provision("ace.gitea.postgres-database-credential.main").provider == r.End("mesh-vault", "bee")
    assert m.provision("ace.gitea.postgres-database.main").provider == r.End("postgres", "ace")
    # None of its modules is counted as placed, nor composed: no actor, no plan, no refusal, no key of its own.
    assert m.view.placed_on("mesh-vault") == ["bee"]
    assert m.view.placed_on("postgres") == ["ace", "bee"]
    assert "" not in known_nodes(m.view) and bad not in known_nodes(m.view) and "0" not in known_nodes(m.view)
    assert {k.node_of(key) for s in (PLANS, PROVISIONS, REFUSED) for key in m.view.keys(s)} <= {"ace", "bee"}
    res = compose_node(m.view, bad, NOW)
    assert res.writes == []
    assert res.composed.problems == [not_a_node(bad)]
    # Said, with why.
    assert not_nodes(m.view) == {bad: not_a_node(bad)}
    assert not_a_node(bad) == (
        f"the placement key {bad!r} is no node: a node is one token ([A-Za-z0-9_-]+), so none of the modules placed "
        "under it is composed, counted as placed or chosen as a provider"
    )
    assert not_a_node("bee") == ""
    # A change of it wakes nothing: nothing under it was ever placed.
    assert m.place(bad, "mesh-vault") == Woken()
    assert m.delete(PLACEMENT, bad) == Woken()


def test_7_a_placement_key_that_is_not_one_token_alone_places_no_vault() -> None:
    m = vault_placed_under("0.bad")
    settle(m.view)
    assert "ace.gitea.postgres-database-credential.main" not in m.states()
    assert m.view.placed_on("mesh-vault") == []


def test_7_a_want_that_does_not_decode_holds_its_module_with_key_and_why_in_refused() -> None:
    m = db_mesh()
    m.raw(WANTS, "want.bee.tool", JUNK)
    settle(m.view)
    why = m.refusal("bee.tool").why
    assert why.startswith("its want cannot be read: mesh-assigner.wants want.bee.tool does not decode: ")
    assert m.view.get(PLANS, "bee.tool") is not None  # its last plan kept as it was


@pytest.mark.parametrize("module", ["app", "tool"])
def test_7_a_resolved_value_that_does_not_decode_holds_its_module_with_key_and_why_in_refused(module: str) -> None:
    """Held whether or not the module needs a provider chosen (tool needs nothing): never composed on an input the
    seat could not read."""
    m = db_mesh()
    m.raw(RESOLVED, f"bee.{module}", b'{"providers": ["ace"]}')
    settle(m.view)
    why = m.refusal(f"bee.{module}").why
    assert why.startswith(
        f"mesh-config.resolved bee.{module} cannot be read, so no provider is chosen: mesh-config.resolved "
        f"bee.{module} does not decode: "
    )
    m.raw(RESOLVED, f"bee.{module}", b'{"providers": {}}')
    settle(m.view)
    assert m.view.get(REFUSED, f"bee.{module}") is None
