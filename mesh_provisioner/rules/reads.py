"""What a judgment read, and what a change touches: the two halves of waking by construction (contract section 6).

A judgment (a node's composition, a key's judgment, an ask's decision) runs its pure rule over a `Reads`, which
answers as the view below and records each thing it was asked as a token: `("get", state, key)` for a value, and
`(index, value...)` for an index lookup. `touched` names the tokens a change of one key makes stale: its own value,
and each index answer whose value the change adds or removes. A change wakes exactly the judgments whose last read
set holds a token it touched; the section 6 table is the least this covers, and a test checks it over recorded
read sets. As Salsa or Skyframe do, the edges are recorded at read time, so none can be forgotten by hand.

`touched` may name more than changed (a token for a value whose answer ends the same), never less: a token it
missed would be a missing wake-up. The indices it mirrors are `MemoryView`'s (rules/memory_view.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, TypeVar

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
    VAULT_MODULE,
    WANTS,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import Entry, View, group_of, manifest, plan_provisions_of

Token = tuple[str, ...]
"""One thing a judgment read: `("get", state, key)`, `("keys", state, node or "*")`, or an index and its value."""

T = TypeVar("T")


def token(*parts: str) -> Token:
    """A token from its parts: the kind of read, then what it names."""
    return parts


ALL: Final = "*"  # the node of `keys(state)` without one


class Reads:
    """A view that records what a rule read from it; `tokens` is the read set of the run.

    `began` is how many changes the view below had taken when the run began reading (its owner counts them): a
    change counted up to it is in what the run read. Given `changes` (that count, read now), each token also keeps
    the count at its first read (`read_at`): a change counted up to it is in what the run read of that token, so a
    change that lands during a run but before the run looked is not taken for one it missed.

    A composition's run also records, in `judged`, each key it judged as that key's own judgment (`rejudge`) would
    read it: the key's read set, so that the key need not be judged again only to learn what it reads.
    """

    def __init__(self, base: View, began: int = 0, changes: Callable[[], int] | None = None) -> None:
        self.base = base
        self.bound_reads = base.bound_reads
        self.began = began
        self.tokens: set[Token] = set()
        self.judged: dict[str, Reads] = {}
        self._changes = changes
        self._first: dict[Token, int] = {}

    def _read(self, *parts: str) -> None:
        self._note(parts)

    def _note(self, t: Token) -> None:
        """Record one token, and the change count at its first read."""
        if t in self.tokens:
            return
        self.tokens.add(t)
        if self._changes is not None:
            self._first[t] = self._changes()

    def read_at(self, t: Token) -> int:
        """The change count the run had seen when it first read a token (`began` when not counted)."""
        return self._first.get(t, self.began)

    def get(self, state: str, key: str) -> Entry | None:
        """The entry at a key; recorded."""
        self._note(("get", state, key))  # the read judgments make most: its token built here, not from `*parts`
        return self.base.get(state, key)

    def keys(self, state: str, node: str | None = None) -> Iterable[str]:
        """The keys of a state, or of one node's; recorded."""
        self._read("keys", state, ALL if node is None else node)
        return self.base.keys(state, node)

    def plan_provisions(self, key: str) -> tuple[tuple[str, str], ...] | None:
        """The (provision, local) pairs of the plan at a plans key; recorded as the pairs alone, not the plan."""
        self._read("plan", key)
        return self.base.plan_provisions(key)

    def placed_on(self, module: str) -> list[str]:
        """Every node a module is placed on; recorded."""
        self._read("placed", module)
        return self.base.placed_on(module)

    def is_placed(self, module: str, node: str) -> bool:
        """Whether a module is placed on a node; recorded as where the module is placed."""
        self._read("placed", module)
        return self.base.is_placed(module, node)

    def is_placed_anywhere(self, module: str) -> bool:
        """Whether a module is placed on any node; recorded as where the module is placed."""
        self._read("placed", module)
        return self.base.is_placed_anywhere(module)

    def providers_of(self, provision: str) -> set[str]:
        """Every module whose trunk manifest provides a provision; recorded."""
        self._read("providers", provision)
        return self.base.providers_of(provision)

    def provided_by(self, module: str, node: str) -> set[str]:
        """Every provision key whose provider is a module on a node; recorded."""
        self._read("by-provider", module, node)
        return self.base.provided_by(module, node)

    def dependents(self, key: str) -> set[str]:
        """Every provision key whose depends-on names a key; recorded."""
        self._read("dependents", key)
        return self.base.dependents(key)

    def unrecorded(self) -> View:
        """The view below: what is read through it is not in this judgment's read set."""
        return self.base.unrecorded()

    def judging(self, key: str, below: View | None = None) -> Reads:
        """A run of one key's judgment within this one, reading `below` (default the view below, unrecorded): kept in
        `judged`, its read set that of `rejudge(key)`, which reads the key's own value first. Its reads count from now,
        its tokens' first reads not kept (`read_at` answers when it began): a change during it is taken as missed."""
        began = self._changes() if self._changes is not None else self.began
        run = self.judged[key] = Reads(self.base.unrecorded() if below is None else below, began)
        run.get(PROVISIONS, key)
        return run

    def judged_on(self, node: str) -> list[str]:
        """The provision keys a node's composition judges; recorded as that list, not as the node's keys."""
        self._read("judged", node)
        return self.base.judged_on(node)

    def needing(self, provision: str) -> set[str]:
        """Every node with a plan naming a provision; recorded."""
        self._read("needing", provision)
        return self.base.needing(provision)

    def provided_by_module(self, module: str) -> set[str]:
        """Every provision key whose provider is a module; recorded."""
        self._read("by-provider-module", module)
        return self.base.provided_by_module(module)

    def provided_on(self, node: str) -> set[str]:
        """Every provision key whose provider is on a node; recorded."""
        self._read("by-provider-node", node)
        return self.base.provided_on(node)

    def nodes_naming(self, module: str) -> set[str]:
        """Every node whose wants or haves name a module; recorded."""
        self._read("naming", module)
        return self.base.nodes_naming(module)

    def manifest_users(self, manifest: str) -> set[str]:
        """Every module whose registration or a build names a manifest; recorded."""
        self._read("manifest-users", manifest)
        return self.base.manifest_users(manifest)

    def keys_of_ask(self, ask: str) -> set[str]:
        """The provision keys naming an ask; recorded."""
        self._read("ask", ask)
        return self.base.keys_of_ask(ask)

    def asking(self) -> set[str]:
        """Every provision key naming an ask; recorded."""
        self._read("asking")
        return self.base.asking()

    def requirers(self, provision: str) -> set[str]:
        """Every module with a manifest requiring a provision; recorded."""
        self._read("requirers", provision)
        return self.base.requirers(provision)


