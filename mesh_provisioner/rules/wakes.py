"""What a change wakes (contract section 6): the nodes to compose, the keys to judge, the answers to read.

The rule behind the table: a change wakes every node and key whose judgement reads what changed, so that the seat
settles at a fixed point with no timer. Each function here reads the view as it is after the change, and the
entry the key had before it, so that what a change took away wakes too.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import (
    ASK_RECORDS,
    BUILDS,
    HAVE,
    MANIFESTS,
    MODULES,
    OWN,
    PLACEMENT,
    PLANS,
    PROVISIONS,
    REFUSED,
    RESOLVED,
    WANTS,
    Entry,
    View,
    group_of,
    manifest,
)


class Woken(msgspec.Struct, frozen=True):
    """What one change wakes: nodes to compose, keys to judge again, retiring keys whose answer to read.

    `judged_on` names the node whose actor judges every key woken, together, in one batch of writes: the provider's
    node for a change of its own word (its have or want: the keys it provides there), the changed key's node for a
    change of a key's state (the keys depending on it, which may be on hundreds of nodes); "" when each key is
    judged by its own node's actor.
    """

    nodes: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    decide: frozenset[str] = frozenset()
    judged_on: str = ""

    def __bool__(self) -> bool:
        return bool(self.nodes or self.keys or self.decide)


def woken_by(
    view: View, state: str, key: str, old: Entry | None, new: Entry | None, *, another_writer: bool = False
) -> Woken:
    """What a change of `state` at `key` from `old` to `new` wakes; the view already holds `new`.

    `another_writer`: the change is not the seat's own write. Contract section 8 has the seat alone write its own
    states, yet what it reads there is untrusted too (section 7): a plan, refusal or provision another writer made
    wakes the node whose composition writes it, and a provision is judged again, as its state comes from its
    provider's word alone (5.3). Nothing else would: a key made on a node nothing wakes, or a provision's state
    forged, stayed off the fixed point until the seat started again. The seat's own writes wake none of this (its
    composition wrote them).
    """
    woken = _woken(view, state, key, old, new)
    if not another_writer or state not in OWN:
        return woken
    return Woken(
        woken.nodes | {group_of(state, key)},
        (woken.keys | {key}) if state == PROVISIONS else woken.keys,
        woken.decide,
        judged_on=woken.judged_on,
    )


def _woken(view: View, state: str, key: str, old: Entry | None, new: Entry | None) -> Woken:
    """What a change wakes by contract section 6's table."""
    if state == PLACEMENT:
        return _placement(view, key, old, new)
    if state == WANTS:
        parts = key.split(".")
        if len(parts) != 3:
            return Woken()
        # A provider judged by its have is provided only at the build its want names (5.3).
        return Woken(frozenset({parts[1]}), frozenset(view.provided_by(parts[2], parts[1])), judged_on=parts[1])
    if state == HAVE:
        node, _, module = key.partition(".")
        if not module:
            return Woken(frozenset({node}))
        return Woken(frozenset({node}), frozenset(view.provided_by(module, node)), judged_on=node)
    if state == RESOLVED:
        return Woken(frozenset({k.node_of(key)}))
    if state == MODULES:
        return _modules(view, {key}, [_offers_of_entry(view, old), _offers_of_entry(view, new)])
    if state == BUILDS:
        return _modules(view, {key.split(".", 1)[0]}, [])
    if state == MANIFESTS:
        return _modules(view, view.manifest_users(key), [_offers(old), _offers(new)])
    if state == PLANS:
        node, _, module = key.partition(".")
        return Woken(frozenset(k.node_of(p) for p in view.provided_by(module, node)))
    if state == PROVISIONS:
        return _provision(view, key, old, new)
    if state == ASK_RECORDS:
        return Woken(decide=frozenset(view.keys_of_ask(key)))
    if state.endswith(".bound"):
        return Woken(keys=frozenset({key}))
    return Woken()


