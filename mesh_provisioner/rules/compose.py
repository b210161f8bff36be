"""Composing a node's plans (contract 5.1, `Compose(node, keptAt)`): each module's build, manifest and providers.

A module whose registration, build record or manifest is missing or unreadable, whose manifest is of the wrong
shape, or for one of whose needs no provider can be chosen, is held with a why that says which; the other modules
of the node compose (the seeds' issue 774: one bad module must not drop its node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from mesh_provisioner.contract import BUILDS, MODULES, PLACEMENT, RESOLVED
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import View, manifest

CREDENTIAL_FORMS = ("", "own", "shared")

T = TypeVar("T")


class CannotCompose(Exception):
    """The node's placement cannot be read: nothing is written for the node (5.1, 4)."""


class Composition(msgspec.Struct, frozen=True):
    """A node's plans by module, and each module held with why."""

    plans: dict[str, r.Plan]
    held: dict[str, str]


class Memo:
    """What one composition of a node works out once for both of its compositions (at its wants, at the newest
    builds): each module's plan at a build, and whether and where each provision is offered. Kept for one view,
    never longer."""

    def __init__(self) -> None:
        self.plans: dict[tuple[str, str], tuple[r.Plan | None, str]] = {}
        self.providers: dict[str, list[str]] = {}
        self.anywhere: dict[str, bool] = {}
        self.offered: dict[str, dict[str, list[str]]] = {}


def registered_fp(view: View, module: str) -> str:
    """The build the indexer registers a module at, "" when it cannot be read."""
    me = view.get(MODULES, module)
    entry = me.get(r.ModuleEntry) if me is not None else None
    return entry.fp if entry is not None else ""


def placed(view: View, node: str) -> list[str]:
    """The modules placed on a node; raises CannotCompose when its placement does not decode."""
    e = view.get(PLACEMENT, node)
    if e is None:
        return []
    placement = e.get(r.Placement)
    if placement is None:
        raise CannotCompose(f"the placement of {node} cannot be read: {e.error}")
    return [m.module for m in placement.modules]


def compose(view: View, node: str, kept_at: dict[str, str], memo: Memo | None = None) -> Composition:
    """Each module's plan on a node at the builds kept_at names, the newest build of every other (5.1).

    With a memo, a module's plan at a build is composed once for both compositions of the node: a module wanted at
    the build the indexer registers composes the same either way.
    """
    modules = sorted(set(placed(view, node)) | set(kept_at))
    plans: dict[str, r.Plan] = {}
    held: dict[str, str] = {}
    for module in modules:
        fp = kept_at.get(module, "")
        build = (module, fp or registered_fp(view, module)) if memo is not None else None
        if memo is not None and build is not None and build[1] and build in memo.plans:
            plan, why = memo.plans[build]
        else:
            plan, why = compose_module(view, node, module, fp, memo)
            if memo is not None and build is not None and build[1]:
                memo.plans[build] = (plan, why)
        if plan is None:
            held[module] = why
        else:
            plans[module] = plan
    return Composition(plans, held)


def build_manifest(view: View, module: str, fp: str) -> tuple[r.Manifest | None, str]:
    """A module's manifest at a build (its registered one when fp is ""), or None and which record is missing."""
    if not k.is_token(module):
        return None, f"{module!r} is not a module name (a token)"
    if not fp:
        me = view.get(MODULES, module)
        if me is None:
            return None, f"the indexer registers no build of {module}: mesh-indexer.modules has no {module}"
        entry = me.get(r.ModuleEntry)
        if entry is None:
            return None, me.error
        if not entry.fp:
            return None, f"the indexer's modules.{module} names no build"
        fp = entry.fp
    if not k.is_token(fp):
        return None, f"the build {fp!r} of {module} is not a fingerprint (a token)"
    be = view.get(BUILDS, f"{module}.{fp}")
    if be is None:
        return None, f"the builder holds no build {module}.{fp}"
    build = be.get(r.Build)
    if build is None:
        return None, be.error
    if not build.manifest:
        return None, f"the build {module}.{fp} names no manifest"
    found, why = manifest(view, build.manifest, module)
    return (None, why) if why else (found, "")


