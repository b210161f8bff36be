"""The view's indices answer as a scan of its entries does, however the entries came and went."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mesh_provisioner.contract import PLACEMENT, PROVISIONS, VAULT_MODULE
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.reads import touched

NODES = ("ace", "bee", "cat")
MODULES = ("gitea", "postgres", "redis")

changes = st.lists(
    st.tuples(st.sampled_from(NODES), st.none() | st.lists(st.sampled_from(MODULES), max_size=3)),
    max_size=30,
)


@given(changes)
def test_placement_indices_answer_as_a_scan(placements: list[tuple[str, list[str] | None]]) -> None:
    view = MemoryView()
    for revision, (node, modules) in enumerate(placements, 1):
        if modules is None:
            view.apply(PLACEMENT, node, None)
        else:
            raw = json.dumps({"node": node, "modules": [{"module": m} for m in modules]}).encode()
            view.put(PLACEMENT, node, raw, revision)
    for module in MODULES:
        scanned = sorted(
            node for node in view.keys(PLACEMENT)
            if (e := view.get(PLACEMENT, node)) is not None and (p := e.get(r.Placement)) is not None
            and any(m.module == module for m in p.modules)
        )
        assert view.placed_on(module) == scanned
        assert view.is_placed_anywhere(module) == bool(scanned)
        assert all(view.is_placed(module, node) == (node in scanned) for node in NODES)


providers = st.lists(
    st.tuples(st.sampled_from(("bee.app.cache", "cat.app.cache", "cat.web.db")),
              st.none() | st.tuples(st.sampled_from(MODULES), st.sampled_from(NODES))),
    max_size=30,
)


@given(providers)
def test_provider_indices_answer_as_a_scan(writes: list[tuple[str, tuple[str, str] | None]]) -> None:
    view = MemoryView()
    for revision, (key, provider) in enumerate(writes, 1):
        if provider is None:
            view.apply(PROVISIONS, key, None)
        else:
            consumer, module, provision = key.split(".")
            raw = json.dumps({"provision": provision, "consumer": {"module": module, "node": consumer},
                              "provider": {"module": provider[0], "node": provider[1]}, "state": "asked"}).encode()
            view.put(PROVISIONS, key, raw, revision)
    held = {key: p for key in view.keys(PROVISIONS)
            if (e := view.get(PROVISIONS, key)) is not None and (p := e.get(r.Provision)) is not None}
    for node in NODES:
        assert view.provided_on(node) == {key for key, p in held.items() if p.provider.node == node}
        for module in MODULES:
            assert view.provided_by(module, node) == {
                key for key, p in held.items() if (p.provider.module, p.provider.node) == (module, node)
            }


asks = st.lists(
    st.tuples(st.sampled_from(("bee.app.cache", "cat.app.cache", "cat.web.db")),
              st.none() | st.sampled_from(("", "retire-1", "retire-2"))),
    max_size=30,
)


@given(asks)
def test_ask_indices_answer_as_a_scan(writes: list[tuple[str, str | None]]) -> None:
    # Two keys may name the same ask (one forged by another writer): each is found by it, and neither is lost when
    # the other stops naming it.
    view = MemoryView()
    for revision, (key, ask) in enumerate(writes, 1):
        if ask is None:
            view.apply(PROVISIONS, key, None)
        else:
            raw = json.dumps({"provision": key.split(".")[2], "state": "retiring", "ask": ask}).encode()
            view.put(PROVISIONS, key, raw, revision)
    held = {key: p for key in view.keys(PROVISIONS)
            if (e := view.get(PROVISIONS, key)) is not None and (p := e.get(r.Provision)) is not None}
    assert view.asking() == {key for key, p in held.items() if p.ask}
    for ask in ("retire-1", "retire-2"):
        assert view.keys_of_ask(ask) == {key for key, p in held.items() if p.ask == ask}


credentials = st.lists(
    st.tuples(
        st.sampled_from(("ace.db.pg-credential", "bee.app.pg", "cat.web.pg", "ace.app.pg", "ace.db.pg")),
        st.none() | st.tuples(st.booleans(), st.lists(st.sampled_from(("ace.db.pg-credential", "ace.db.pg")),
                                                         max_size=2, unique=True)),
    ),
    max_size=30,
)


@given(credentials)
def test_5_2_shared_credentials_other_nodes_depend_on_are_judged_by_them_and_touched_says_when(
    writes: list[tuple[str, tuple[bool, list[str]] | None]],
) -> None:
    # judged_on(node) is the node's keys but the vault's keys another node depends on; every write that changes a
    # node's answer names ("judged", node) among the tokens it touched (or its composition would not be woken).
    view = MemoryView()

    def scan(node: str) -> list[str]:
        out = []
        for key in view.keys(PROVISIONS, node):
            p = view.get(PROVISIONS, key).get(r.Provision)  # type: ignore[union-attr]
            users = {u for u in view.keys(PROVISIONS) if u.split(".")[0] != node
                     and key in view.get(PROVISIONS, u).get(r.Provision).depends_on}  # type: ignore[union-attr]
            if not (p.provider.module == VAULT_MODULE and users):
                out.append(key)
        return sorted(out)

    for revision, (key, value) in enumerate(writes, 1):
        before = {node: scan(node) for node in NODES}
        old = view.get(PROVISIONS, key)
        if value is None:
            view.apply(PROVISIONS, key, None)
        else:
            vault, deps = value
            node, module, provision = key.split(".")
            raw = json.dumps({"provision": provision, "consumer": {"module": module, "node": node},
                              "provider": {"module": VAULT_MODULE if vault else "postgres", "node": "ace"},
                              "depends-on": [d for d in deps if d != key], "state": "asked"}).encode()
            view.put(PROVISIONS, key, raw, revision)
        tokens = touched(view, PROVISIONS, key, old, view.get(PROVISIONS, key))
        for node in NODES:
            after = scan(node)
            assert sorted(view.judged_on(node)) == after
            if after != before[node]:
                assert ("judged", node) in tokens, (key, value, node, before[node], after)
