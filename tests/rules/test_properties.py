"""Properties of the seat's rules over random meshes (design.md's properties 1, 2 and 5; contract sections 5 to 7).

A mesh is drawn as the values the other modules write (placement, wants, builds, manifests, haves, resolved choices,
a share of broken records), settled, then given providers' entries and the router's answers for the keys the seat
made, and settled again. The number of examples comes from the Hypothesis profile (tests/rules/conftest.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st
from mesh import (
    NOW,
    Mesh,
    Settled,
    Woken,
    nodes_of,
    one_round,
    settle,
    wake_settle,
)

from mesh_provisioner.contract import (
    ASK_RECORDS,
    BUILDS,
    HAVE,
    MANIFESTS,
    MODULE,
    MODULES,
    PLACEMENT,
    PLANS,
    PROVISIONS,
    READS,
    REFUSED,
    RESOLVED,
    WANTS,
    bound,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import touched
from mesh_provisioner.rules.retire import ask_of, decide, retiring_ask

NODES = ("ace", "bee", "cat", "dog", "eel", "fox")
# Four kinds BoundReads names, four it does not; mesh-vault makes credentials.
KINDS = ("postgres", "gitea", "keycloak", "mesh-vault", "redis", "webapp", "reports", "mailer")
PROVIDES = ("db", "cache", "forge", "oidc", "store")
# Mostly none, own or shared; now and then a word that makes the manifest bad.
CREDENTIALS = ("", "", "", "own", "shared") * 4 + ("mine",)
LATER = NOW + timedelta(hours=3)
EXAMPLES = settings().max_examples

Put = tuple[str, str, bytes]


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


# ---- random meshes ----------------------------------------------------------------------------------------------

junk_bytes = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"null", b"[]", b"{", b'"x"', b"3", b'{"modules": 3}', b'{"fp": [1]}', b'{"state": {}}',
                     b"\xff\xfe", b"[" * 300 + b"]" * 300]),
)


@st.composite
def catalogue(draw: st.DrawFn) -> tuple[list[Put], dict[str, list[str]]]:
    """Every module kind's builds, manifests and registration; some registrations missing or pointing nowhere."""
    puts: list[Put] = []
    fps: dict[str, list[str]] = {}
    for name in KINDS:
        keeps = draw(st.booleans())
        state: list[Any] = [draw(st.sampled_from(["bound", {"name": "bound"}]))] if keeps else []
        state += draw(st.lists(st.sampled_from(["repos", {"name": "data"}]), max_size=1))
        reads = [PLANS] if draw(st.integers(0, 4)) else []
        offers = draw(st.lists(st.sampled_from(PROVIDES), max_size=2, unique=True))
        provides: list[Any] = []
        for offer in offers:
            form = draw(st.sampled_from(["name", "object", "helper"]))
            provides.append(offer if form == "name" else {"name": offer, "answered-by": "helper"} if form == "helper"
                            else {"name": offer})
        if name == "mesh-vault":
            provides.append("secret")
        builds = ["1", "2"][: draw(st.integers(1, 2))]
        for fp in builds:
            requires = []
            for provision, local, credential in draw(st.lists(
                st.tuples(st.sampled_from(PROVIDES), st.sampled_from(["", "", "main"]),
                          st.sampled_from(CREDENTIALS if name != "mesh-vault" else ("",))),
                max_size=2,
            )):
                requires.append({k: v for k, v in
                                 {"provision": provision, "local": local, "credential": credential}.items() if v})
            manifest = {"name": name, "requires": requires, "provides": provides, "state": state, "reads": reads}
            puts.append((MANIFESTS, f"{name}-{fp}", js(manifest)))
            puts.append((BUILDS, f"{name}.{fp}", js({"module": name, "fp": fp, "manifest": f"{name}-{fp}"})))
        fps[name] = builds
        registered = draw(st.sampled_from([builds[-1]] * 12 + ["9", ""]))
        if registered:
            puts.append((MODULES, name, js({"module": name, "fp": registered, "manifest": f"{name}-{builds[-1]}"})))
    return puts, fps


