"""What a process of a partitioned seat keeps in memory (contract 8.1, rules/kept.py), pure: of another node's keys,
its providers' modules' and those depending on its own nodes' keys, and the catalogue changes that widen it."""

from __future__ import annotations

import json

from mesh_provisioner.contract import (
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
from mesh_provisioner.rules.kept import PROVIDER_KEPT, Kept, kept, providers, widened_by
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.view import entry_of


def _js(value: object) -> bytes:
    return json.dumps(value).encode()


def _ace(node: str) -> bool:
    return node == "ace"


BOUND = frozenset({bound("postgres")})


def test_8_1_a_process_keeps_all_of_its_own_nodes_keys() -> None:
    for state, key in ((PLANS, "ace.wiki"), (PROVISIONS, "ace.wiki.postgres-database"), (REFUSED, "ace.wiki"),
                       (WANTS, "want.ace.wiki"), (HAVE, "ace.wiki"), (HAVE, "ace"), (RESOLVED, "ace.wiki"),
                       (bound("postgres"), "ace.wiki.postgres-database")):
        assert kept(state, key, b"{}", _ace, set(), BOUND), (state, key)


def test_8_1_of_another_node_a_process_keeps_its_providers_modules_plans_wants_haves_and_provisions() -> None:
    for state, key in ((PLANS, "bee.postgres"), (WANTS, "want.bee.postgres"), (HAVE, "bee.postgres"),
                       (PROVISIONS, "bee.postgres.postgres-database-credential")):
        assert kept(state, key, b"{}", _ace, {"postgres"}, BOUND), (state, key)
        assert not kept(state, key.replace("postgres", "wiki", 1), b"{}", _ace, {"postgres"}, BOUND), (state, key)


def test_8_1_of_another_node_a_process_keeps_the_provisions_depending_on_its_own_nodes_keys() -> None:
    on_ace = _js({"depends-on": ["ace.postgres.postgres-database-credential"]})
    on_cat = _js({"depends-on": ["cat.postgres.postgres-database-credential"]})
    assert kept(PROVISIONS, "bee.wiki.postgres-database", on_ace, _ace, set(), BOUND)
    assert not kept(PROVISIONS, "bee.wiki.postgres-database", on_cat, _ace, set(), BOUND)
    assert not kept(PROVISIONS, "bee.wiki.postgres-database", _js({}), _ace, set(), BOUND)
    # Section 7: a value that does not decode is kept, to be read with why; nested too deeply, too.
    assert kept(PROVISIONS, "bee.wiki.postgres-database", b"not json", _ace, set(), BOUND)
    assert kept(PROVISIONS, "bee.wiki.postgres-database", b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", _ace, set(),
                BOUND)


def test_8_1_of_another_node_a_process_keeps_no_providers_entry_resolution_or_refusal() -> None:
    for state in (bound("postgres"), RESOLVED, REFUSED):
        assert not kept(state, "bee.postgres", b"{}", _ace, {"postgres"}, BOUND), state


def test_8_1_the_placements_and_the_catalogue_are_kept_whole() -> None:
    for state, key in ((PLACEMENT, "bee"), (MODULES, "wiki"), (MANIFESTS, "m-wiki")):
        assert kept(state, key, b"{}", _ace, set(), BOUND), state


def _catalogue() -> MemoryView:
    view = MemoryView()
    view.put(MODULES, "postgres", _js({"module": "postgres", "fp": "1", "manifest": "m-postgres"}), 1)
    view.put(MANIFESTS, "m-postgres", _js({"name": "postgres", "provides": ["postgres-database"]}), 2)
    view.put(MODULES, "wiki", _js({"module": "wiki", "fp": "1", "manifest": "m-wiki"}), 3)
    view.put(MANIFESTS, "m-wiki", _js({"name": "wiki"}), 4)
    return view


def test_8_1_a_providers_module_is_the_vault_one_whose_trunk_manifest_offers_or_one_a_held_nodes_key_names() -> None:
    view = _catalogue()
    assert providers(view, _ace) == {"mesh-vault", "postgres"}
    # A module that no longer offers what a key of ace's was made from: that key is judged by its have all the same.
    view.put(PROVISIONS, "ace.app.cache", _js({"provision": "cache", "consumer": {"module": "app", "node": "ace"},
                                               "provider": {"module": "wiki", "node": "bee"}}), 5)
    assert providers(view, _ace) == {"mesh-vault", "postgres", "wiki"}
    assert providers(view, lambda node: node == "cat") == {"mesh-vault", "postgres"}


def test_8_1_a_catalogue_change_that_may_make_a_module_a_providers_widens_what_is_kept() -> None:
    view = _catalogue()
    offering = _js({"name": "wiki", "provides": ["wiki-page"]})
    assert widened_by(view, MANIFESTS, "m-wiki", entry_of(MANIFESTS, "m-wiki", offering, 5)) == {"wiki"}
    assert widened_by(view, MANIFESTS, "m-wiki", entry_of(MANIFESTS, "m-wiki", _js({"name": "wiki"}), 5)) == set()
    to_postgres = _js({"module": "wiki", "fp": "2", "manifest": "m-postgres"})
    assert widened_by(view, MODULES, "wiki", entry_of(MODULES, "wiki", to_postgres, 5)) == {"wiki"}
    assert widened_by(view, MODULES, "wiki", None) == set()
    keeping = Kept(view, _ace)
    assert keeping.providers == {"mesh-vault", "postgres"}
    assert keeping.widens(MANIFESTS, "m-wiki", offering) == PROVIDER_KEPT
    assert keeping.providers == {"mesh-vault", "postgres", "wiki"}
    assert keeping.widens(MANIFESTS, "m-wiki", offering) == (), "a module already a provider's widens nothing"
    assert keeping.widens(WANTS, "want.bee.wiki", b"{}") == (), "neither does a want"


def test_8_1_a_held_nodes_key_naming_a_provider_not_kept_widens_what_is_kept() -> None:
    keeping = Kept(_catalogue(), _ace)
    named = _js({"provision": "cache", "provider": {"module": "redis", "node": "bee"}})
    assert keeping.widens(PROVISIONS, "bee.app.cache", named) == (), "another node's key widens nothing"
    assert keeping.widens(PROVISIONS, "ace.app.cache", named) == PROVIDER_KEPT
    assert "redis" in keeping.providers
    assert keeping.widens(PROVISIONS, "ace.app.cache", b"not json") == ()
