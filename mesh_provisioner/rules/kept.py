"""What a process of a partitioned seat keeps in memory (contract 8.1): the keys its compositions and judgments read.

A process composes the nodes of the shards it holds and judges their keys. Of another node, those read only:

- the providers' modules' plans, wants, haves and provisions: a consumer's depends-on follows its provider's plan and
  names the provider's own keys (section 4), and a key is judged by its provider's have, want and keys (5.1);
- the provisions whose depends-on names a key of a node it holds: who depends on its keys (a shared credential is
  made from them, and kept while one of another node needs it, 5.2);
- the placements and the catalogue, which every composition reads; nothing of another node's providers' entries,
  its resolutions, its refusals.

A provider's module is one whose trunk manifest offers a provision. Which modules those are changes only with the
catalogue (`mesh-indexer.modules`, `mesh-indexer.manifests`): a change that may make a module offer one is applied
only once what is kept of that module's keys was read again (`widened_by`), or a composition would choose it as a
provider and judge its keys from nothing. Pure: the cache applies it (bus/cache.py, runtime.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Final

import msgspec

from mesh_provisioner.contract import HAVE, MANIFESTS, MODULES, PLANS, PROVISIONS, REFUSED, RESOLVED, WANTS, bound
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.view import Entry, View, entry_of, manifest, trunk_manifest

# The states kept by node: what a process keeps of them depends on the shards it holds, and is read again when it
# takes more (runtime.py `took`).
NODE_KEPT: Final = (PLANS, PROVISIONS, REFUSED, WANTS, HAVE, RESOLVED)
# The states kept with their providers' modules: read again when a module may become one (`widened_by`).
PROVIDER_KEPT: Final = (PLANS, PROVISIONS, WANTS, HAVE)
# The states which modules are providers' depends on: read before the others, and followed through `widened_by`.
CATALOGUE: Final = (MODULES, MANIFESTS)


def kept_states(bound_reads: Iterable[str]) -> tuple[str, ...]:
    """Every state of which a partitioned process keeps only some keys: the providers' entries and `NODE_KEPT`."""
    return (*(bound(p) for p in bound_reads), *NODE_KEPT)


class _DependsOn(msgspec.Struct, frozen=True):
    """A provision's depends-on alone: all `kept` reads of another node's provision that no provider's module wrote."""

    depends_on: tuple[str, ...] = msgspec.field(default=(), name="depends-on")


_depends_on = msgspec.json.Decoder(_DependsOn)


def offers(view: View, module: str) -> bool:
    """Whether a module's trunk manifest offers a provision: whether it is a provider's module."""
    return any(o.name for o in trunk_manifest(view, module)[0].offers())


def providers(view: View) -> set[str]:
    """Every module the catalogue says offers a provision."""
    return {m for m in view.keys(MODULES) if offers(view, m)}


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
    try:
        depends_on = _depends_on.decode(raw).depends_on
    except (msgspec.DecodeError, msgspec.ValidationError):
        return True  # read as it is, with why it does not decode (section 7)
    return any(holds(d.partition(".")[0]) for d in depends_on)


class Kept:
    """What one process keeps (`kept`), the providers' modules growing with the catalogue: a module once one stays
    one (more is kept than is read, never less)."""

    deciding: tuple[str, ...] = CATALOGUE

    def __init__(self, view: View, holds: Callable[[str], bool]) -> None:
        """What a process keeps of the bus `view` is filled from, holding the nodes `holds` says."""
        self.view = view
        self.holds = holds
        self.providers = providers(view)
        self._bound_states = frozenset(bound(p) for p in view.bound_reads)

    def keeps(self, state: str, key: str, raw: bytes) -> bool:
        """Whether memory keeps a key at this value (`kept`)."""
        return kept(state, key, raw, self.holds, self.providers, self._bound_states)

    def widens(self, state: str, key: str, raw: bytes | None) -> tuple[str, ...]:
        """The states to read again before a change of the catalogue is applied: those kept with the providers'
        modules when it may make a module one (`widened_by`); none for any other change."""
        if state not in CATALOGUE or raw is None:
            return ()
        new = widened_by(self.view, state, key, entry_of(state, key, raw, 0)) - self.providers
        if not new:
            return ()
        self.providers |= new
        return PROVIDER_KEPT