def touched(view: View, state: str, key: str, old: Entry | None, new: Entry | None) -> set[Token]:
    """Every token whose answer a change of `state` at `key` from `old` to `new` may change; `view` holds `new`.

    Each index's tokens are named for the values the change adds to it or removes from it (section 6's rule: a
    change wakes every judgment that read what changed).
    """
    out = {token("get", state, key)}
    if (old is None) != (new is None):
        out.add(token("keys", state, ALL))
        out.add(token("keys", state, group_of(state, key)))
    if state == PLACEMENT:
        if k.is_token(key):  # a placement key that is not one token places nothing (section 7)
            out |= {token("placed", m) for m in _placed(old) ^ _placed(new)}
    elif state == PROVISIONS:
        out |= _provision(key, _value(old, r.Provision), _value(new, r.Provision))
        out |= _judged(view, key, old, new)
    elif state == PLANS:
        before, after = plan_provisions_of(old), plan_provisions_of(new)
        if (before or ()) != (after or ()):
            out.add(token("plan", key))
        out |= {token("needing", p) for p, _ in set(before or ()) ^ set(after or ())}
    elif state in (WANTS, HAVE) and (old is None) != (new is None):
        parts = key.split(".")
        if (state == WANTS and len(parts) == 3) or (state == HAVE and len(parts) == 2):
            out.add(token("naming", parts[-1]))
    elif state == MODULES:
        ids = {_manifest_id(old), _manifest_id(new)} - {""}
        if _manifest_id(old) != _manifest_id(new):
            out |= _manifest_ids(view, ids)
        out |= {token("providers", p) for p in _trunk_offers(view, key, old) ^ _trunk_offers(view, key, new)}
    elif state == BUILDS:
        if _manifest_id(old) != _manifest_id(new):
            out |= _manifest_ids(view, {_manifest_id(old), _manifest_id(new)} - {""})
    elif state == MANIFESTS:
        out |= {token("providers", p) for p in _offers(old) ^ _offers(new)}
        out |= {token("requirers", p) for p in _requires(old) ^ _requires(new)}
    return out


