"""Serve reacts to every row of contract section 6, with no timer.

Each test makes a change as another module would, through a connection of its own, waits until the seat is settled
(every mailbox empty, no write in flight: nothing left that a timer could still do), and reads the seat's answer
from the bus. Then a fresh seat over the same bus must write nothing: a quiet seat off its fixed point has found a
missing wake-up.

The sample mesh (mesh_provisioner/samples/mesh.json): ace runs postgres, gitea, mesh-vault and keycloak; bee runs
webapp (postgres' shared credential, gitea's forge account, keycloak's oidc client), mailer (a database of its own)
and reports (held: nothing provides object-storage).
"""

from __future__ import annotations

from typing import Any

import msgspec
from seatbus import Bus, assert_fixed_point, settle

from mesh_provisioner.contract import BUILDS, HAVE, MANIFESTS, MODULES, PLACEMENT, PROVISIONS, RESOLVED, WANTS, bound
from mesh_provisioner.messages import records as r
from mesh_provisioner.runtime import Runtime

ACE = ["postgres", "gitea", "mesh-vault", "keycloak"]
BEE = ["webapp", "reports", "mailer"]


def placement(node: str, modules: list[str]) -> dict[str, Any]:
    return {"node": node, "modules": [{"module": m} for m in modules]}


def providers(bus: Bus, plan_key: str) -> dict[str, str]:
    """Each provision of a plan and its provider, as `module@node`."""
    plan = bus.plan(plan_key)
    assert plan is not None, f"no plan {plan_key}"
    return {p.provision: f"{p.provider_module}@{p.provider}" for p in plan.plan.provisions}


def state_of(bus: Bus, key: str) -> str:
    p = bus.provision(key)
    assert p is not None, f"no provision {key}"
    return p.state


def change(sup: Runtime, bus: Bus, state: str, key: str, value: dict[str, Any] | None) -> None:
    """Make one change as another module, then wait until the seat has done all it wakes."""
    bus.write(state, key, value)
    settle(sup)


# ---- mesh-controller.placement ----------------------------------------------------------------------------------


def test_placement_added_module_composes_its_node(sup: Runtime, mesh: Bus) -> None:
    assert mesh.plan("ace.mailer") is None
    change(sup, mesh, PLACEMENT, "ace", placement("ace", [*ACE, "mailer"]))
    assert providers(mesh, "ace.mailer") == {"postgres-database": "postgres@ace"}
    assert state_of(mesh, "ace.mailer.postgres-database.mail") == r.ASKED
    assert_fixed_point(mesh)


def test_placement_removed_module_loses_its_plan_and_its_keys_retire(sup: Runtime, mesh: Bus) -> None:
    # A module a want names is composed even where it is not placed (5.1, 1): its want goes first.
    change(sup, mesh, WANTS, "want.bee.mailer", {"fp": "", "removed": True})
    assert mesh.plan("bee.mailer") is not None
    change(sup, mesh, PLACEMENT, "bee", placement("bee", ["webapp", "reports"]))
    assert mesh.plan("bee.mailer") is None
    for key in ("bee.mailer.postgres-database.mail", "bee.mailer.postgres-database-credential.mail"):
        p = mesh.provision(key)
        assert p is not None and p.state == r.RETIRING and p.ask, key
    assert_fixed_point(mesh)


def test_placement_elsewhere_moves_the_provider_choice(sup: Runtime, mesh: Bus) -> None:
    assert providers(mesh, "bee.webapp")["oidc-client"] == "keycloak@ace"
    # keycloak placed on a second node: two candidates and nothing resolved holds webapp on bee (5.1, 3).
    change(sup, mesh, PLACEMENT, "cat", placement("cat", ["keycloak"]))
    held = mesh.refusal("bee.webapp")
    assert held is not None and "ace" in held.why and "cat" in held.why, held
    # keycloak gone from ace: the one node left is the provider, and bee's webapp composes again.
    change(sup, mesh, PLACEMENT, "ace", placement("ace", ["postgres", "gitea", "mesh-vault"]))
    assert mesh.refusal("bee.webapp") is None
    assert providers(mesh, "bee.webapp")["oidc-client"] == "keycloak@cat"
    p = mesh.provision("bee.webapp.oidc-client")
    assert p is not None and p.provider == r.End(module="keycloak", node="cat")
    assert_fixed_point(mesh)


