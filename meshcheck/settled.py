"""A bus compared with `settle()` of its final inputs, key by key, and with its own fixed point: what the
differential tests (tests/support/differential.py) and the fault runner's checks (meshcheck/check.py) share.

`expected(inputs)` is `settle()` (mesh_provisioner/rules/settle.py) over a view holding only the final inputs: what
the seat's states hold when nothing came before. `compare(expected, actual)` names every key of the seat's states
(plans, provisions, refusals) where a bus that reached the same inputs through some history differs from it, but
what the contract lets history decide:

- a provision key in state `retiring` (5.4: a key needed only in an intermediate state turns retiring and stays,
  asking the operator, until the operator approves), and its ask and warrant;
- a module held at its wanted build (5.2: its last plan and provisions are kept as they were): its plan, and its
  provision keys that the composition does not need;
- a node whose placement does not decode (5.1.4: nothing is written for it): its plans, refusals and keys;
- a key that one of the above depends on, directly or in turn (5.2: a key another node's provision depends on stays
  needed, held modules' provisions included): it may be on one side only;
- a key the bus holds and settle() does not, which a provision settle() makes on another node depends on (5.2: it
  stays needed once made; section 4: a credential's key is named even while no node runs mesh-vault, so a shared
  credential made while mesh-vault was placed stays), and what it depends on in turn;
- a provision whose provider is on another node and is held there, or on a node whose placement does not decode
  (section 4: depends-on follows the provider's plan in `plans`, which history kept): its depends-on, state and why;
- a provision judged by its provider's have (5.3: after every key it depends on is provided) that depends on a key
  of the above: its state and why;
- times and stamps: a provision's `at` and `v` (section 4: two provisions are the same with them aside), a
  refusal's `since`.

A key that history may leave on one side only is still compared, field by field, when both sides have it.

`off_fixed_point(view)` is the history-free check: `settle()` over a bus as it is (inputs and the seat's own states)
writes nothing when the bus is at the seat's fixed point (contract section 6).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import msgspec

from mesh_provisioner.contract import OWN, PLACEMENT, PLANS, PROVISIONS, REFUSED
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.judge import keeps_entries
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.settle import settle

Inputs = dict[tuple[str, str], bytes]

# The fields a provision may differ in, by why (the module's docstring).
HISTORY_PLAN = frozenset({"depends_on", "state", "why"})
HISTORY_DEPS = frozenset({"state", "why"})


def view_of(inputs: Iterable[tuple[tuple[str, str], bytes]], bound_reads: tuple[str, ...]) -> MemoryView:
    """A view holding exactly these values, each at its own revision."""
    view = MemoryView(bound_reads)
    for revision, ((state, key), value) in enumerate(sorted(inputs), start=1):
        view.put(state, key, value, revision)
    return view


def expected(inputs: Inputs, bound_reads: tuple[str, ...], now: datetime | None = None) -> MemoryView:
    """`settle()` of a view holding only these inputs: the seat's states with no history."""
    view = view_of(inputs.items(), bound_reads)
    out = settle(view, now or datetime.now(UTC))
    assert out.settled, f"settle() did not reach a fixed point in {out.rounds} rounds"
    return view


def off_fixed_point(view: MemoryView, now: datetime | None = None) -> list[str]:
    """Every write `settle()` makes over a copy of a view: none at the fixed point (contract section 6)."""
    out = settle(view.copy(), now or datetime.now(UTC))
    said = []
    for w in out.writes:
        if isinstance(w, Put):
            was = view.get(w.state, w.key)
            said.append(f"off the fixed point: settle() of the bus puts {w.state} {w.key}: "
                        f"{_short(was.raw if was else None)} -> {_short(w.value)}")
        else:
            said.append(f"off the fixed point: settle() of the bus deletes {w.state} {w.key}")
    if not out.settled:
        said.append(f"settle() of the bus did not settle in {out.rounds} rounds")
    return said


def inputs_of(view: MemoryView, seat: Iterable[str] = OWN) -> Inputs:
    """Every value of a view but the seat's states (`seat`: its plans, provisions and refusals unless said): what
    the other modules wrote."""
    skip = set(seat)
    return {(state, key): e.raw for state in view.states() if state not in skip for key in view.keys(state)
            if (e := view.get(state, key)) is not None}


def _short(raw: bytes | None, most: int = 600) -> str:
    if raw is None:
        return "nothing"
    text = raw.decode(errors="replace")
    return text if len(text) <= most else text[:most] + "..."


def _provisions(view: MemoryView, problems: list[str], side: str) -> dict[str, r.Provision]:
    out = {}
    for key in sorted(view.keys(PROVISIONS)):
        e = view.get(PROVISIONS, key)
        p = e.get(r.Provision) if e is not None else None
        if p is None:
            problems.append(f"{side}: provision {key} does not decode")
        else:
            out[key] = p
    return out


def _unreadable_nodes(view: MemoryView) -> set[str]:
    """Nodes whose placement does not decode: nothing is composed for them (5.1.4)."""
    out = set()
    for node in view.keys(PLACEMENT):
        e = view.get(PLACEMENT, node)
        if e is not None and e.get(r.Placement) is None:
            out.add(node)
    return out


