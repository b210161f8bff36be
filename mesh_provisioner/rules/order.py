"""The order in which to compose nodes when all are composed at once: providers' nodes before their consumers'.

A consumer's provisions depend on its provider's plan (contract section 4, depends-on): composed before the plan of
a provider on another node is written, a consumer is composed again once it is. Any order reaches the same fixed
point (design.md, property 6); this one reaches it with fewer compositions. Node A comes before node B when a module
on B requires a provision that mesh-config resolves to A, or that no module on B provides and a module on A does (5.1:
a provider on the consumer's own node is chosen next); the nodes more others need go first, the rest in sorted order.
"""

from __future__ import annotations

from collections.abc import Iterable

from mesh_provisioner.rules.compose import CannotCompose, placed, resolved_node
from mesh_provisioner.rules.view import View, trunk_manifest


def providers_first(view: View, nodes: Iterable[str]) -> list[str]:
    """The nodes, those more other nodes need first."""
    nodes = sorted(nodes)
    before: dict[str, set[str]] = {n: set() for n in nodes}  # node -> the nodes it needs first
    requires: dict[str, set[str]] = {}
    # Per provision, its providers and the nodes among these where one is placed: worked out once, as a provider
    # placed on hundreds of nodes would otherwise be listed again for each node that needs it.
    offered: dict[str, tuple[set[str], set[str]]] = {}
    for node in nodes:
        try:
            here = set(placed(view, node))
        except CannotCompose:
            continue
        firsts = before[node]
        for module in sorted(here):
            if module not in requires:
                manifest, why = trunk_manifest(view, module)
                requires[module] = set() if why else {req.provision for req in manifest.requires}
            for provision in requires[module]:
                chosen, _ = resolved_node(view, node, module, provision)
                if chosen:
                    if chosen in before:
                        firsts.add(chosen)
                    continue
                if provision not in offered:
                    providers = view.providers_of(provision)
                    offered[provision] = providers, {n for p in providers for n in view.placed_on(p) if n in before}
                providers, on = offered[provision]
                if not providers & here:
                    firsts |= on
        firsts.discard(node)
    # The nodes more others need come first: needs between nodes form cycles (every node runs consumers), and a
    # provider composed late wakes all who need it, while one composed early wakes nobody.
    needed_by: dict[str, int] = dict.fromkeys(nodes, 0)
    for firsts in before.values():
        for first in firsts:
            needed_by[first] += 1
    return sorted(nodes, key=lambda n: (-needed_by[n], n))
