"""The read-only view of the bus the rules judge from, and the in-memory one with the indices they need.

A `View` answers a state's value at a key with its revision, lists a state's keys (all, or one node's), and
keeps the indices of design.md so that no rule scans every key: provision keys by node, by provider and by
what they depend on; modules by the provision they provide; nodes by placed module. `MemoryView` is that view
over plain dictionaries: the bus layer fills it from key-value watches, tests fill it directly. Values are
decoded once, when they arrive; one that does not decode is kept with why, so a rule can name it (section 7).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, Final, Protocol, TypeVar

import msgspec

from mesh_provisioner.contract import (
    ASK_RECORDS,
    BUILDS,
    DEFAULT_BOUND_READS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    PLANS,
    PROVISIONS,
    REFUSED,
    REGISTRY,
    RESOLVED,
    SEAT,
    VAULT_MODULE,
    WANTS,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k

T = TypeVar("T")

_KINDS: Final[dict[str, type[Any]]] = {
    PLACEMENT: r.Placement,
    WANTS: r.Want,
    MODULES: r.ModuleEntry,
    MANIFESTS: r.Manifest,
    BUILDS: r.Build,
    HAVE: r.Have,
    RESOLVED: r.Resolved,
    ASK_RECORDS: r.AskRecord,
    PLANS: r.PlanRecord,
    PROVISIONS: r.Provision,
    REFUSED: r.Refusal,
    SEAT: r.Lease,
    REGISTRY: r.RegistryEntry,
}


def kind_of(state: str) -> type[Any] | None:
    """The record a state holds, None for one the rules keep as bytes."""
    if state.endswith(".bound"):
        return r.BoundEntry
    return _KINDS.get(state)


class Entry(msgspec.Struct, frozen=True, gc=False):
    """One key's value as read: its revision, the bytes, the decoded record, or why it did not decode.

    Untracked by the cycle collector, as records are (messages/records.py): it holds bytes, a record and a string.
    """

    revision: int
    raw: bytes
    value: Any = None
    error: str = ""

    def get(self, kind: type[T]) -> T | None:
        """The decoded value when it is a `kind`, else None (it did not decode)."""
        return self.value if isinstance(self.value, kind) else None


def entry_of(state: str, key: str, raw: bytes, revision: int) -> Entry:
    """An entry of `state` at `key`, decoded once; a value that does not decode keeps why."""
    kind = kind_of(state)
    if kind is None:
        return Entry(revision, raw)
    try:
        return Entry(revision, raw, r.decode(kind, raw, state=state, key=key))
    except r.BadValue as err:
        return Entry(revision, raw, None, str(err))


class View(Protocol):
    """What the rules read: the bus as one consistent, read-only picture, with its indices."""

    bound_reads: tuple[str, ...]

    def get(self, state: str, key: str) -> Entry | None:
        """The entry at a key, None when there is none."""
        ...

    def keys(self, state: str, node: str | None = None) -> Iterable[str]:
        """The keys of a state; with node, only that node's (section 4's and 2's first token, a want's second)."""
        ...

    def plan_provisions(self, key: str) -> tuple[tuple[str, str], ...] | None:
        """The (provision, local) of each provision of the plan at a plans key, in plan order; None: no plan.

        All a consumer's composition reads of its provider's plan (section 4, depends-on): a plan rewritten with
        the same provisions changes nothing it made.
        """
        ...

    def placed_on(self, module: str) -> list[str]:
        """Every node a module is placed on, sorted."""
        ...

    def is_placed(self, module: str, node: str) -> bool:
        """Whether a module is placed on a node."""
        ...

    def is_placed_anywhere(self, module: str) -> bool:
        """Whether a module is placed on any node."""
        ...

    def providers_of(self, provision: str) -> set[str]:
        """Every module whose manifest at the trunk provides a provision."""
        ...

    def provided_by(self, module: str, node: str) -> set[str]:
        """Every provision key whose provider is a module on a node."""
        ...

    def dependents(self, key: str) -> set[str]:
        """Every provision key whose depends-on names a key."""
        ...

    def judged_on(self, node: str) -> list[str]:
        """The provision keys a node's composition judges: all of the node's but the shared credentials that other
        nodes depend on, which those nodes judge (section 5.2)."""
        ...

    def needing(self, provision: str) -> set[str]:
        """Every node with a plan that names a provision."""
        ...

    def provided_by_module(self, module: str) -> set[str]:
        """Every provision key whose provider is a module, on any node."""
        ...

    def provided_on(self, node: str) -> set[str]:
        """Every provision key whose provider is on a node, whatever the module."""
        ...

    def nodes_naming(self, module: str) -> set[str]:
        """Every node whose wants or haves name a module."""
        ...

    def manifest_users(self, manifest: str) -> set[str]:
        """Every module whose registration or one of whose builds names a manifest id."""
        ...

    def keys_of_ask(self, ask: str) -> set[str]:
        """The provision keys whose `ask` is an ask id: one, or none (more only when one is forged)."""
        ...

    def asking(self) -> set[str]:
        """Every provision key that names an ask."""
        ...

    def requirers(self, provision: str) -> set[str]:
        """Every module with a manifest (of any build it registered or built) that requires a provision."""
        ...


def plan_provisions_of(e: Entry | None) -> tuple[tuple[str, str], ...] | None:
    """The (provision, local) pairs of a plans entry, in plan order; None when there is none or it does not decode."""
    record = e.get(r.PlanRecord) if e is not None else None
    return tuple((p.provision, p.local) for p in record.plan.provisions) if record is not None else None


def group_of(state: str, key: str) -> str:
    """The node a key belongs to, for the by-node index: a placement's whole key, a want's second token, else the
    first."""
    if state == PLACEMENT:
        return key  # `0.bad` is no node, and not node `0` either (section 7)
    if state == WANTS:
        parts = key.split(".")
        return parts[1] if len(parts) == 3 else ""
    return k.node_of(key)


def not_a_node(key: str) -> str:
    """Why a placement key is no node ("" when it is one): a node is a placement key that is one token (section 7)."""
    if k.is_token(key):
        return ""
    return (
        f"the placement key {key!r} is no node: a node is one token ([A-Za-z0-9_-]+), so none of the modules placed "
        "under it is composed, counted as placed or chosen as a provider"
    )


def not_nodes(view: View) -> dict[str, str]:
    """Every placement key that is no node, with why (section 7)."""
    return {key: why for key in sorted(view.keys(PLACEMENT)) if (why := not_a_node(key))}


def kept_elsewhere(view: View, key: str) -> bool:
    """Whether a provision key is a credential of the vault's that a provision of another node depends on: a
    provider's shared credential, judged by the nodes that need it and not by its own (section 4, 5.2)."""
    e = view.get(PROVISIONS, key)
    p = e.get(r.Provision) if e is not None else None
    if p is None or p.provider.module != VAULT_MODULE:
        return False
    node = k.node_of(key)
    return any(k.node_of(u) != node for u in view.dependents(key))


