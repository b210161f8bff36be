"""Tables of what the seat keeps, for a person: plans, provisions and refusals read from a view of the bus."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.view import PLANS, PROVISIONS, REFUSED, View


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Rows under a header, in columns as wide as their widest cell."""
    body = [list(header), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in body) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in body)


def _wanted(key: str, node: str, module: str) -> bool:
    parts = key.split(".")
    return (not node or parts[0] == node) and (not module or (len(parts) > 1 and parts[1] == module))


def provision_rows(view: View, node: str = "", module: str = "", state: str = "") -> list[list[str]]:
    """One row per provision: key, state, provider, why."""
    rows = []
    for key in sorted(view.keys(PROVISIONS)):
        e = view.get(PROVISIONS, key)
        p = e.get(r.Provision) if e is not None else None
        if p is None or not _wanted(key, node, module) or (state and p.state != state):
            continue
        extra = p.why or (f"ask {p.ask}" if p.ask else "")
        rows.append([key, p.state, f"{p.provider.module}@{p.provider.node}", extra])
    return rows


def plan_rows(view: View, node: str = "", module: str = "") -> list[list[str]]:
    """One row per plan provision: plan key, provision, local, provider, credential."""
    rows = []
    for key in sorted(view.keys(PLANS)):
        e = view.get(PLANS, key)
        plan = e.get(r.PlanRecord) if e is not None else None
        if plan is None or not _wanted(key, node, module):
            continue
        for p in plan.plan.provisions or ():
            rows.append([key, p.provision, p.local, f"{p.provider_module}@{p.provider}", p.credential])
        if not plan.plan.provisions:
            rows.append([key, "(needs nothing)", "", "", ""])
    return rows


def refused_rows(view: View, node: str = "", module: str = "") -> list[list[str]]:
    """One row per held module: key, since, why."""
    rows = []
    for key in sorted(view.keys(REFUSED)):
        e = view.get(REFUSED, key)
        ref = e.get(r.Refusal) if e is not None else None
        if ref is None or not _wanted(key, node, module):
            continue
        rows.append([key, ref.since.isoformat() if ref.since else "", ref.why])
    return rows


def tables(view: View) -> str:
    """The plans, provisions and refusals of a view, each under its title."""
    return "\n\n".join([
        "Plans\n" + table(["plan", "provision", "local", "provider", "credential"], plan_rows(view)),
        "Provisions\n" + table(["key", "state", "provider", "why"], provision_rows(view)),
        "Refused\n" + table(["module", "since", "why"], refused_rows(view)),
    ])


__all__ = ["plan_rows", "provision_rows", "refused_rows", "table", "tables"]
