"""`show`'s rendering of the seat's states (contract section 4): tables, the verb's JSON, and the Graphviz graph."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

from mesh_provisioner.contract import PLANS, PROVISIONS, REFUSED
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.show import graph_dot, render


def provision(key: str, provider: str, state: str, why: str = "") -> dict[str, Any]:
    node, consumer, name, *local = key.split(".")
    p_node, p_module = provider.split(".")
    value: dict[str, Any] = {"provision": name, "consumer": {"module": consumer, "node": node},
                             "provider": {"module": p_module, "node": p_node}, "state": state, "v": 1}
    if local:
        value["local"] = local[0]
    if why:
        value["why"] = why
    return value


def view() -> MemoryView:
    """A provision in each state, a plan, a held module and a provision that does not decode."""
    v = MemoryView()
    n = iter(range(1, 100))
    for key, provider, state, why in [
        ("ace.gitea.postgres-database.main", "ace.postgres", "provided", ""),
        ("bee.webapp.oidc-client", "ace.keycloak", "asked", "waits for keycloak"),
        ("bee.webapp.forge-account", "ace.gitea", "waits", 'an administrator says "yes"'),
        ("bee.webapp.postgres-database", "ace.postgres", "failed", "quota used up"),
        ("bee.oldapp.postgres-database", "ace.postgres", "retiring", "no longer needed"),
    ]:
        v.put(PROVISIONS, key, json.dumps(provision(key, provider, state, why)).encode(), next(n))
    v.put(PROVISIONS, "cid.x.thing", b"{not json", next(n))
    v.put(PLANS, "ace.keycloak", json.dumps({"node": "ace", "module": "keycloak", "plan": {"provisions": []}}).encode(),
          next(n))
    v.put(REFUSED, "bee.reports", json.dumps({"node": "bee", "module": "reports", "why": "nothing provides storage",
                                              "since": "2026-12-02T17:42:55Z"}).encode(), next(n))
    return v


def edge(dot: str, consumer: str, provider: str) -> str:
    lines = [line for line in dot.splitlines() if line.strip().startswith(f'"{consumer}" -> "{provider}"')]
    assert len(lines) == 1, dot
    return lines[0]


@pytest.mark.parametrize(
    ("consumer", "provider", "label", "colour"),
    [
        ("ace.gitea", "ace.postgres", "postgres-database.main", "green"),
        ("bee.webapp", "ace.keycloak", "oidc-client", "grey"),
        ("bee.webapp", "ace.gitea", "forge-account", "orange"),
        ("bee.webapp", "ace.postgres", "postgres-database", "red"),
        ("bee.oldapp", "ace.postgres", "postgres-database", "purple"),
    ],
)
def test_graph_edges_go_from_consumer_to_provider_labelled_and_coloured_by_state(
    consumer: str, provider: str, label: str, colour: str
) -> None:
    line = edge(graph_dot(view()), consumer, provider)
    assert f'label="{label}"' in line
    assert f'color="{colour}"' in line


def test_graph_clusters_nodes_marks_held_modules_and_names_bad_values() -> None:
    dot = graph_dot(view())
    assert dot.startswith('digraph "mesh-provisioner" {\n')
    assert dot.endswith("}\n")
    assert 'subgraph "cluster_ace" {' in dot
    assert 'subgraph "cluster_bee" {' in dot
    assert '"ace.keycloak" [label="keycloak"];' in dot
    assert '"bee.reports" [label="reports", style="rounded,dashed", color="red", ' \
           'tooltip="held: nothing provides storage"];' in dot
    assert "// cid.x.thing: mesh-provisioner.provisions cid.x.thing does not decode" in dot
    assert 'tooltip="bee.webapp.forge-account: waits: an administrator says \\"yes\\""' in dot
    assert graph_dot(view()) == dot  # deterministic


def test_graph_of_an_empty_view() -> None:
    assert graph_dot(MemoryView()) == (
        'digraph "mesh-provisioner" {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname="Helvetica"];\n'
        '  edge [fontname="Helvetica", fontsize=10];\n}\n'
    )


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_graphviz_reads_the_graph() -> None:
    out = subprocess.run(["dot", "-Tsvg"], input=graph_dot(view()), capture_output=True, text=True, check=True)
    assert "<svg" in out.stdout
    assert "Warning" not in out.stderr and "Error" not in out.stderr


def test_json_is_the_verbs_shape_narrowed_by_node_module_and_state() -> None:
    v = view()
    out = json.loads(render(v, "provisions", state="provided", json=True))
    assert out == {"entries": [{"key": "ace.gitea.postgres-database.main",
                                "value": provision("ace.gitea.postgres-database.main", "ace.postgres", "provided")}]}
    out = json.loads(render(v, "provisions", node="bee", module="webapp", json=True))
    assert [e["key"] for e in out["entries"]] == ["bee.webapp.forge-account", "bee.webapp.oidc-client",
                                                  "bee.webapp.postgres-database"]
    out = json.loads(render(v, "refused", json=True))
    assert out["entries"][0]["value"]["why"] == "nothing provides storage"


def test_tables_narrowed() -> None:
    text = render(view(), "provisions", node="bee", state="failed")
    assert text.splitlines() == [
        "key                           state   provider      why",
        "bee.webapp.postgres-database  failed  postgres@ace  quota used up",
    ]
    assert render(view(), "plans").splitlines()[1].startswith("ace.keycloak  (needs nothing)")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"what": "needs"}, "show shows plans, provisions, refused, graph, not 'needs'"),
        ({"what": "plans", "state": "provided"}, "--state narrows provisions only, not plans"),
        ({"what": "graph", "json": True}, "show graph draws every provision: it takes no --node"),
        ({"what": "graph", "node": "ace"}, "show graph draws every provision: it takes no --node"),
    ],
)
def test_requests_show_cannot_make(args: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(why)):
        render(view(), **args)


def test_a_state_that_is_not_a_provisions_state_is_refused() -> None:
    from mesh_provisioner.show import check

    assert "not 'provide'" in check("provisions", state="provide")
    assert check("provisions", state="provided") == ""