class MemoryView:
    """The bus in memory: every state's entries and the indices the rules need, kept as changes arrive."""

    def __init__(self, bound_reads: Iterable[str] = DEFAULT_BOUND_READS) -> None:
        self.bound_reads = tuple(bound_reads)
        self._states: dict[str, dict[str, Entry]] = defaultdict(dict)
        self._by_node: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._placed: dict[str, set[str]] = defaultdict(set)
        self._trunk: dict[str, str] = {}  # module -> its trunk manifest id
        self._offers: dict[str, set[str]] = {}  # module -> what its trunk manifest provides
        self._providers: dict[str, set[str]] = defaultdict(set)  # provision -> modules
        self._by_provider: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._dependents: dict[str, set[str]] = defaultdict(set)
        self._needing: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._by_provider_module: dict[str, set[str]] = defaultdict(set)
        self._by_provider_node: dict[str, set[str]] = defaultdict(set)
        self._naming: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # module -> node -> keys
        self._manifest_users: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._asks: dict[str, set[str]] = defaultdict(set)  # ask id -> keys naming it (a forged one repeats it)
        self._asking: set[str] = set()  # provision keys naming an ask
        self._requiring: dict[str, set[str]] = defaultdict(set)  # provision -> manifest ids requiring it
        self.last_revision = 0  # the highest revision put, for views kept in memory alone

    # ---- reading ----------------------------------------------------------------------------------------

    def get(self, state: str, key: str) -> Entry | None:
        """The entry at a key, None when there is none."""
        entries = self._states.get(state)
        return entries.get(key) if entries is not None else None

    def keys(self, state: str, node: str | None = None) -> Iterable[str]:
        """The keys of a state, or of one node's."""
        if node is None:
            return list(self._states.get(state, {}))
        return list(self._by_node.get(state, {}).get(node, ()))

    def plan_provisions(self, key: str) -> tuple[tuple[str, str], ...] | None:
        """The (provision, local) pairs of the plan at a plans key; None when there is none that decodes."""
        return plan_provisions_of(self.get(PLANS, key))

    def placed_on(self, module: str) -> list[str]:
        """Every node a module is placed on, sorted."""
        return sorted(self._placed.get(module, ()))

    def is_placed(self, module: str, node: str) -> bool:
        """Whether a module is placed on a node."""
        return node in self._placed.get(module, ())

    def is_placed_anywhere(self, module: str) -> bool:
        """Whether a module is placed on any node."""
        return bool(self._placed.get(module))

    def providers_of(self, provision: str) -> set[str]:
        """Every module whose manifest at the trunk provides a provision."""
        return set(self._providers.get(provision, ()))

    def provided_by(self, module: str, node: str) -> set[str]:
        """Every provision key whose provider is a module on a node."""
        return set(self._by_provider.get((module, node), ()))

    def dependents(self, key: str) -> set[str]:
        """Every provision key whose depends-on names a key."""
        return set(self._dependents.get(key, ()))

    def judged_on(self, node: str) -> list[str]:
        """The provision keys a node's composition judges: all of the node's but the shared credentials that other
        nodes depend on, which those nodes judge (section 5.2)."""
        return [key for key in self.keys(PROVISIONS, node) if not kept_elsewhere(self, key)]

    def needing(self, provision: str) -> set[str]:
        """Every node with a plan that names a provision."""
        return {n for n, count in list(self._needing.get(provision, {}).items()) if count > 0}

    def provided_by_module(self, module: str) -> set[str]:
        """Every provision key whose provider is a module, on any node."""
        return set(self._by_provider_module.get(module, ()))

    def provided_on(self, node: str) -> set[str]:
        """Every provision key whose provider is on a node, whatever the module."""
        return set(self._by_provider_node.get(node, ()))

    def nodes_naming(self, module: str) -> set[str]:
        """Every node whose wants or haves name a module."""
        return {n for n, keys in list(self._naming.get(module, {}).items()) if keys}

    def manifest_users(self, manifest: str) -> set[str]:
        """Every module whose registration or one of whose builds names a manifest id."""
        return {m for m, keys in list(self._manifest_users.get(manifest, {}).items()) if keys}

    def keys_of_ask(self, ask: str) -> set[str]:
        """The provision keys whose `ask` is an ask id: one, or none (more only when one is forged)."""
        return set(self._asks.get(ask, ()))

    def asking(self) -> set[str]:
        """Every provision key that names an ask."""
        return self._asking.copy()

    def requirers(self, provision: str) -> set[str]:
        """Every module with a manifest (of any build it registered or built) that requires a provision."""
        return {m for mid in list(self._requiring.get(provision, ())) for m in self.manifest_users(mid)}

    def copy(self) -> MemoryView:
        """A view of its own with the same entries, to judge ahead without touching this one."""
        twin = MemoryView(self.bound_reads)
        for state, entries in list(self._states.items()):
            for key, entry in list(entries.items()):
                twin.apply(state, key, entry)
        twin.last_revision = self.last_revision
        return twin

    def states(self) -> Iterator[str]:
        """Every state that holds a key."""
        return iter([s for s, entries in list(self._states.items()) if entries])

    def __len__(self) -> int:
        return sum(len(e) for e in list(self._states.values()))

    # ---- changing ---------------------------------------------------------------------------------------

    def put(self, state: str, key: str, raw: bytes, revision: int) -> Entry:
        """Keep a key's new value and bring the indices along; answers the entry as kept."""
        entry = entry_of(state, key, raw, revision)
        self.apply(state, key, entry)
        self.last_revision = max(self.last_revision, revision)
        return entry

    def delete(self, state: str, key: str) -> Entry | None:
        """Forget a key; answers the entry it had."""
        return self.apply(state, key, None)

    def apply(self, state: str, key: str, entry: Entry | None) -> Entry | None:
        """Set a key to an entry (None: gone), keeping every index; answers the entry it had."""
        table = self._states[state]
        old = table.get(key)
        if old is None and entry is None:
            return None
        self._unindex(state, key, old)
        if entry is None:
            del table[key]
        else:
            table[key] = entry
            self._index(state, key, entry)
        # What a module provides follows its trunk manifest: its module entry, and the manifest it names.
        if state == MODULES:
            module_entry = entry.get(r.ModuleEntry) if entry is not None else None
            if module_entry is None:
                self._trunk.pop(key, None)
            else:
                self._trunk[key] = module_entry.manifest
            self._reoffer(key)
        elif state == MANIFESTS:
            for module in [m for m, mid in self._trunk.items() if mid == key]:
                self._reoffer(module)
        return old

    def _index(self, state: str, key: str, entry: Entry) -> None:
        self._by_node[state][group_of(state, key)].add(key)
        for index, outer, inner in self._pairs(state, key, entry):
            index[outer][inner].add(key)
        value = entry.value
        if isinstance(value, r.Placement) and k.is_token(key):
            # Section 7: a placement key that is not one token is no node; its modules are placed nowhere.
            for m in value.modules:
                self._placed[m.module].add(key)
        elif isinstance(value, r.Provision):
            self._by_provider[(value.provider.module, value.provider.node)].add(key)
            self._by_provider_module[value.provider.module].add(key)
            self._by_provider_node[value.provider.node].add(key)
            if value.ask:
                self._asks[value.ask].add(key)
                self._asking.add(key)
            for dep in value.depends_on:
                self._dependents[dep].add(key)
        elif isinstance(value, r.PlanRecord):
            for p in value.plan.provisions:
                self._needing[p.provision][k.node_of(key)] += 1
        elif isinstance(value, r.Manifest):
            for req in value.requires:
                self._requiring[req.provision].add(key)

    def _unindex(self, state: str, key: str, entry: Entry | None) -> None:
        if entry is None:
            return
        group = self._by_node[state].get(group_of(state, key))
        if group is not None:
            group.discard(key)
        for index, outer, inner in self._pairs(state, key, entry):
            index[outer][inner].discard(key)
        value = entry.value
        if isinstance(value, r.Placement):
            for m in value.modules:
                self._placed[m.module].discard(key)
        elif isinstance(value, r.Provision):
            self._by_provider[(value.provider.module, value.provider.node)].discard(key)
            self._by_provider_module[value.provider.module].discard(key)
            self._by_provider_node[value.provider.node].discard(key)
            if value.ask:
                named = self._asks.get(value.ask)
                if named is not None:
                    named.discard(key)
                    if not named:
                        del self._asks[value.ask]
            self._asking.discard(key)
            for dep in value.depends_on:
                users = self._dependents.get(dep)
                if users is not None:
                    users.discard(key)
                    if not users:
                        del self._dependents[dep]
        elif isinstance(value, r.PlanRecord):
            for p in value.plan.provisions:
                self._needing[p.provision][k.node_of(key)] -= 1
        elif isinstance(value, r.Manifest):
            for req in value.requires:
                self._requiring[req.provision].discard(key)

    def _pairs(self, state: str, key: str, entry: Entry) -> list[tuple[dict[str, dict[str, set[str]]], str, str]]:
        """The two-level indices a key sits in: a want's or have's module by node; a manifest's users."""
        parts = key.split(".")
        if state == WANTS and len(parts) == 3:
            return [(self._naming, parts[2], parts[1])]
        if state == HAVE and len(parts) == 2:
            return [(self._naming, parts[1], parts[0])]
        if state == MODULES and isinstance(entry.value, r.ModuleEntry) and entry.value.manifest:
            return [(self._manifest_users, entry.value.manifest, key)]
        if state == BUILDS and isinstance(entry.value, r.Build) and entry.value.manifest and len(parts) == 2:
            return [(self._manifest_users, entry.value.manifest, parts[0])]
        return []

    def _reoffer(self, module: str) -> None:
        for provision in self._offers.pop(module, ()):
            self._providers[provision].discard(module)
        offers = {o.name for o in self.trunk_manifest(module)[0].offers()} if module in self._trunk else set()
        offers.discard("")
        self._offers[module] = offers
        for provision in offers:
            self._providers[provision].add(module)

    def trunk_manifest(self, module: str) -> tuple[r.Manifest, str]:
        """A module's manifest at the trunk and "", or an empty one and why it cannot be read."""
        return trunk_manifest(self, module)