def test_placement_of_mesh_vault_removed_and_added_wakes_every_node_with_a_credential(
    sup: Runtime, mesh: Bus
) -> None:
    cred = "bee.mailer.postgres-database-credential.mail"
    p = mesh.provision(cred)
    assert p is not None and p.provider == r.End(module="mesh-vault", node="ace") and p.state == r.ASKED
    change(sup, mesh, PLACEMENT, "ace", placement("ace", ["postgres", "gitea", "keycloak"]))
    # No node runs mesh-vault: the credential has no provider and is no longer needed.
    p = mesh.provision(cred)
    assert p is not None and p.state == r.RETIRING
    assert_fixed_point(mesh)
    # mesh-vault on a node of its own, which places nothing else bee's modules need.
    change(sup, mesh, PLACEMENT, "cat", placement("cat", ["mesh-vault"]))
    p = mesh.provision(cred)
    assert p is not None and p.provider == r.End(module="mesh-vault", node="cat") and p.state == r.ASKED
    assert_fixed_point(mesh)


# ---- mesh-assigner.wants ----------------------------------------------------------------------------------------


def test_wants_change_composes_that_node(sup: Runtime, mesh: Bus) -> None:
    change(sup, mesh, WANTS, "want.bee.mailer", {"fp": "ml9"})
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why, held
    assert mesh.plan("bee.mailer") is not None  # its last plan is kept (5.2)
    assert_fixed_point(mesh)
    change(sup, mesh, WANTS, "want.bee.mailer", {"fp": "ml1"})
    assert mesh.refusal("bee.mailer") is None
    assert_fixed_point(mesh)


# ---- mesh-indexer.modules, mesh-builder.builds, mesh-indexer.manifests ----------------------------------------


KEYCLOAK_S3 = {"name": "keycloak", "provides": ["oidc-client", "object-storage"]}
KEYCLOAK = {"name": "keycloak", "provides": ["oidc-client"]}


def test_modules_registration_now_providing_composes_the_nodes_waiting_for_it(sup: Runtime, mesh: Bus) -> None:
    assert mesh.refusal("bee.reports") is not None
    change(sup, mesh, MANIFESTS, "m-keycloak2", KEYCLOAK_S3)  # named by no module yet: wakes nothing
    change(sup, mesh, MODULES, "keycloak", {"module": "keycloak", "fp": "kc2", "manifest": "m-keycloak2"})
    assert mesh.refusal("bee.reports") is None
    assert providers(mesh, "bee.reports") == {"object-storage": "keycloak@ace"}
    assert_fixed_point(mesh)


def test_manifest_no_longer_providing_holds_the_nodes_needing_it(sup: Runtime, mesh: Bus) -> None:
    change(sup, mesh, MANIFESTS, "m-keycloak2", KEYCLOAK_S3)
    change(sup, mesh, MODULES, "keycloak", {"module": "keycloak", "fp": "kc2", "manifest": "m-keycloak2"})
    assert mesh.plan("bee.reports") is not None
    change(sup, mesh, MANIFESTS, "m-keycloak2", KEYCLOAK)
    held = mesh.refusal("bee.reports")
    assert held is not None and "object-storage" in held.why, held
    assert mesh.plan("bee.reports") is not None  # held at its wanted build: its last plan is kept (5.2)
    assert_fixed_point(mesh)


GITEA_OIDC = {
    "name": "gitea",
    "requires": [
        {"provision": "postgres-database", "local": "main", "credential": "own"},
        {"provision": "oidc-client"},
    ],
    "provides": [{"name": "forge-account", "answered-by": "helper"}, "npm-package-registry"],
    "state": ["bound", {"name": "repos"}],
    "reads": ["mesh-provisioner.plans"],
}