@st.composite
def meshes(draw: st.DrawFn) -> list[Put]:
    """A random mesh of 2 to 6 nodes, as the puts that make it."""
    nodes = NODES[: draw(st.integers(2, 6))]
    puts, fps = draw(catalogue())
    for node in nodes:
        placed = draw(st.lists(st.sampled_from(KINDS), max_size=4, unique=True))
        says_nothing = not placed and draw(st.booleans())
        if placed or says_nothing:
            puts.append((PLACEMENT, node, js({"node": node, "modules": [{"module": m} for m in placed]})))
        for module in placed + draw(st.lists(st.sampled_from(KINDS), max_size=1)):
            want = draw(st.sampled_from([None, None, *fps[module], fps[module][-1], "removed", "removed", "9"]))
            if want is not None:
                puts.append((WANTS, f"want.{node}.{module}",
                             js({"fp": "1", "removed": True} if want == "removed" else {"fp": want})))
            if draw(st.integers(0, 3)):
                puts.append((HAVE, f"{node}.{module}", js({
                    "fp": draw(st.sampled_from([*fps[module], want if want in fps[module] else fps[module][0]])),
                    "phase": draw(st.sampled_from(["running", "running", "running", "starting", "stopped", "failed"])),
                    "health": draw(st.sampled_from(["ok", "ok", "ok", "unknown", "failed"])),
                    "detail": draw(st.sampled_from(["", "out of memory"])),
                })))
    for _ in range(draw(st.integers(0, 3))):
        node, module = draw(st.sampled_from(nodes)), draw(st.sampled_from(KINDS))
        choice = {draw(st.sampled_from(PROVIDES)): draw(st.sampled_from(nodes))}
        puts.append((RESOLVED, f"{node}.{module}", js({"providers": choice})))
    # A share of broken records: any value above turned to junk.
    for _ in range(draw(st.integers(0, 2))):
        if puts and draw(st.integers(0, 2)) == 0:
            i = draw(st.integers(0, len(puts) - 1))
            puts[i] = (puts[i][0], puts[i][1], draw(junk_bytes))
    return puts


entries = st.sampled_from([
        js({"state": "provided"}),
        js({"state": "provided"}),
        js({"state": "provided"}),
        js({"state": "provided", "vault-name": "vault/x", "generation": 2}),
        js({}),
        js({"state": "failed", "why": "the quota is used up"}),
        js({"state": "failed"}),
        js({"state": "waits", "waits": "an admin accepts it"}),
        js({"refused": "not for you"}),
        js({"waits": "the owner agrees"}),
        js({"state": "pending"}),
        b"junk",
])
"""A provider's entry for one key."""


@st.composite
def answers(draw: st.DrawFn, key: str, p: r.Provision) -> bytes:
    """The router's record for a retiring key's ask: open, chosen, ended with no choice, or wrong in some way."""
    ask = ask_of(key, p)
    assert ask is not None
    kind = draw(st.sampled_from(
        ["open", "yes", "yes", "yes", "yes", "no", "expired", "withdrawn", "other-asker", "bad-binds", "junk"]
    ))
    if kind == "junk":
        return b"{]"
    if kind == "open":
        return r.encode(r.AskRecord(state="open", ask=ask))
    outcome = kind if kind in ("expired", "withdrawn") else "chosen"
    option = "" if outcome != "chosen" else "no" if kind == "no" else "yes"
    if kind == "bad-binds":
        ask = retiring_ask("x.y.z", p, NOW, p.ask)
    warrant = r.Warrant(asker="someone" if kind == "other-asker" else MODULE, ask=p.ask, outcome=outcome,
                        option=option, by=r.Identity("operator", "person", "alice"), at=NOW)
    return r.encode(r.AskRecord(state="decided" if outcome == "chosen" else outcome, ask=ask, warrant=warrant))


def build(puts: list[Put]) -> Mesh:
    m = Mesh()
    for state, key, value in puts:
        m.raw(state, key, value)
    return m