def _provision(key: str, was: r.Provision | None, now: r.Provision | None) -> set[Token]:
    """A provision's indices: its provider, what it depends on, the ask it names (rules/memory_view.py)."""
    out: set[Token] = set()
    if _provider(was) != _provider(now):
        for p in (was, now):
            if p is not None:
                out.add(token("by-provider", p.provider.module, p.provider.node))
                out.add(token("by-provider-module", p.provider.module))
                out.add(token("by-provider-node", p.provider.node))
    for dep in set(was.depends_on if was else ()) ^ set(now.depends_on if now else ()):
        out.add(token("dependents", dep))
    before, after = (was.ask if was else ""), (now.ask if now else "")
    if before != after:
        out |= {token("ask", a) for a in (before, after) if a}
    if bool(before) != bool(after):
        out.add(token("asking"))
    return out


def _judged(view: View, key: str, old: Entry | None, new: Entry | None) -> set[Token]:
    """`judged_on`'s answers a provision change may change: its own node's when the key enters or leaves what that
    node judges, and another node's when the key starts or stops being the only dependent there of a shared
    credential from another node (`kept_elsewhere`)."""
    out: set[Token] = set()
    node = k.node_of(key)
    # Only a credential of the vault's is judged elsewhere: for any other key, who depends on it does not matter (and
    # a key thousands depend on is changed as often as any).
    others = (_is_vault(old) or _is_vault(new)) and any(k.node_of(u) != node for u in view.dependents(key))
    if _judged_there(old, others) != _judged_there(new, others):
        out.add(token("judged", node))
    was, now = _value(old, r.Provision), _value(new, r.Provision)
    before, after = set(was.depends_on if was else ()), set(now.depends_on if now else ())
    for dep in before ^ after:
        there = k.node_of(dep)
        if there == node or not _is_vault(view.get(PROVISIONS, dep)):
            continue
        # `view` holds the change: the key is among the dependents it now has, not among those it lost. Either way
        # it is the only one of another node, or was, when no other key of another node depends on it.
        if not any(u != key and k.node_of(u) != there for u in view.dependents(dep)):
            out.add(token("judged", there))
    return out


def _is_vault(e: Entry | None) -> bool:
    p = _value(e, r.Provision)
    return p is not None and p.provider.module == VAULT_MODULE


def _judged_there(e: Entry | None, others: bool) -> bool:
    """Whether a provision entry is among what its node judges, given whether other nodes depend on it."""
    return e is not None and not (others and _is_vault(e))


def _manifest_ids(view: View, ids: Iterable[str]) -> set[Token]:
    """A manifest id gained or lost a user: its users, and who requires what it requires, may change."""
    out: set[Token] = set()
    for mid in ids:
        out.add(token("manifest-users", mid))
        out |= {token("requirers", p) for p in _requires(view.get(MANIFESTS, mid))}
    return out


def _value(e: Entry | None, kind: type[T]) -> T | None:
    return e.get(kind) if e is not None else None


def _provider(p: r.Provision | None) -> tuple[str, str] | None:
    return (p.provider.module, p.provider.node) if p is not None else None


def _placed(e: Entry | None) -> set[str]:
    p = _value(e, r.Placement)
    return {m.module for m in p.modules} if p is not None else set()


def _manifest_id(e: Entry | None) -> str:
    value = e.value if e is not None else None
    return value.manifest if isinstance(value, r.ModuleEntry | r.Build) else ""


def _offers(e: Entry | None) -> set[str]:
    m = _value(e, r.Manifest)
    return {o.name for o in m.offers()} if m is not None else set()


def _requires(e: Entry | None) -> set[str]:
    m = _value(e, r.Manifest)
    return {req.provision for req in m.requires} if m is not None else set()


def _trunk_offers(view: View, module: str, e: Entry | None) -> set[str]:
    """What a module provides at the trunk when its registration is `e` (the manifest it names, as the view has it)."""
    me = _value(e, r.ModuleEntry)
    if me is None or not me.manifest:
        return set()
    m, why = manifest(view, me.manifest, module)
    return set() if why else {o.name for o in m.offers()}


def known_nodes(view: View) -> set[str]:
    """Every node with anything on the bus: a placement, a want, a have, a resolved choice, a plan, a refusal, a key.

    Each is composed (design.md); a key whose node is not a token names no node (section 7).
    """
    nodes: set[str] = set()
    for state in NODE_STATES:
        for key in view.keys(state):
            node = group_of(state, key)
            if k.is_token(node):
                nodes.add(node)
    return nodes


NODE_STATES: Final = (PLACEMENT, WANTS, HAVE, RESOLVED, PLANS, REFUSED, PROVISIONS)
"""The states a key of which makes its node known (`known_nodes`)."""
