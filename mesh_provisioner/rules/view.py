"""The read-only view of the bus the rules judge from: the `View` protocol, a key's `Entry` decoded once, and the
readings every rule shares.

A `View` answers a state's value at a key with its revision, lists a state's keys (all, or one node's), and
keeps the indices of design.md so that no rule scans every key: provision keys by node, by provider and by
what they depend on; modules by the provision they provide; nodes by placed module. Values are decoded once, when
they arrive (`entry_of`); one that does not decode is kept with why, so a rule can name it (section 7). The view
in memory is `memory_view.MemoryView`; a composition's own writes laid over a view, `overlay.Overlay`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol, TypeVar

import msgspec

from mesh_provisioner.contract import (
    ASK_RECORDS,
    BUILDS,
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

    def unrecorded(self) -> View:
        """The same view, what is read through it not recorded as the judgment's (rules/reads.py): for what another
        judgment reads and answers for (a key's outcome, which the key's own judgment keeps)."""
        ...

    def judging(self, key: str, below: View | None = None) -> View:
        """The view one key's judgment reads within a composition (`below`, default this view unrecorded): what is
        read through it is recorded as that key's own judgment's read set (rules/reads.py), not the composition's."""
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