def test_build_record_naming_another_manifest_composes_the_nodes_the_module_is_on(sup: Runtime, mesh: Bus) -> None:
    change(sup, mesh, MANIFESTS, "m-gitea2", GITEA_OIDC)
    change(sup, mesh, BUILDS, "gitea.gt1", {"module": "gitea", "fp": "gt1", "manifest": "m-gitea2"})
    assert providers(mesh, "ace.gitea") == {"oidc-client": "keycloak@ace", "postgres-database": "postgres@ace"}
    assert state_of(mesh, "ace.gitea.oidc-client") == r.PROVIDED  # keycloak runs healthy at its want
    assert_fixed_point(mesh)


# ---- node-engine.have -------------------------------------------------------------------------------------------


def test_have_of_a_provider_judges_its_keys_on_other_nodes(sup: Runtime, mesh: Bus) -> None:
    assert state_of(mesh, "bee.webapp.oidc-client") == r.PROVIDED
    change(sup, mesh, HAVE, "ace.keycloak", {"fp": "kc1", "phase": "failed", "health": "failed", "detail": "oom"})
    p = mesh.provision("bee.webapp.oidc-client")
    assert p is not None and p.state == r.FAILED and p.why == "oom"
    assert_fixed_point(mesh)
    change(sup, mesh, HAVE, "ace.keycloak", {"fp": "kc1", "phase": "running", "health": "ok"})
    assert state_of(mesh, "bee.webapp.oidc-client") == r.PROVIDED
    assert_fixed_point(mesh)


def test_5_3_a_providers_have_judges_its_consumers_keys_and_composes_no_consumers_node(
    sup: Runtime, mesh: Bus
) -> None:
    # What a provider says sets its keys' state alone (5.3): the keys' own judgments take it; bee, whose webapp's key
    # keycloak provides, is not composed again for it (ace is: the have is of a module on ace, section 6).
    before = sup.metrics.compositions._value.get()
    change(sup, mesh, HAVE, "ace.keycloak", {"fp": "kc1", "phase": "failed", "health": "failed", "detail": "oom"})
    assert state_of(mesh, "bee.webapp.oidc-client") == r.FAILED
    assert sup.metrics.compositions._value.get() - before == 1
    assert_fixed_point(mesh)


def test_have_of_a_module_with_no_want_composes_it_at_that_build(sup: Runtime, mesh: Bus) -> None:
    # bee runs mailer at ml1 with no want: it is composed at the build its have names.
    change(sup, mesh, WANTS, "want.bee.mailer", {"fp": "", "removed": True})
    change(sup, mesh, HAVE, "bee.mailer", {"fp": "ml9", "phase": "running", "health": "ok"})
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why, held
    assert_fixed_point(mesh)


# ---- mesh-config.resolved ---------------------------------------------------------------------------------------


def test_resolved_choice_composes_that_node(sup: Runtime, mesh: Bus) -> None:
    change(sup, mesh, PLACEMENT, "cat", placement("cat", ["keycloak"]))
    assert mesh.refusal("bee.webapp") is not None
    change(sup, mesh, RESOLVED, "bee.webapp", {"providers": {"oidc-client": "cat"}})
    assert mesh.refusal("bee.webapp") is None
    assert providers(mesh, "bee.webapp")["oidc-client"] == "keycloak@cat"
    assert_fixed_point(mesh)
    change(sup, mesh, RESOLVED, "bee.webapp", {"providers": {"oidc-client": "ace"}})
    assert providers(mesh, "bee.webapp")["oidc-client"] == "keycloak@ace"
    assert_fixed_point(mesh)


# ---- <provider>.bound -------------------------------------------------------------------------------------------


def test_bound_entry_sets_that_keys_state(sup: Runtime, mesh: Bus) -> None:
    assert state_of(mesh, "bee.webapp.forge-account") == r.WAITS
    change(sup, mesh, bound("gitea"), "bee.webapp.forge-account", {"state": "provided", "vault-name": "v/forge"})
    p = mesh.provision("bee.webapp.forge-account")
    assert p is not None and p.state == r.PROVIDED and p.reference == r.Reference(id="v/forge")
    assert_fixed_point(mesh)
    change(sup, mesh, bound("postgres"), "bee.webapp.postgres-database", None)
    assert state_of(mesh, "bee.webapp.postgres-database") == r.ASKED
    assert_fixed_point(mesh)


# ---- the seat's own plan written or deleted ---------------------------------------------------------------------


