"""The order nodes compose in when all do at once (rules/order.py): those other nodes need, first."""

from __future__ import annotations

from mesh import Mesh, keeper, req

from mesh_provisioner.contract import RESOLVED
from mesh_provisioner.rules.order import providers_first
from mesh_provisioner.rules.reads import known_nodes


def mesh() -> Mesh:
    """ace runs postgres, which bee's and cat's apps need; cat runs redis, which bee's app needs; dog needs nothing."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("redis", "1", provides=["cache"])
    m.module("app", "1", requires=[req("postgres-database"), "cache"])
    m.module("web", "1", requires=[req("postgres-database")])
    m.place("ace", "postgres")
    m.place("bee", "app")
    m.place("cat", "web", "redis")
    m.place("dog")
    return m


def test_the_nodes_others_need_compose_first() -> None:
    m = mesh()
    assert providers_first(m.view, known_nodes(m.view)) == ["ace", "cat", "bee", "dog"]


def test_a_provider_on_the_consumers_own_node_puts_no_other_first() -> None:
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("web", "1", requires=[req("postgres-database")])
    m.place("zed", "postgres")
    m.place("cat", "web", "postgres")  # cat's web takes postgres from cat (5.1): it needs nothing of zed
    m.place("bee")
    assert providers_first(m.view, known_nodes(m.view)) == ["bee", "cat", "zed"]
    m.place("cat", "web")  # now it does
    assert providers_first(m.view, known_nodes(m.view)) == ["zed", "bee", "cat"]


def test_a_resolved_provider_comes_first() -> None:
    m = mesh()
    m.place("dog", "postgres")
    m.put(RESOLVED, "bee.app", {"providers": {"postgres-database": "dog"}})
    order = providers_first(m.view, known_nodes(m.view))
    assert order.index("dog") < order.index("bee")