def shape_problem(m: r.Manifest) -> str:
    """Why a manifest's requirements are of the wrong shape (section 3), "" when they are not."""
    for req in m.requires:
        if not k.is_token(req.provision):
            return f"a requirement names {req.provision!r}, which is not a provision (a token)"
        if req.local and not k.is_token(req.local):
            return f"the requirement {req.provision} has local {req.local!r}, which is not a token"
        if req.provision.endswith(k.CREDENTIAL_SUFFIX):
            # Section 4: `<p>-credential` is the key of p's credential, which the vault provides through the
            # credential form; a requirement of that name would share its key and never settle.
            return (
                f"the requirement {req.provision} names a credential, which the vault provides to a requirement "
                "through its credential form (own or shared), never as a provision of its own"
            )
        if req.credential not in CREDENTIAL_FORMS:
            return (
                f"the requirement {req.provision} says credential {req.credential!r}, which is neither own nor shared"
            )
    return ""


def compose_module(
    view: View, node: str, module: str, fp: str, memo: Memo | None = None
) -> tuple[r.Plan | None, str]:
    """A module's plan on a node at a build ("" for its newest), or None and why it is held."""
    m, why = build_manifest(view, module, fp)
    if m is None:
        return None, why
    shape = shape_problem(m)
    if shape:
        return None, f"the manifest of {module} is not usable: {shape}"
    # A resolved value that does not decode holds the module even when it needs no provider chosen (section 7):
    # the seat never composes on an input it could not read.
    _, unreadable = resolved_node(view, node, module, "")
    if unreadable:
        return None, unreadable
    chosen: dict[tuple[str, str], r.PlanProvision] = {}
    reasons: list[str] = []
    for req in m.requires:
        provider, why = choose_provider(view, node, module, req.provision, memo)
        if provider is None:
            reasons.append(why)
            continue
        pnode, pmodule = provider
        chosen[(req.provision, req.local)] = r.PlanProvision(
            provision=req.provision, local=req.local, provider=pnode, provider_module=pmodule,
            credential=req.credential,
        )
    if reasons:
        return None, "; ".join(dict.fromkeys(reasons))
    return r.Plan(provisions=tuple(chosen[key] for key in sorted(chosen))), ""


def choose_provider(
    view: View, node: str, module: str, provision: str, memo: Memo | None = None
) -> tuple[tuple[str, str] | None, str]:
    """The (node, module) that provides a provision to a module on a node, or None and why none can be chosen.

    Among the modules whose trunk manifest provides it and the nodes they are placed on: the node mesh-config
    resolves for this module on this node, else the consumer's own node, else the one node where one is placed.
    Two providers on the chosen node: the first by name (5.1, 3).
    """
    m = memo if memo is not None else Memo()  # without one, each answer is worked out for this choice alone
    providers = _kept(m.providers, provision, lambda: sorted(view.providers_of(provision)))
    here = [p for p in providers if view.is_placed(p, node)]
    if not here and not _kept(m.anywhere, provision, lambda: any(view.is_placed_anywhere(p) for p in providers)):
        return None, f"no placed module provides {provision}"
    resolved, why = resolved_node(view, node, module, provision)
    if why:
        return None, why
    if resolved:
        there = [p for p in providers if view.is_placed(p, resolved)]
        if there:
            return (resolved, there[0]), ""
    if here:
        return (node, here[0]), ""
    # Every node where it is offered: read only when the nodes at hand do not decide, as it lists them all.
    on = _kept(m.offered, provision, lambda: offered_on(view, provision, providers))
    if len(on) == 1:
        only = next(iter(on))
        return (only, on[only][0]), ""
    nodes = ", ".join(sorted(on))
    return None, (
        f"{provision} is provided on several nodes ({nodes}) and mesh-config resolves none for {module} on {node}"
    )


def _kept(answers: dict[str, T], provision: str, work_out: Callable[[], T]) -> T:
    """A memo's answer for a provision, worked out and kept the first time it is asked for."""
    if provision not in answers:
        answers[provision] = work_out()
    return answers[provision]


def offered_on(view: View, provision: str, providers: list[str] | None = None) -> dict[str, list[str]]:
    """Each node where a provision is offered, and the modules placed there that offer it, by name."""
    on: dict[str, list[str]] = {}
    for provider in providers if providers is not None else sorted(view.providers_of(provision)):
        for pnode in view.placed_on(provider):
            on.setdefault(pnode, []).append(provider)
    return on


def resolved_node(view: View, node: str, module: str, provision: str) -> tuple[str, str]:
    """The node mesh-config names for a module's provision on a node ("" when none), or why it cannot be read."""
    e = view.get(RESOLVED, f"{node}.{module}")
    if e is None:
        return "", ""
    resolved = e.get(r.Resolved)
    if resolved is None:
        return "", f"{RESOLVED} {node}.{module} cannot be read, so no provider is chosen: {e.error}"
    return resolved.providers.get(provision, ""), ""