def test_providers_plan_written_moves_its_consumers_depends_on(sup: Runtime, mesh: Bus) -> None:
    p = mesh.provision("bee.webapp.forge-account")
    assert p is not None and p.depends_on == ("ace.gitea.postgres-database.main",)
    # A build of gitea that needs an oidc client too; only ace's want names it, so only ace is woken by the
    # change: bee follows from gitea's plan on ace being written.
    change(sup, mesh, MANIFESTS, "m-gitea2", GITEA_OIDC)
    change(sup, mesh, BUILDS, "gitea.gt2", {"module": "gitea", "fp": "gt2", "manifest": "m-gitea2"})
    change(sup, mesh, WANTS, "want.ace.gitea", {"fp": "gt2"})
    p = mesh.provision("bee.webapp.forge-account")
    assert p is not None and p.depends_on == ("ace.gitea.oidc-client", "ace.gitea.postgres-database.main")
    assert_fixed_point(mesh)


# ---- a provision key's state ------------------------------------------------------------------------------------


def test_a_keys_state_judges_again_the_keys_depending_on_it(sup: Runtime, mesh: Bus) -> None:
    # ci on bee needs gitea's npm registry, which gitea answers by its have (not its helper): provided once all
    # the key depends on (gitea's own database on ace) is provided.
    change(sup, mesh, MANIFESTS, "m-ci", {"name": "ci", "requires": [{"provision": "npm-package-registry"}]})
    change(sup, mesh, BUILDS, "ci.c1", {"module": "ci", "fp": "c1", "manifest": "m-ci"})
    change(sup, mesh, MODULES, "ci", {"module": "ci", "fp": "c1", "manifest": "m-ci"})
    change(sup, mesh, WANTS, "want.bee.ci", {"fp": "c1"})
    change(sup, mesh, PLACEMENT, "bee", placement("bee", [*BEE, "ci"]))
    npm = "bee.ci.npm-package-registry"
    p = mesh.provision(npm)
    assert p is not None and p.depends_on == ("ace.gitea.postgres-database.main",) and p.state == r.PROVIDED
    assert_fixed_point(mesh)
    # postgres says gitea's database failed: that key fails, and the key depending on it is judged again.
    change(sup, mesh, bound("postgres"), "ace.gitea.postgres-database.main", {"state": "failed", "why": "disk full"})
    assert state_of(mesh, "ace.gitea.postgres-database.main") == r.FAILED
    p = mesh.provision(npm)
    assert p is not None and p.state == r.ASKED and "ace.gitea.postgres-database.main" in p.why, p
    assert_fixed_point(mesh)
    change(sup, mesh, bound("postgres"), "ace.gitea.postgres-database.main", {"state": "provided"})
    assert state_of(mesh, npm) == r.PROVIDED
    assert_fixed_point(mesh)


# ---- a provision's depends-on, or the provision deleted ---------------------------------------------------------

WEBAPP_OWN_DB = {
    "name": "webapp",
    "requires": [{"provision": "postgres-database"}, {"provision": "forge-account"}, {"provision": "oidc-client"}],
}


def test_depends_on_no_longer_naming_a_key_lets_its_node_retire_it(sup: Runtime, mesh: Bus) -> None:
    shared = "ace.postgres.postgres-database-credential"
    assert state_of(mesh, shared) == r.PROVIDED  # bee's webapp depends on postgres' shared credential
    # webapp's new build needs the database with no credential: nothing depends on the shared one any more, which
    # ace learns only from bee's key's depends-on changing.
    change(sup, mesh, MANIFESTS, "m-webapp2", WEBAPP_OWN_DB)
    change(sup, mesh, BUILDS, "webapp.wa2", {"module": "webapp", "fp": "wa2", "manifest": "m-webapp2"})
    change(sup, mesh, MODULES, "webapp", {"module": "webapp", "fp": "wa2", "manifest": "m-webapp2"})
    change(sup, mesh, WANTS, "want.bee.webapp", {"fp": "wa2"})
    p = mesh.provision("bee.webapp.postgres-database")
    assert p is not None and p.depends_on == ()
    p = mesh.provision(shared)
    assert p is not None and p.state == r.RETIRING and p.ask, p
    assert_fixed_point(mesh)