def grow(data: st.DataObject) -> tuple[Mesh, Settled]:
    """A random mesh settled; given its providers' entries; some modules taken away (their keys retire, asking);
    the operator's answers; providers letting their entries go on a yes. Settled after each."""
    m = build(data.draw(meshes(), label="mesh"))
    settle(m.view)
    for key in sorted(m.view.keys(PROVISIONS)):
        p = m.provision(key)
        if data.draw(st.integers(0, 3), label=f"answers {key}"):
            m.raw(bound(p.provider.module), key, data.draw(entries, label=f"entry {key}"))
    settle(m.view)
    for node in sorted(m.view.keys(PLACEMENT)):
        placement = m.view.get(PLACEMENT, node)
        placed = placement.get(r.Placement) if placement is not None else None
        if placed is None or not placed.modules or not data.draw(st.booleans(), label=f"takes from {node}"):
            continue
        gone = data.draw(st.lists(st.sampled_from([x.module for x in placed.modules]), min_size=1, unique=True),
                         label=f"taken from {node}")
        m.place(node, *[x.module for x in placed.modules if x.module not in gone])
        for module in gone:
            m.delete(WANTS, f"want.{node}.{module}")
            m.delete(HAVE, f"{node}.{module}")
    settle(m.view)
    for key in sorted(m.view.keys(PROVISIONS)):
        p = m.provision(key)
        if p.state == "retiring" and p.ask and data.draw(st.integers(0, 3), label=f"decides {key}"):
            m.raw(ASK_RECORDS, p.ask, data.draw(answers(key, p), label=f"answer {key}"))
    settle(m.view)
    for key in sorted(m.view.keys(PROVISIONS)):
        p = m.provision(key)
        if p.warrant is not None and data.draw(st.booleans(), label=f"lets go {key}"):
            m.unbind(p.provider.module, key)
    settled = settle(m.view)
    return m, settled


# ---- (a) the fixed point ----------------------------------------------------------------------------------------


@given(st.data())
def test_property_fixed_point(data: st.DataObject) -> None:
    """Once settled, composing every node and judging every key again writes nothing, in any order, at any time."""
    m, _ = grow(data)
    out = Settled()
    assert one_round(m.view, LATER, out) == []
    nodes = nodes_of(m.view)
    random.Random(data.draw(st.integers(0, 2**16), label="order")).shuffle(nodes)
    for node in nodes:
        assert compose_node(m.view, node, LATER).writes == [], node
    for key in sorted(m.view.keys(PROVISIONS), reverse=True):
        assert rejudge(m.view, key, LATER).writes == [], key
        assert decide(m.view, key, LATER).writes == [], key


# ---- (b) the seat never sets provided by itself -----------------------------------------------------------------


def trunk(m: Mesh, module: str) -> dict[str, Any] | None:
    """A module's manifest at the trunk, read here as plain JSON; None when it cannot be read."""
    try:
        entry = json.loads(m.view.get(MODULES, module).raw)  # type: ignore[union-attr]
        found = json.loads(m.view.get(MANIFESTS, entry["manifest"]).raw)  # type: ignore[union-attr]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def keeps_entries(manifest: dict[str, Any], provision: str) -> bool:
    """Section 3 and 5.3 in the test's own words: `bound` declared; only helper offers when any says helper."""
    names = {s if isinstance(s, str) else s.get("name") for s in manifest.get("state", [])}
    if "bound" not in names:
        return False
    helped = [
        o["name"] for o in manifest.get("provides", []) if isinstance(o, dict) and o.get("answered-by") == "helper"
    ]
    return not helped or provision in helped


def provided_by_its_provider(m: Mesh, key: str, p: r.Provision) -> str:
    """Why a provided key is not its provider's word ("" when it is)."""
    manifest = trunk(m, p.provider.module)
    if manifest is None:
        return "its provider's manifest cannot be read"
    if keeps_entries(manifest, p.provision):
        if p.provider.module not in m.view.bound_reads:
            return "its provider's entries are not read"
        e = m.view.get(bound(p.provider.module), key)
        if e is None:
            return "its provider has no entry for it"
        try:
            en = json.loads(e.raw)
        except ValueError:
            return "its provider's entry is not JSON"
        if en.get("state", "") not in ("", "provided") or (en.get("state", "") == "" and (
                en.get("refused") or en.get("waits"))):
            return f"its provider's entry says {en}"
        return ""
    e = m.view.get(HAVE, f"{p.provider.node}.{p.provider.module}")
    have = json.loads(e.raw) if e is not None else {}
    we = m.view.get(WANTS, f"want.{p.provider.node}.{p.provider.module}")
    want = json.loads(we.raw) if we is not None else {}
    wanted = "" if want.get("removed") else want.get("fp", "")
    if have.get("phase") != "running" or have.get("health") != "ok" or (wanted and have.get("fp") != wanted):
        return f"its provider's have is {have}, its want {want}"
    for dep in p.depends_on:
        d = m.view.get(PROVISIONS, dep)
        if d is None or d.get(r.Provision) is None or d.get(r.Provision).state != "provided":  # type: ignore[union-attr]
            return f"it depends on {dep}, which is not provided"
    return ""


