"""A key's state comes from its provider's outcome alone (contract 5.3; the seeds' clauses 3 and 7).

A provider whose trunk manifest declares `bound` keeps its outcome for each consumer in `<provider>.bound` under the
same key (only for its helper's offers, when any offer says `answered-by: helper`); any other provider is judged by
its own have, once all the key depends on is provided. The seat never sets `provided` by itself.
"""

from __future__ import annotations

import msgspec

from mesh_provisioner.contract import HAVE, PLANS, PROVISIONS, WANTS, bound
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import View, trunk_manifest
from mesh_provisioner.rules.writing import said

HELPER = "helper"


def keeps_entries_for(manifest: r.Manifest, provision: str) -> bool:
    """Whether a provider's outcome for a provision is its entries rather than its own have (the seeds' keepsEntries).

    It must declare the state `bound`. When any offer says `answered-by: helper`, only those offers are answered by
    its entries: the helper's silence on an offer it does not run never becomes that provision's outcome.
    """
    if "bound" not in manifest.states():
        return False
    helped = [o.name for o in manifest.offers() if o.answered_by == HELPER]
    return not helped or provision in helped


def keeps_entries(view: View, module: str, provision: str) -> tuple[bool, str]:
    """keeps_entries_for over a provider's manifest at the trunk; False and why when it cannot be read."""
    manifest, why = trunk_manifest(view, module)
    if why:
        return False, why
    return keeps_entries_for(manifest, provision), ""


def unread(view: View, module: str) -> str:
    """Why a provider's helper never answers: its manifest reads no plans of the seat; "" when it does or cannot say."""
    manifest, why = trunk_manifest(view, module)
    if why or PLANS in manifest.reads:
        return ""
    return (
        f"{module} reads no plans of the seat (its manifest's reads do not name {PLANS}), "
        "so its helper never answers this key"
    )


def outcome(view: View, key: str, p: r.Provision) -> r.Provision:
    """A needed provision with its state set from its provider's entry: provided, failed or waits; asked while none.

    Its ask and warrant are cleared (they belong to a retiring key), in the one copy that sets its state.
    """
    keeps, why = keeps_entries(view, p.provider.module, p.provision)
    if why:
        return _asked(p, f"the manifest of {p.provider.module} cannot be read: {why}")
    if not keeps:
        return have_outcome(view, p)
    if p.provider.module not in view.bound_reads:
        return _asked(
            p,
            f"{p.provider.module} keeps its outcome in its entries, "
            "which mesh-provisioner's manifest does not read yet",
        )
    e = view.get(bound(p.provider.module), key)
    if e is None:
        # Every asked key says why (design.md, property 2): the helper cannot hear the seat, or has not answered.
        module = p.provider.module
        waiting = f"waits for {module} to answer: its entries hold nothing for {key} yet"
        return _asked(p, unread(view, module) or waiting)
    en = e.get(r.BoundEntry)
    if en is None:
        return _asked(p, f"the provider's entry is not readable: {e.error}")
    if en.state == r.FAILED:
        return _set(p, r.FAILED, said(en.why, en.refused, "the provider said it failed"))
    if en.state == r.WAITS:
        return _set(p, r.WAITS, said(en.why, en.waits, "the provider waits for a person"))
    if en.state == "" and en.refused:
        return _set(p, r.FAILED, en.refused)
    if en.state == "" and en.waits:
        return _set(p, r.WAITS, en.waits)
    if en.state not in ("", r.PROVIDED):
        return _asked(p, f"the provider's entry says {en.state}, which no state of a provision is")
    reference = p.reference
    if en.vault_name or en.generation > 0:
        reference = r.Reference(id=en.vault_name, generation=en.generation)
    return msgspec.structs.replace(p, state=r.PROVIDED, why="", reference=reference, ask="", warrant=None)


def have_outcome(view: View, p: r.Provision) -> r.Provision:
    """The outcome of a provider judged by its own have: provided only running healthy at its wanted build.

    It makes what the consumer needs only once all it depends on is provided, its credential first.
    """
    where = f"{p.provider.module} on {p.provider.node}"
    for dep in p.depends_on:
        state = "not composed yet"
        e = view.get(PROVISIONS, dep)
        if e is not None:
            d = e.get(r.Provision)
            state = d.state if d is not None else "not readable"
        if state != r.PROVIDED:
            return _asked(p, f"waits for {dep} ({state}) before {where} can provide it")
    try:
        have_key = k.plan_key(p.provider.node, p.provider.module)
    except k.BadKey as err:
        return _asked(p, f"the have of {where} cannot be read: {err}")
    e = view.get(HAVE, have_key)
    if e is None:
        return _asked(p, f"waits for {where} to run: it says nothing yet")
    have = e.get(r.Have)
    if have is None:
        return _asked(p, f"the have of {where} is not readable: {e.error}")
    want_fp = ""
    we = view.get(WANTS, "want." + have_key)
    want = we.get(r.Want) if we is not None else None
    if want is not None and not want.removed:
        want_fp = want.fp
    if have.phase == r.PHASE_FAILED or have.health == r.HEALTH_FAILED:
        return _set(p, r.FAILED, said(have.detail, f"{where} failed"))
    if have.phase == r.PHASE_RUNNING and have.health == r.HEALTH_OK and (not want_fp or have.fp == want_fp):
        return _set(p, r.PROVIDED, "")
    return _asked(
        p,
        f"waits for {where} to run healthy at the build its want names (it is {have.phase}, health {have.health})",
    )


def _asked(p: r.Provision, why: str) -> r.Provision:
    return _set(p, r.ASKED, why)


def _set(p: r.Provision, state: str, why: str) -> r.Provision:
    """The provision with a state and why, and no ask or warrant: a needed key's outcome is never retiring."""
    return msgspec.structs.replace(p, state=state, why=why, ask="", warrant=None)