def trunk_manifest(view: View, module: str) -> tuple[r.Manifest, str]:
    """A module's manifest at the trunk (the indexer's) and "", or an empty manifest and why it cannot be read."""
    me = view.get(MODULES, module)
    if me is None:
        return r.Manifest(), f"the indexer holds no modules.{module}"
    entry = me.get(r.ModuleEntry)
    if entry is None:
        return r.Manifest(), me.error
    if not entry.manifest:
        return r.Manifest(), f"the indexer's modules.{module} names no manifest"
    return manifest(view, entry.manifest, module)


def manifest(view: View, mid: str, module: str) -> tuple[r.Manifest, str]:
    """The manifest with an id and "", or an empty manifest and why it cannot be read."""
    e = view.get(MANIFESTS, mid)
    if e is None:
        return r.Manifest(), f"the indexer holds no manifest of {module} ({mid})"
    m = e.get(r.Manifest)
    if m is None:
        return r.Manifest(), f"the manifest of {module} ({mid}) does not parse: {e.error}"
    return m, ""


class Overlay:
    """A view with one composition's own writes laid over it, so its later judgements read its earlier ones.

    Only `get` sees the writes; the indices answer as the view below does, which is what the composition
    judged from.
    """

    def __init__(self, base: View) -> None:
        self.base = base
        self.bound_reads = base.bound_reads
        self._over: dict[tuple[str, str], Entry | None] = {}

    def lay(self, state: str, key: str, raw: bytes | None) -> None:
        """Lay a write over the view: a value, or None for a delete."""
        self._over[(state, key)] = None if raw is None else entry_of(state, key, raw, 0)

    def get(self, state: str, key: str) -> Entry | None:
        """The entry at a key, with this composition's writes."""
        if self._over and (state, key) in self._over:
            return self._over[(state, key)]
        return self.base.get(state, key)

    def keys(self, state: str, node: str | None = None) -> Iterable[str]:
        """The keys of the view below."""
        return self.base.keys(state, node)

    def plan_provisions(self, key: str) -> tuple[tuple[str, str], ...] | None:
        """A plan's provisions, with this composition's writes."""
        if self._over and (PLANS, key) in self._over:
            return plan_provisions_of(self._over[(PLANS, key)])
        return self.base.plan_provisions(key)

    def placed_on(self, module: str) -> list[str]:
        """As the view below."""
        return self.base.placed_on(module)

    def is_placed(self, module: str, node: str) -> bool:
        """As the view below."""
        return self.base.is_placed(module, node)

    def is_placed_anywhere(self, module: str) -> bool:
        """As the view below."""
        return self.base.is_placed_anywhere(module)

    def providers_of(self, provision: str) -> set[str]:
        """As the view below."""
        return self.base.providers_of(provision)

    def provided_by(self, module: str, node: str) -> set[str]:
        """As the view below."""
        return self.base.provided_by(module, node)

    def dependents(self, key: str) -> set[str]:
        """As the view below."""
        return self.base.dependents(key)

    def judged_on(self, node: str) -> list[str]:
        """As the view below."""
        return self.base.judged_on(node)

    def needing(self, provision: str) -> set[str]:
        """As the view below."""
        return self.base.needing(provision)

    def provided_by_module(self, module: str) -> set[str]:
        """As the view below."""
        return self.base.provided_by_module(module)

    def provided_on(self, node: str) -> set[str]:
        """As the view below."""
        return self.base.provided_on(node)

    def nodes_naming(self, module: str) -> set[str]:
        """As the view below."""
        return self.base.nodes_naming(module)

    def manifest_users(self, manifest: str) -> set[str]:
        """As the view below."""
        return self.base.manifest_users(manifest)

    def keys_of_ask(self, ask: str) -> set[str]:
        """As the view below."""
        return self.base.keys_of_ask(ask)

    def asking(self) -> set[str]:
        """As the view below."""
        return self.base.asking()

    def requirers(self, provision: str) -> set[str]:
        """As the view below."""
        return self.base.requirers(provision)