@given(st.data())
def test_property_provided_only_by_the_providers_word(data: st.DataObject) -> None:
    m, _ = grow(data)
    for key in sorted(m.view.keys(PROVISIONS)):
        p = m.provision(key)
        if p.state == "provided":
            assert provided_by_its_provider(m, key, p) == "", key
        else:
            assert p.state in ("asked", "failed", "waits", "retiring"), key
            assert p.why.strip(), f"{key} is {p.state} and says no why"


# ---- (c) bad input never raises ---------------------------------------------------------------------------------

FIELDS = ("node", "modules", "module", "fp", "removed", "manifest", "phase", "health", "detail", "providers", "state",
          "why", "refused", "waits", "vault-name", "generation", "name", "requires", "provides", "reads", "provision",
          "local", "credential", "answered-by", "ask", "warrant", "asker", "outcome", "option", "by", "at", "options",
          "id", "binds", "expires", "consumer", "provider", "depends-on", "reference", "plan", "provisions",
          "provider-module", "since", "v", "who")

json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=12), st.sampled_from(["running", "ok", "bound", "retiring", "provided", "x.y", "", "want.a.b"]),
    st.text(min_size=2000, max_size=4000, alphabet="ab.-"),
)


def json_nesting(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=6)), children, max_size=5),
    )


json_values = st.recursive(json_leaves, json_nesting, max_leaves=20)
record_shaped = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)
deep = st.integers(1, 600).map(lambda n: b'{"modules": ' + b"[" * n + b"]" * n + b"}")
any_bytes = st.one_of(junk_bytes, json_values.map(js), record_shaped.map(js), deep)

BUCKETS = (*READS, ASK_RECORDS, PROVISIONS, PLANS, REFUSED, *(bound(b) for b in ("postgres", "gitea", "mesh-vault")))
any_key = st.one_of(
    st.sampled_from(["ace", "bee", "ace.postgres", "bee.webapp", "want.ace.gitea", "gitea.1", "gitea-1",
                     "ace.webapp.db", "bee.mailer.db-credential.main", "ace.gitea.forge"]),
    st.text(max_size=20),
    st.lists(st.sampled_from(["ace", "bee", "", "a b", "want", "x"]), min_size=1, max_size=5).map(".".join),
)


@given(st.data())
def test_property_bad_input_never_raises(data: st.DataObject) -> None:
    m, _ = grow(data)
    changes: list[tuple[str, str]] = []
    for _ in range(data.draw(st.integers(1, 6), label="how many")):
        state = data.draw(st.sampled_from(BUCKETS), label="state")
        key = data.draw(st.one_of(any_key, st.sampled_from(sorted(m.view.keys(state)) or ["ace"])), label="key")
        value = data.draw(any_bytes, label="value")
        if state == PROVISIONS and data.draw(st.booleans(), label="retiring"):
            # A retiring key that names an ask, and junk for that ask's record.
            ask = data.draw(st.text(max_size=12), label="ask")
            value = js({"state": "retiring", "ask": ask, "provider": {"module": "postgres", "node": "ace"}})
            m.raw(ASK_RECORDS, ask, data.draw(any_bytes, label="record"))
        old = m.view.get(state, key)
        new = m.view.put(state, key, value, 10**9 + len(changes))
        touched(m.view, state, key, old, new)
        changes.append((state, key))
    nodes = {*nodes_of(m.view), *(key.split(".")[0] for _, key in changes), "", "a b"}
    for node in sorted(nodes):
        compose_node(m.view, node, LATER)
    for key in sorted({*m.view.keys(PROVISIONS), *(key for _, key in changes)}):
        rejudge(m.view, key, LATER)
        decide(m.view, key, LATER)
    for state, key in changes:
        entry = m.view.get(state, key)
        touched(m.view, state, key, entry, None)
        m.view.delete(state, key)
        touched(m.view, state, key, None, entry)
    # And the seat still settles over it.
    for state, key in changes:
        m.view.put(state, key, data.draw(any_bytes, label="again"), 2 * 10**9)
    settle(m.view, LATER)


# ---- (d) the wakes suffice --------------------------------------------------------------------------------------


Change = Callable[[Mesh], Woken]