def _placement(view: View, node: str, old: Entry | None, new: Entry | None) -> Woken:
    """A node's placement wakes it, and every node needing what the modules added or removed there provide."""
    if not k.is_token(node):
        return Woken()  # no node (section 7): nothing under it was ever placed, so its change changes nothing
    before, after = _placed(old), _placed(new)
    changed = before ^ after
    if (old is not None and old.value is None) or (new is not None and new.value is None):
        changed = before | after
    nodes = {node}
    provisions: set[str] = set()
    for module in changed:
        if module == r.VAULT_MODULE:
            # The vault's node provides every credential: every node with a plan may name one.
            nodes |= {k.node_of(p) for p in view.keys(PLANS)}
        nodes |= {k.node_of(p) for p in view.provided_by_module(module)}
        provisions |= _offers_of_module(view, module)
    return Woken(frozenset(nodes | _needing(view, provisions)))


def _modules(view: View, modules: Iterable[str], offers: list[set[str]]) -> Woken:
    """A module's registration, build or manifest wakes the nodes it is on or named on, the nodes it provides to,
    every node needing a provision its manifest now provides or no longer provides, and every key it provides:
    a held module's keys, which its node's composition leaves as they were, are judged again by themselves."""
    nodes: set[str] = set()
    keys: set[str] = set()
    for module in modules:
        nodes |= set(view.placed_on(module)) | view.nodes_naming(module)
        provided = view.provided_by_module(module)
        keys |= provided
        nodes |= {k.node_of(p) for p in provided}
    provisions = offers[0] ^ offers[1] if len(offers) == 2 else set()
    return Woken(frozenset(nodes | _needing(view, provisions)), frozenset(keys))


def _needing(view: View, provisions: Iterable[str]) -> set[str]:
    """Every node whose composition chooses a provider for one of the provisions: its plans name it, or one of
    its modules requires it at some build (held there, it has no plan naming it)."""
    nodes: set[str] = set()
    for provision in provisions:
        nodes |= view.needing(provision)
        for module in view.requirers(provision):
            nodes |= set(view.placed_on(module)) | view.nodes_naming(module)
    return nodes


def _provision(view: View, key: str, old: Entry | None, new: Entry | None) -> Woken:
    """A key's state wakes every key depending on it; its depends-on, or its going, wakes the nodes named."""
    was = old.get(r.Provision) if old is not None else None
    now = new.get(r.Provision) if new is not None else None
    keys: set[str] = set()
    if (was.state if was else None) != (now.state if now else None):
        keys = view.dependents(key)
    if now is not None and now.state == r.RETIRING and now.warrant is not None and (was is None or not was.warrant):
        # An answer written into a retiring key: the key itself is judged again, and goes once its provider
        # let its entry go (5.4).
        keys = keys | {key}
    nodes: set[str] = set()
    before = set(was.depends_on) if was is not None else set()
    after = set(now.depends_on) if now is not None else set()
    if before != after or now is None:
        nodes = {k.node_of(d) for d in before | after}
    if now is None and was is not None:
        # The key's own node judges again what it no longer has (a credential another node made there).
        nodes.add(k.node_of(key))
    decide = frozenset({key}) if now is not None and now.state == r.RETIRING and now.ask and not now.warrant else None
    return Woken(frozenset(nodes), frozenset(keys), decide or frozenset(), judged_on=k.node_of(key))


def _placed(e: Entry | None) -> set[str]:
    p = e.get(r.Placement) if e is not None else None
    return {m.module for m in p.modules} if p is not None else set()


def _offers(e: Entry | None) -> set[str]:
    m = e.get(r.Manifest) if e is not None else None
    return {o.name for o in m.offers()} if m is not None else set()


def _offers_of_entry(view: View, e: Entry | None) -> set[str]:
    me = e.get(r.ModuleEntry) if e is not None else None
    if me is None or not me.manifest:
        return set()
    m, why = manifest(view, me.manifest, me.module)
    return set() if why else {o.name for o in m.offers()}


def _offers_of_module(view: View, module: str) -> set[str]:
    me = view.get(MODULES, module)
    return _offers_of_entry(view, me)


def known_nodes(view: View) -> set[str]:
    """Every node with anything on the bus: a placement, a want, a have, a resolved choice, a plan, a refusal, a key.

    Each has its own actor (design.md); a key whose node is not a token names no node, nor does a placement key that
    is not one token (section 7).
    """
    nodes: set[str] = set()
    for state in (PLACEMENT, WANTS, HAVE, RESOLVED, PLANS, REFUSED, PROVISIONS):
        for key in view.keys(state):
            node = group_of(state, key)
            if k.is_token(node):
                nodes.add(node)
    return nodes