def _closure(start: Iterable[str], edges: dict[str, set[str]]) -> set[str]:
    out: set[str] = set()
    todo = list(start)
    while todo:
        key = todo.pop()
        if key not in out:
            out.add(key)
            todo.extend(edges.get(key, ()))
    return out


def compare(want: MemoryView, have: MemoryView) -> list[str]:
    """Every key of the seat's states where `have` (a bus after some history) differs from `want` (`settle()` of
    the same final inputs), but what the contract lets history decide (the module's docstring)."""
    problems: list[str] = []
    held = set(want.keys(REFUSED))  # `<node>.<module>` of each module held at its wanted build (5.2)
    dark = _unreadable_nodes(want)  # their placement does not decode (5.1.4)
    assert dark == _unreadable_nodes(have), "the two sides do not hold the same placements"

    def history_plan(key: str) -> bool:
        return key in held or key.split(".", 1)[0] in dark

    # Plans: byte for byte (section 4: a plan is encoded deterministically).
    for key in sorted(set(want.keys(PLANS)) | set(have.keys(PLANS))):
        a, b = want.get(PLANS, key), have.get(PLANS, key)
        if history_plan(key) or (a is not None and b is not None and a.raw == b.raw):
            continue
        problems.append(f"plan {key}: settle() has {_short(a.raw if a else None)}, the bus "
                        f"{_short(b.raw if b else None)}")
    # Refusals: with `since` aside.
    for key in sorted(set(want.keys(REFUSED)) | set(have.keys(REFUSED))):
        if key.split(".", 1)[0] in dark:
            continue
        x, y = (_refusal(v, key) for v in (want, have))
        if x != y:
            problems.append(f"refusal {key}: settle() has {x}, the bus {y}")
    # Provisions.
    pw, ph = _provisions(want, problems, "settle()"), _provisions(have, problems, "the bus")
    both = {**pw, **ph}
    deps: dict[str, set[str]] = {}
    dependents: dict[str, set[str]] = {}
    for side in (pw, ph):
        for key, p in side.items():
            deps.setdefault(key, set()).update(p.depends_on)
            for dep in p.depends_on:
                dependents.setdefault(dep, set()).add(key)
    seeds = {
        key for key, p in both.items()
        if any(s.get(key) is not None and s[key].state == r.RETIRING for s in (pw, ph))
        or key.split(".", 1)[0] in dark
        or ".".join(key.split(".")[:2]) in held
    }
    # A key the bus holds and settle() does not, which a provision settle() makes on another node depends on,
    # stays needed once made (5.2): a credential's key is named even while no node runs mesh-vault (section 4).
    needed_elsewhere = {dep for key, p in pw.items() for dep in p.depends_on if dep.split(".", 1)[0] != p.consumer.node}
    seeds |= {key for key in ph.keys() - pw.keys() if key in needed_elsewhere}
    one_side = _closure(seeds, deps)
    masks: dict[str, frozenset[str]] = {}
    for key, p in both.items():
        provider = f"{p.provider.node}.{p.provider.module}"
        if p.provider.node != p.consumer.node and history_plan(provider):
            masks[key] = HISTORY_PLAN
    # A provider judged by its have provides once all the key depends on is provided (5.3): such a key's state
    # follows, in turn, the keys above that are on one side only and the provisions just masked.
    todo = [k for k in one_side if (k in pw) != (k in ph)] + list(masks)
    while todo:
        for key in dependents.get(todo.pop(), ()):
            if key not in masks and _judged_by_have(want, both[key]):
                masks[key] = HISTORY_DEPS
                todo.append(key)
    for key in sorted(both):
        px, py = pw.get(key), ph.get(key)
        if px is None or py is None:
            if key not in one_side:
                problems.append(f"provision {key}: only {'the bus' if px is None else 'settle()'} has it: "
                                f"{_short(r.encode(both[key]))}")
            continue
        differ = _differ(px, py, masks.get(key, frozenset()))
        if differ:
            problems.append(f"provision {key}: {', '.join(differ)} differ: settle() has {_short(r.encode(px))}, "
                            f"the bus {_short(r.encode(py))}")
    return problems


def _judged_by_have(view: MemoryView, p: r.Provision) -> bool:
    """Whether a provision's state comes from its provider's have, after what it depends on (5.3)."""
    keeps, why = keeps_entries(view, p.provider.module, p.provision)
    return not keeps and not why


def _refusal(view: MemoryView, key: str) -> str:
    e = view.get(REFUSED, key)
    if e is None:
        return "nothing"
    refusal = e.get(r.Refusal)
    if refusal is None:
        return f"a value that does not decode: {_short(e.raw)}"
    return r.encode(msgspec.structs.replace(refusal, since=None)).decode()


def _differ(x: r.Provision, y: r.Provision, aside: frozenset[str]) -> list[str]:
    """The fields two provisions differ in, `at`, `v` and those `aside` left aside."""
    aside = aside | {"at", "v"}
    return [f.replace("_", "-") for f in x.__struct_fields__ if f not in aside and getattr(x, f) != getattr(y, f)]