@st.composite
def changes(draw: st.DrawFn, m: Mesh) -> tuple[str, Change]:
    """One change another module makes to a settled mesh, with how to say it."""
    nodes = nodes_of(m.view) or ["ace"]
    node = draw(st.sampled_from(nodes))
    module = draw(st.sampled_from(KINDS))
    keys = sorted(m.view.keys(PROVISIONS))
    kind = draw(st.sampled_from(["place", "unplace", "placement-junk", "want", "unwant", "have", "unhave", "resolved",
                                 "register", "unregister", "manifest", "build-junk", "entry", "unbind", "record",
                                 "junk"]))
    if kind == "place":
        placed = draw(st.lists(st.sampled_from(KINDS), max_size=4, unique=True))
        return f"place {node} {placed}", lambda m: m.place(node, *placed)
    if kind == "unplace":
        return f"unplace {node}", lambda m: m.delete(PLACEMENT, node)
    if kind == "placement-junk":
        return f"placement {node} junk", lambda m: m.raw(PLACEMENT, node, b"[]")
    if kind == "want":
        fp = draw(st.sampled_from(["1", "2", "9"]))
        return f"want {node} {module} {fp}", lambda m: m.want(node, module, fp)
    if kind == "unwant":
        return f"unwant {node} {module}", lambda m: m.delete(WANTS, f"want.{node}.{module}")
    if kind == "have":
        fp = draw(st.sampled_from(["1", "2"]))
        phase = draw(st.sampled_from(["running", "failed", "starting"]))
        health = draw(st.sampled_from(["ok", "failed", "unknown"]))
        return f"have {node} {module} {fp} {phase} {health}", lambda m: m.have(node, module, fp, phase, health)
    if kind == "unhave":
        return f"unhave {node} {module}", lambda m: m.delete(HAVE, f"{node}.{module}")
    if kind == "resolved":
        choice = {draw(st.sampled_from(PROVIDES)): draw(st.sampled_from(nodes))}
        return f"resolved {node} {module} {choice}", lambda m: m.resolved(node, module, choice)
    if kind == "register":
        fp = draw(st.sampled_from(["1", "2"]))
        return f"register {module} {fp}", lambda m: m.register(module, fp)
    if kind == "unregister":
        return f"unregister {module}", lambda m: m.delete(MODULES, module)
    if kind == "manifest":
        fp = draw(st.sampled_from(["1", "2"]))
        requires = draw(st.lists(st.sampled_from(PROVIDES), max_size=2, unique=True))
        provides = draw(st.lists(st.sampled_from(PROVIDES), max_size=2, unique=True))
        states = draw(st.sampled_from([[], ["bound"]]))
        manifest = {"name": module, "requires": [{"provision": p} for p in requires], "provides": provides,
                    "state": states, "reads": [PLANS]}
        return f"manifest {module}-{fp} {manifest}", lambda m: m.put(MANIFESTS, f"{module}-{fp}", manifest)
    if kind == "build-junk":
        return f"build {module}.1 junk", lambda m: m.raw(BUILDS, f"{module}.1", b"junk")
    if kind in ("entry", "unbind", "record") and keys:
        key = draw(st.sampled_from(keys))
        p = m.provision(key)
        if kind == "entry":
            value = draw(entries)
            return f"entry {key} {value!r}", lambda m: m.raw(bound(p.provider.module), key, value)
        if kind == "unbind":
            return f"unbind {key}", lambda m: m.delete(bound(p.provider.module), key)
        if p.state == "retiring" and p.ask:
            value = draw(answers(key, p))
            return f"record {p.ask} {value!r}", lambda m: m.raw(ASK_RECORDS, p.ask, value)
    state = draw(st.sampled_from(READS))
    key = draw(st.sampled_from(sorted(m.view.keys(state)) or ["ace"]))
    return f"junk {state} {key}", lambda m: m.raw(state, key, b"\x00junk")


@settings(max_examples=EXAMPLES * 2)
@given(st.data())
def test_property_wakes_suffice(data: st.DataObject) -> None:
    """After any one change to a settled mesh, following its wakes leaves nothing for a full round to do."""
    m, _ = grow(data)
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        what, change = data.draw(changes(m), label="change")
        note(what)
        wake_settle(m.view, change(m))
        missed = settle(m.view).rounds[0]
        assert missed == [], f"after {what}, the wakes missed {[(w.state, w.key) for w in missed]}"
