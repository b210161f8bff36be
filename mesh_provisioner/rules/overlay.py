"""A composition's own writes laid over a view (`Overlay`), so that its later judgements read its earlier ones."""

from __future__ import annotations

from collections.abc import Iterable

from mesh_provisioner.contract import PLANS
from mesh_provisioner.rules.view import Entry, View, entry_of, plan_provisions_of


class Overlay:
    """A view with one composition's own writes laid over it, so its later judgements read its earlier ones.

    Only `get` sees the writes; the indices answer as the view below does, which is what the composition
    judged from.
    """

    def __init__(self, base: View) -> None:
        self.base = base
        self.bound_reads = base.bound_reads
        self._over: dict[tuple[str, str], Entry | None] = {}

    def unrecorded(self) -> Overlay:
        """The same writes over the view below's unrecorded view."""
        quiet = Overlay(self.base.unrecorded())
        quiet._over = self._over
        return quiet

    def judging(self, key: str, below: View | None = None) -> View:
        """The view a key's judgment reads within a composition: these writes over the view below, recorded as the
        key's own (rules/view.py `judging`)."""
        return self.base.judging(key, self.unrecorded() if below is None else below)

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
