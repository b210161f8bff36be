"""What a process of a partitioned seat keeps in memory (contract 8.1): the keys its compositions and judgments read.

A process composes the nodes of the shards it holds and judges their keys. Of another node, those read only:

- the providers' modules' plans, wants, haves and provisions: a consumer's depends-on follows its provider's plan and
  names the provider's own keys (section 4), and a key is judged by its provider's have, want and keys (5.1);
- the provisions whose depends-on names a key of a node it holds: who depends on its keys (a shared credential is
  made from them, and kept while one of another node needs it, 5.2);
- the placements and the catalogue, which every composition reads; nothing of another node's providers' entries,
  its resolutions, its refusals.

A provider's module is mesh-vault (every credential's provider, section 4), a module whose trunk manifest offers a
provision, or a module a provision of a node it holds names as its provider (one that offered when the key was
made). Which modules those are changes with the catalogue (`mesh-indexer.modules`, `mesh-indexer.manifests`) and
with those provisions: a change that may make a module one is applied only once what is kept of that module's keys
was read again (`Kept.widens`), or a composition would choose it as a provider and judge its keys from nothing.
Pure: the cache applies it (bus/cache.py, runtime.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Final

import msgspec

from mesh_provisioner.contract import (
    HAVE,
    MANIFESTS,
    MODULES,
    PLANS,
    PROVISIONS,
    REFUSED,
    RESOLVED,
    VAULT_MODULE,
    WANTS,
    bound,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.view import Entry, View, entry_of, manifest, trunk_manifest

# The states kept by node: what a process keeps of them depends on the shards it holds, and is read again when it
# takes more (runtime.py `took`).
NODE_KEPT: Final = (PLANS, PROVISIONS, REFUSED, WANTS, HAVE, RESOLVED)
# The states kept with their providers' modules: read again when a module may become one (`widened_by`).
PROVIDER_KEPT: Final = (PLANS, PROVISIONS, WANTS, HAVE)
# The states which modules offer provisions depends on: read before the others.
CATALOGUE: Final = (MODULES, MANIFESTS)


def kept_states(bound_reads: Iterable[str]) -> tuple[str, ...]:
    """Every state of which a partitioned process keeps only some keys: the providers' entries and `NODE_KEPT`."""
    return (*(bound(p) for p in bound_reads), *NODE_KEPT)


class _Provider(msgspec.Struct, frozen=True):
    """A provision's provider's module alone."""

    module: str = ""


class _Named(msgspec.Struct, frozen=True):
    """Of a provision, all `kept` and `Kept.widens` read: what it depends on, and its provider."""

    depends_on: tuple[str, ...] = msgspec.field(default=(), name="depends-on")
    provider: _Provider = _Provider()


_named = msgspec.json.Decoder(_Named)


def _named_by(raw: bytes) -> _Named | None:
    """What a provision's value names, None when it does not decode (section 7: it is kept, read with why)."""
    try:
        return _named.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def offers(view: View, module: str) -> bool:
    """Whether a module's trunk manifest offers a provision: whether it is a provider's module."""
    return any(o.name for o in trunk_manifest(view, module)[0].offers())


def providers(view: View, holds: Callable[[str], bool]) -> set[str]:
    """The providers' modules for a process holding the nodes `holds` says: mesh-vault, every module the catalogue
    says offers a provision, and every module a provision of those nodes names as its provider."""
    named = {p.provider.module for key in view.keys(PROVISIONS) if holds(key.partition(".")[0])
             if (e := view.get(PROVISIONS, key)) is not None and (p := e.get(r.Provision)) is not None}
    return {VAULT_MODULE, *(m for m in view.keys(MODULES) if offers(view, m)), *named} - {""}


def widened_by(view: View, state: str, key: str, entry: Entry | None) -> set[str]:
    """The modules a change of the catalogue may make providers' modules, `view` being the bus before it: a module
    entry naming a manifest that offers, or a manifest that offers for every module naming it (a superset)."""
    if entry is None:
        return set()
    if state == MODULES:
        me = entry.get(r.ModuleEntry)
        if me is None or not me.manifest:
            return set()
        return {key} if any(o.name for o in manifest(view, me.manifest, key)[0].offers()) else set()
    if state == MANIFESTS:
        m = entry.get(r.Manifest)
        if m is None or not any(o.name for o in m.offers()):
            return set()
        return view.manifest_users(key)
    return set()


def kept(state: str, key: str, raw: bytes, holds: Callable[[str], bool], provider: Collection[str],
         bound_states: Collection[str]) -> bool:
    """Whether a process holding the nodes `holds` says keeps a key at this value, `provider` the providers' modules
    (a superset will do); `bound_states` are the providers' `<provider>.bound`."""
    if state in bound_states or state in (RESOLVED, REFUSED):
        return holds(key.partition(".")[0])
    if state not in PROVIDER_KEPT:
        return True
    parts = key.split(".")
    if state == WANTS:
        parts = parts[1:]  # want.<node>.<module>
    if not parts or holds(parts[0]):
        return True
    if len(parts) > 1 and parts[1] in provider:
        return True
    if state != PROVISIONS:
        return False
    named = _named_by(raw)
    return named is None or any(holds(d.partition(".")[0]) for d in named.depends_on)


class Kept:
    """What one process keeps (`kept`), the providers' modules growing with the catalogue and the provisions of its
    nodes: a module once one stays one (more is kept than is read, never less)."""

    deciding: tuple[str, ...] = CATALOGUE
    widening: tuple[str, ...] = (*CATALOGUE, PROVISIONS)

    def __init__(self, view: View, holds: Callable[[str], bool]) -> None:
        """What a process keeps of the bus `view` is filled from, holding the nodes `holds` says."""
        self.view = view
        self.holds = holds
        self.providers = providers(view, holds)
        self._bound_states = frozenset(bound(p) for p in view.bound_reads)

    def keeps(self, state: str, key: str, raw: bytes) -> bool:
        """Whether memory keeps a key at this value (`kept`)."""
        return kept(state, key, raw, self.holds, self.providers, self._bound_states)

    def widens(self, state: str, key: str, raw: bytes | None) -> tuple[str, ...]:
        """The states to read again before a change is applied: those kept with the providers' modules when it may
        make a module one (a catalogue change, `widened_by`; a provision of a held node naming its provider); none
        for any other change."""
        if raw is None:
            return ()
        if state == PROVISIONS:
            if not self.holds(key.partition(".")[0]):
                return ()
            named = _named_by(raw)
            new = {named.provider.module} - {""} if named is not None else set()
        elif state in CATALOGUE:
            new = widened_by(self.view, state, key, entry_of(state, key, raw, 0))
        else:
            return ()
        new -= self.providers
        if not new:
            return ()
        self.providers |= new
        return PROVIDER_KEPT