# ---- the seat's own states, written by another writer -------------------------------------------------------


def test_a_provision_state_another_writer_forged_is_judged_again_at_once(sup: Runtime, mesh: Bus) -> None:
    key = "bee.webapp.oidc-client"
    p = mesh.provision(key)
    assert p is not None and p.state == r.PROVIDED
    forged = msgspec.to_builtins(msgspec.structs.replace(p, state=r.FAILED, why="forged"))
    mesh.put(PROVISIONS, key, forged, validate=False)
    settle(sup)
    p = mesh.provision(key)
    assert p is not None and p.state == r.PROVIDED and p.why == "", p  # keycloak's word, not the forger's
    assert_fixed_point(mesh)


def test_a_provision_key_another_writer_made_is_composed_by_its_node_at_once(sup: Runtime, mesh: Bus) -> None:
    # bee's reports is held for want of object-storage (its composition leaves its keys as they are, but their state
    # follows their provider); cat is placed nowhere and has no actor yet (its composition retires what it holds).
    made = {"bee.reports.object-storage": r.ASKED, "cat.webapp.postgres-database": r.RETIRING}
    for key in made:
        node, module, provision = key.split(".")
        value = {"provision": provision, "state": "provided", "consumer": {"module": module, "node": node},
                 "provider": {"module": "postgres", "node": "ace"}}
        mesh.put(PROVISIONS, key, value, validate=False)
    settle(sup)
    assert {key: state_of(mesh, key) for key in made} == made
    assert_fixed_point(mesh)


# ---- asks.decided.mesh-provisioner ------------------------------------------------------------------------------


def test_decided_writes_the_warrant_and_the_key_retires_once_its_provider_let_go(sup: Runtime, mesh: Bus) -> None:
    key = "bee.oldapp.postgres-database"
    p = mesh.provision(key)
    assert p is not None and p.state == r.RETIRING and p.ask
    assert [msg_id for msg_id, _ in mesh.asks_published()] == [p.ask]
    # postgres keeps no entry for oldapp: once the operator approves, the key is retired (5.4).
    mesh.decide(key, p.ask, "yes")
    settle(sup)
    assert mesh.provision(key) is None
    assert_fixed_point(mesh)


def test_decided_then_provider_removing_its_entry_deletes_the_key_and_wakes_the_nodes_it_named(
    sup: Runtime, mesh: Bus
) -> None:
    key, shared = "bee.webapp.postgres-database", "ace.postgres.postgres-database-credential"
    change(sup, mesh, WANTS, "want.bee.webapp", {"fp": "", "removed": True})
    change(sup, mesh, HAVE, "bee.webapp", {"phase": "stopped", "health": "unknown"})
    change(sup, mesh, PLACEMENT, "bee", placement("bee", ["reports", "mailer"]))
    p = mesh.provision(key)
    assert p is not None and p.state == r.RETIRING and p.ask and p.depends_on == (shared,)
    # While the retiring key depends on postgres' shared credential, ace keeps it needed.
    assert state_of(mesh, shared) == r.PROVIDED
    assert p.ask in {msg_id for msg_id, _ in mesh.asks_published()}
    mesh.decide(key, p.ask, "yes")
    settle(sup)
    p = mesh.provision(key)
    assert p is not None and p.warrant is not None and p.warrant.option == "yes", p
    assert_fixed_point(mesh)
    # postgres removes its entry on the warrant: the key goes, and ace, named by its depends-on, retires the
    # shared credential nothing depends on any more.
    change(sup, mesh, bound("postgres"), key, None)
    assert mesh.provision(key) is None
    p = mesh.provision(shared)
    assert p is not None and p.state == r.RETIRING, p
    assert_fixed_point(mesh)


def test_decided_with_an_answer_bound_to_another_act_is_refused(sup: Runtime, mesh: Bus) -> None:
    key = "bee.oldapp.postgres-database"
    p = mesh.provision(key)
    assert p is not None and p.ask
    mesh.decide(key, p.ask, "yes", binds="sha256:" + "0" * 64)
    settle(sup)
    p = mesh.provision(key)
    assert p is not None and p.state == r.RETIRING and p.warrant is None
    assert_fixed_point(mesh)
