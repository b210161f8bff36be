"""Contract 5.3: a key's state comes from its provider's outcome alone (`outcome`, `have_outcome`, `keeps_entries`)."""

from __future__ import annotations

from typing import Any

import pytest
from mesh import NOW, Mesh, helper, keeper, req, settle

from mesh_provisioner.contract import HAVE, PLANS, PROVISIONS, bound
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.judge import have_outcome, keeps_entries_for, outcome
from mesh_provisioner.rules.node import rejudge

KEY = "bee.app.postgres-database"


def prov(module: str = "postgres", node: str = "ace", depends_on: tuple[str, ...] = (), **more: Any) -> r.Provision:
    """The key KEY: app on bee needs postgres-database of a module on a node."""
    return r.Provision(provision="postgres-database", consumer=r.End("app", "bee"), provider=r.End(module, node),
                       depends_on=depends_on, **more)


def said(p: r.Provision) -> tuple[str, str]:
    return p.state, p.why


@pytest.fixture
def keeps() -> Mesh:
    """postgres keeps its outcomes in its entries and reads the seat's plans."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    return m


# ---- a provider that keeps its outcome in its entries -----------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "state", "why"),
    [
        ({"state": "failed", "why": "the quota is used up", "refused": "no"}, "failed", "the quota is used up"),
        ({"state": "failed", "refused": "not for you"}, "failed", "not for you"),
        ({"state": "failed", "why": "  "}, "failed", "the provider said it failed"),
        ({"state": "waits", "why": "an admin accepts it", "waits": "x"}, "waits", "an admin accepts it"),
        ({"state": "waits", "waits": "a person signs"}, "waits", "a person signs"),
        ({"state": "waits"}, "waits", "the provider waits for a person"),
        ({"refused": "no such database"}, "failed", "no such database"),
        ({"waits": "the owner agrees"}, "waits", "the owner agrees"),
        ({"refused": "no", "waits": "yes"}, "failed", "no"),
        ({"state": "pending"}, "asked", "the provider's entry says pending, which no state of a provision is"),
        ({"state": "provided"}, "provided", ""),
        ({}, "provided", ""),
    ],
    ids=["failed-why", "failed-refused", "failed-default", "waits-why", "waits-waits", "waits-default",
         "refused-only", "waits-only", "refused-before-waits", "unknown-state", "provided", "empty-entry"],
)
def test_5_3_outcome_from_the_providers_entry(keeps: Mesh, entry: dict[str, Any], state: str, why: str) -> None:
    keeps.put(bound("postgres"), KEY, entry)
    assert said(outcome(keeps.view, KEY, prov())) == (state, why)


def test_5_3_provided_with_reference_from_vault_name_and_generation(keeps: Mesh) -> None:
    old = r.Reference(id="vault/old", generation=1)
    keeps.bound("postgres", KEY, state="provided", vault_name="vault/bee/app/pg", generation=3)
    assert outcome(keeps.view, KEY, prov(reference=old)).reference == r.Reference(id="vault/bee/app/pg", generation=3)
    keeps.bound("postgres", KEY, vault_name="vault/bee/app/pg")
    assert outcome(keeps.view, KEY, prov(reference=old)).reference == r.Reference(id="vault/bee/app/pg")
    keeps.bound("postgres", KEY, generation=4)
    assert outcome(keeps.view, KEY, prov(reference=old)).reference == r.Reference(generation=4)
    # An entry that names no reference keeps the one the key has.
    keeps.bound("postgres", KEY, state="provided")
    assert outcome(keeps.view, KEY, prov(reference=old)).reference == old
    keeps.bound("postgres", KEY, state="failed", vault_name="vault/x", generation=9)
    assert outcome(keeps.view, KEY, prov(reference=old)).reference == old


def test_5_3_outcome_clears_the_ask_and_the_warrant(keeps: Mesh) -> None:
    keeps.bound("postgres", KEY, state="provided")
    p = outcome(keeps.view, KEY, prov(state="retiring", ask="retire-x-1", warrant=r.ProvisionWarrant(option="no")))
    assert (p.state, p.ask, p.warrant) == ("provided", "", None)


def test_5_3_provider_outside_bound_reads_leaves_its_keys_asked() -> None:
    m = Mesh(bound_reads=["gitea"])
    keeper(m, "postgres", "postgres-database")
    m.bound("postgres", KEY, state="provided")
    assert said(outcome(m.view, KEY, prov())) == (
        "asked", "postgres keeps its outcome in its entries, which mesh-provisioner's manifest does not read yet"
    )


def test_5_3_unread_helper_manifest_says_its_helper_never_answers() -> None:
    m = Mesh()
    keeper(m, "postgres", "postgres-database", reads_plans=False)
    assert said(outcome(m.view, KEY, prov())) == (
        "asked",
        "postgres reads no plans of the seat (its manifest's reads do not name mesh-provisioner.plans), "
        "so its helper never answers this key",
    )


def test_5_3_not_answered_yet(keeps: Mesh) -> None:
    assert said(outcome(keeps.view, KEY, prov())) == (
        "asked", f"waits for postgres to answer: its entries hold nothing for {KEY} yet"
    )


def test_5_3_unreadable_entry_is_said(keeps: Mesh) -> None:
    keeps.raw(bound("postgres"), KEY, b'{"state": 3}')
    state, why = said(outcome(keeps.view, KEY, prov()))
    assert state == "asked"
    assert why.startswith(f"the provider's entry is not readable: postgres.bound {KEY} does not decode: ")


def test_5_3_providers_manifest_unreadable_is_said() -> None:
    m = Mesh()
    assert said(outcome(m.view, KEY, prov())) == (
        "asked", "the manifest of postgres cannot be read: the indexer holds no modules.postgres"
    )
    m.register("postgres", "1", "m-pg")
    assert said(outcome(m.view, KEY, prov())) == (
        "asked", "the manifest of postgres cannot be read: the indexer holds no manifest of postgres (m-pg)"
    )


def test_5_3_keeps_entries_per_helper_offer() -> None:
    gitea = r.Manifest(name="gitea", provides=(r.Offer("forge-account", "helper"), "npm-package-registry"),
                       state=("bound",))
    assert keeps_entries_for(gitea, "forge-account")
    assert not keeps_entries_for(gitea, "npm-package-registry")
    # A provider whose offers say nothing keeps every outcome in its entries; `bound` may be an object.
    assert keeps_entries_for(r.Manifest(provides=("a", "b"), state=(r.Named("bound"),)), "b")
    assert not keeps_entries_for(r.Manifest(provides=("a",), state=("repos",)), "a")
    # Judged per offer through the bus too.
    m = Mesh()
    m.module("gitea", "1", provides=[helper("forge-account"), "npm-package-registry"],
             state=["bound", {"name": "repos"}],
             reads=[PLANS])
    m.module("app", "1", requires=["forge-account", "npm-package-registry"])
    m.place("ace", "gitea")
    m.place("bee", "app")
    m.have("ace", "gitea", "1")
    m.bound("gitea", "bee.app.npm-package-registry", state="failed", why="this helper does not serve it")
    settle(m.view)
    assert m.states() == {"bee.app.forge-account": "asked", "bee.app.npm-package-registry": "provided"}
    assert m.provision("bee.app.forge-account").why == (
        "waits for gitea to answer: its entries hold nothing for bee.app.forge-account yet"
    )


# ---- a provider judged by its own have --------------------------------------------------------------------------


@pytest.fixture
def runs() -> Mesh:
    """postgres is judged by its have on ace; it is wanted at build 2."""
    m = Mesh()
    m.module("postgres", "2", provides=["postgres-database"])
    m.want("ace", "postgres", "2")
    return m


@pytest.mark.parametrize(
    ("have", "state", "why"),
    [
        ({"fp": "2", "phase": "running", "health": "ok"}, "provided", ""),
        ({"fp": "1", "phase": "running", "health": "ok"}, "asked",
         "waits for postgres on ace to run healthy at the build its want names (it is running, health ok)"),
        ({"fp": "2", "phase": "starting", "health": "unknown"}, "asked",
         "waits for postgres on ace to run healthy at the build its want names (it is starting, health unknown)"),
        ({"fp": "2", "phase": "stopped", "health": "ok"}, "asked",
         "waits for postgres on ace to run healthy at the build its want names (it is stopped, health ok)"),
        ({"fp": "2", "phase": "failed", "health": "unknown", "detail": "the disk is full"}, "failed",
         "the disk is full"),
        ({"fp": "2", "phase": "failed", "health": "unknown"}, "failed", "postgres on ace failed"),
        ({"fp": "2", "phase": "running", "health": "failed"}, "failed", "postgres on ace failed"),
        ({"fp": "1", "phase": "starting", "health": "failed", "detail": "crash loop"}, "failed", "crash loop"),
    ],
    ids=["running-ok-at-want", "running-ok-at-other-fp", "starting", "stopped", "failed-detail", "failed-default",
         "health-failed", "health-failed-elsewhere"],
)
def test_5_3_have_outcome(runs: Mesh, have: dict[str, str], state: str, why: str) -> None:
    runs.put(HAVE, "ace.postgres", have)
    assert said(outcome(runs.view, KEY, prov())) == (state, why)


def test_5_3_have_running_ok_with_no_want_is_provided_at_any_build(runs: Mesh) -> None:
    runs.have("ace", "postgres", "1")
    runs.want("ace", "postgres", "2", removed=True)
    assert said(have_outcome(runs.view, prov())) == ("provided", "")
    runs.delete("mesh-assigner.wants", "want.ace.postgres")
    assert said(have_outcome(runs.view, prov())) == ("provided", "")


def test_5_3_have_says_nothing_yet(runs: Mesh) -> None:
    assert said(have_outcome(runs.view, prov())) == ("asked", "waits for postgres on ace to run: it says nothing yet")


def test_5_3_have_unreadable(runs: Mesh) -> None:
    runs.raw(HAVE, "ace.postgres", b'{"phase": ["running"]}')
    state, why = said(have_outcome(runs.view, prov()))
    assert state == "asked"
    assert why.startswith(
        "the have of postgres on ace is not readable: node-engine.have ace.postgres does not decode: "
    )


def test_5_3_have_of_a_provider_that_is_no_key_is_said(runs: Mesh) -> None:
    state, why = said(have_outcome(runs.view, prov(node="a.b")))
    assert state == "asked"
    assert why.startswith("the have of postgres on a.b cannot be read: ")


def test_5_3_have_deps_not_provided(runs: Mesh) -> None:
    runs.have("ace", "postgres", "2")
    deps = ("bee.app.postgres-database-credential", "ace.postgres.x")
    p = prov(depends_on=deps)
    assert said(have_outcome(runs.view, p)) == (
        "asked",
        "waits for bee.app.postgres-database-credential (not composed yet) before postgres on ace can provide it",
    )
    runs.put(PROVISIONS, deps[0], prov(state="waits"))
    assert said(have_outcome(runs.view, p)) == (
        "asked", "waits for bee.app.postgres-database-credential (waits) before postgres on ace can provide it"
    )
    runs.put(PROVISIONS, deps[0], prov(state="provided"))
    runs.raw(PROVISIONS, deps[1], b"\xff")
    assert said(have_outcome(runs.view, p)) == (
        "asked", "waits for ace.postgres.x (not readable) before postgres on ace can provide it"
    )
    runs.put(PROVISIONS, deps[1], prov(state="provided"))
    assert said(have_outcome(runs.view, p)) == ("provided", "")
    # A failed have is said only once all it depends on is provided.
    runs.put(PROVISIONS, deps[1], prov(state="failed"))
    runs.have("ace", "postgres", "2", phase="failed")
    assert have_outcome(runs.view, p).state == "asked"


# ---- the whole of it --------------------------------------------------------------------------------------------


def test_5_3_seat_never_sets_provided_by_itself() -> None:
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    keeper(m, "mesh-vault", "secret")
    m.module("redis", "1", provides=["cache"])
    m.module("app", "1", requires=[req("postgres-database", "main", "own"), "cache"])
    m.place("ace", "postgres", "mesh-vault", "redis", "app")
    settle(m.view)
    assert set(m.states().values()) == {"asked"}
    assert all(m.provision(key).why for key in m.states())
    # Each answer turns only its own key.
    m.bound("mesh-vault", "ace.app.postgres-database-credential.main", state="provided")
    settle(m.view)
    assert m.states() == {
        "ace.app.cache": "asked",
        "ace.app.postgres-database-credential.main": "provided",
        "ace.app.postgres-database.main": "asked",
    }
    m.have("ace", "redis", "1")
    m.bound("postgres", "ace.app.postgres-database.main")
    settle(m.view)
    assert set(m.states().values()) == {"provided"}


def test_5_3_rejudge_sets_a_key_from_its_providers_outcome(keeps: Mesh) -> None:
    keeps.put(PROVISIONS, KEY, prov(state="asked", why="x"))
    keeps.bound("postgres", KEY, state="waits", waits="the owner agrees")
    j = rejudge(keeps.view, KEY, NOW)
    assert j.said == f"{KEY} waits"
    assert [(w.state, w.key) for w in j.writes] == [(PROVISIONS, KEY)]
    assert rejudge(keeps.view, "ace.none.x", NOW).writes == []
