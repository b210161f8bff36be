"""What the seat keeps, for a person: plans, provisions and refusals as tables, JSON, or a Graphviz graph.

Pure rendering of a view of the bus (contract section 4's states); `mesh-provisioner show` reads the bus once
(`bus/snapshot.py`) and prints what these make. The JSON has the shape of the verb's reply (contract 9):
`{"entries": [{"key", "value"}]}`, each value the stored record itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from mesh_provisioner.contract import OWN, PLACEMENT, PLANS, PROVISIONS, REFUSED
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import verb
from mesh_provisioner.rules.view import View, not_nodes

# What `show` shows, by its word on the command line, and the seat's state each reads (contract section 4).
SHOWN: Final = {"plans": PLANS, "provisions": PROVISIONS, "refused": REFUSED}
GRAPH: Final = "graph"
# What `show` reads: the seat's states, and the placement, whose keys that are no node it names (section 7).
READS: Final = (*OWN, PLACEMENT)

# The colour of a provision's edge by its state (contract section 4's states).
STATE_COLOURS: Final = {
    r.PROVIDED: "green",
    r.ASKED: "grey",
    r.WAITS: "orange",
    r.FAILED: "red",
    r.RETIRING: "purple",
}
UNKNOWN_COLOUR: Final = "black"


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
    """The plans, provisions and refusals of a view, each under its title; placement keys that are no node last."""
    return "\n\n".join([
        "Plans\n" + table(["plan", "provision", "local", "provider", "credential"], plan_rows(view)),
        "Provisions\n" + table(["key", "state", "provider", "why"], provision_rows(view)),
        "Refused\n" + table(["module", "since", "why"], refused_rows(view)),
    ]) + no_nodes_said(view)


def no_nodes_said(view: View) -> str:
    """The placement keys that are no node, under a title after two newlines; "" when there are none (section 7)."""
    said = not_nodes(view)
    if not said:
        return ""
    return "\n\nNo node\n" + table(["placement key", "why"], [[repr(key), why] for key, why in said.items()])


def check(what: str, state: str = "", as_json: bool = False, filtered: bool = False) -> str:
    """Why a `show` request cannot be made ("" when it can): an unknown word, or options its kind does not take."""
    if what != GRAPH and what not in SHOWN:
        return f"show shows {', '.join([*SHOWN, GRAPH])}, not {what!r}"
    if state and what != "provisions":
        return f"--state narrows provisions only, not {what}"
    if state and state not in r.STATES:
        return f"--state is one of {', '.join(r.STATES)}, not {state!r}"
    if what == GRAPH and (as_json or filtered or state):
        return "show graph draws every provision: it takes no --node, --module, --state or --json"
    return ""


def selected(view: View, what: str, node: str = "", module: str = "", state: str = "") -> list[str]:
    """The keys of plans, provisions or refused a `show` selects, sorted; `state` narrows provisions."""
    keys = verb.select(view, verb.Request(what=what, node=node, module=module))
    if not state:
        return keys
    out = []
    for key in keys:
        e = view.get(PROVISIONS, key)
        p = e.get(r.Provision) if e is not None else None
        if p is not None and p.state == state:
            out.append(key)
    return out


def as_json(view: View, what: str, node: str = "", module: str = "", state: str = "") -> str:
    """The selected keys and their stored values as the verb answers them (contract 9), on one line."""
    found = SHOWN[what]
    items = [it for key in selected(view, what, node, module, state) if (it := verb.item(view, found, key)) is not None]
    return verb.encode(verb.Entries(items)).decode()


def as_table(view: View, what: str, node: str = "", module: str = "", state: str = "") -> str:
    """The selected plans, provisions or refusals as a table under its header."""
    if what == "plans":
        return table(["plan", "provision", "local", "provider", "credential"], plan_rows(view, node, module))
    if what == "provisions":
        return table(["key", "state", "provider", "why"], provision_rows(view, node, module, state))
    return table(["module", "since", "why"], refused_rows(view, node, module))


def render(view: View, what: str, node: str = "", module: str = "", state: str = "", json: bool = False) -> str:
    """What `mesh-provisioner show` prints; raises ValueError when `check` refuses the request."""
    why = check(what, state, json, bool(node or module))
    if why:
        raise ValueError(why)
    if what == GRAPH:
        return graph_dot(view)
    if json:
        return as_json(view, what, node, module, state)
    return as_table(view, what, node, module, state) + no_nodes_said(view)


# ---- the graph ----------------------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**attrs: str) -> str:
    """A DOT attribute list, its attributes in the order given."""
    return "[" + ", ".join(f"{name}={_quoted(value)}" for name, value in attrs.items()) + "]"


def graph_dot(view: View) -> str:
    """The provisions as a Graphviz DOT graph: consumer `node.module` to provider `node.module`, per node a cluster.

    Each edge is labelled with its provision (and local) and coloured by its state: provided green, asked grey,
    waits orange, failed red, retiring purple; its tooltip says the state and why. A module whose plan is not
    composed (contract 4's `refused`) is drawn dashed and red with its why; a provision that does not decode is
    named in a comment (section 7). Deterministic: the same view draws the same text.
    """
    modules: dict[str, dict[str, str]] = defaultdict(dict)  # node -> module -> tooltip ("" when none)
    edges: list[str] = []
    problems: list[str] = []

    def add(node: str, module: str) -> None:
        if node and module:
            modules[node].setdefault(module, "")

    for key in sorted(view.keys(PLANS)):
        node, _, module = key.partition(".")
        add(node, module)
    refused: dict[str, str] = {}
    for key in sorted(view.keys(REFUSED)):
        e = view.get(REFUSED, key)
        ref = e.get(r.Refusal) if e is not None else None
        node, _, module = key.partition(".")
        add(node, module)
        refused[key] = ref.why if ref is not None else (e.error if e is not None else "")
    for key in sorted(view.keys(PROVISIONS)):
        e = view.get(PROVISIONS, key)
        p = e.get(r.Provision) if e is not None else None
        if p is None:
            problems.append(f"{key}: {e.error if e is not None else 'gone'}")
            continue
        consumer = f"{p.consumer.node}.{p.consumer.module}"
        provider = f"{p.provider.node}.{p.provider.module}"
        add(p.consumer.node, p.consumer.module)
        add(p.provider.node, p.provider.module)
        label = p.provision + (f".{p.local}" if p.local else "")
        colour = STATE_COLOURS.get(p.state, UNKNOWN_COLOUR)
        tip = f"{key}: {p.state or 'no state'}" + (f": {p.why}" if p.why else "")
        edges.append(f"  {_quoted(consumer)} -> {_quoted(provider)} "
                     + _attrs(label=label, color=colour, fontcolor=colour, tooltip=tip) + ";")

    lines = [
        'digraph "mesh-provisioner" {',
        "  rankdir=LR;",
        '  node [shape=box, style=rounded, fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    problems += not_nodes(view).values()
    lines += [f"  // {problem.replace(chr(10), ' ')}" for problem in problems]
    for node in sorted(modules):
        lines.append(f"  subgraph {_quoted('cluster_' + node)} {{")
        lines.append(f"    label={_quoted(node)};")
        for module in sorted(modules[node]):
            key = f"{node}.{module}"
            if key in refused:
                attrs = _attrs(label=module, style="rounded,dashed", color="red", tooltip=f"held: {refused[key]}")
            else:
                attrs = _attrs(label=module)
            lines.append(f"    {_quoted(key)} {attrs};")
        lines.append("  }")
    lines += edges
    lines.append("}")
    return "\n".join(lines) + "\n"


__all__ = ["as_json", "as_table", "check", "graph_dot", "plan_rows", "provision_rows", "refused_rows", "render",
           "selected", "table", "tables"]
