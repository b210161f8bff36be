"""The view's placement indices answer as a scan of its placements does, however the placements came and went."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.view import PLACEMENT, MemoryView

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
