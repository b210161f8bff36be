"""The bus in memory: `MemoryView`, every state's entries and the indices the rules need, kept as changes arrive.

The bus layer fills it from key-value watches (bus/cache.py), tests and `settle` fill it directly. Each change keeps
every index of design.md at once (provision keys by node, by provider and by what they depend on; modules by the
provision their trunk manifest provides; nodes by placed module), so that no rule scans every key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from mesh_provisioner.contract import BUILDS, DEFAULT_BOUND_READS, HAVE, MANIFESTS, MODULES, PLANS, PROVISIONS, WANTS
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import (
    Entry,
    View,
    entry_of,
    group_of,
    kept_elsewhere,
    plan_provisions_of,
    trunk_manifest,
)


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

    def unrecorded(self) -> MemoryView:
        """This view: it records nothing."""
        return self

    def judging(self, key: str, below: View | None = None) -> View:
        """The view a key's judgment reads within a composition: `below`, or this view (it records nothing)."""
        return self if below is None else below

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
