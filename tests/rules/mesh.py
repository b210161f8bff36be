"""Meshes in a `MemoryView`, made tersely, and the seat run over them until it settles.

`Mesh` writes what the other modules of the mesh write (placement, wants, builds, manifests, haves, resolved
choices, providers' entries, the router's records). `settle` composes every node and judges every key again,
applying each write as a compare-and-set, until a round writes nothing (contract section 6's fixed point).
`wake_settle` starts from one change and does only what the recorded read sets say it wakes, transitively, as the
dispatcher does (actors/dispatch.py): a full `settle` after it that still writes has found a missing wake-up.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

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
    RESOLVED,
    WANTS,
    bound,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Delete, Put, Write
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import NODE_STATES, Reads, Token, known_nodes, touched
from mesh_provisioner.rules.retire import decide, retiring_keys
from mesh_provisioner.rules.view import Entry, group_of

NOW = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)


def ask_id(key: str, unix: int) -> str:
    """A retiring key's ask id from contract 5.4's words alone: `retire-<key, . made ->-<unix s>-<h>`, `<h>` the first
    8 hex digits of the key's SHA-256."""
    return f"retire-{key.replace('.', '-')}-{unix}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:8]}"

_revisions = itertools.count(1)

Requirement = str | Mapping[str, str]
Offer = str | Mapping[str, str]


@dataclass(frozen=True)
class Woken:
    """What one change wakes, by the read sets the judgments recorded: nodes to compose, keys to judge again,
    retiring keys whose ask to look at."""

    nodes: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    decide: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.nodes or self.keys or self.decide)


Judgment = tuple[str, str]


def run(view: MemoryView | Reads, j: Judgment, now: datetime = NOW) -> tuple[list[Write], str, r.Composed | None]:
    """One judgment's run (a node's composition, a key's judgment, a retiring key's look): its writes, what it said,
    and a composition's report."""
    kind, subject = j
    if kind == "compose":
        res = compose_node(view, subject, now)
        return res.writes, "", res.composed
    judged = rejudge(view, subject, now) if kind == "judge" else decide(view, subject, now)
    return judged.writes, judged.said, None


def judgments(view: MemoryView) -> list[Judgment]:
    """Every judgment the seat keeps over a view: each node composed, each key judged, each retiring key looked at."""
    return [
        *(("compose", n) for n in sorted(known_nodes(view))),
        *(("judge", key) for key in sorted(view.keys(PROVISIONS))),
        *(("look", key) for key in retiring_keys(view)),
    ]


def read_sets(view: MemoryView, now: datetime = NOW) -> dict[Judgment, frozenset[Token]]:
    """What each judgment reads over a view, as its last run recorded it (its writes left aside)."""
    out = {}
    for j in judgments(view):
        reads = Reads(view)
        run(reads, j, now)
        out[j] = frozenset(reads.tokens)
    return out


def woken_by(
    view: MemoryView, reads: Mapping[Judgment, frozenset[Token]], state: str, key: str, old: Entry | None,
    new: Entry | None,
) -> Woken:
    """What a change wakes: every judgment whose read set holds a token it touched, and the judgments a new node,
    key or retiring ask starts (as the dispatcher does)."""
    tokens = touched(view, state, key, old, new)
    woken = {j for j, rs in reads.items() if not rs.isdisjoint(tokens)}
    if new is not None:
        node = group_of(state, key)
        if state in NODE_STATES and k.is_token(node):
            woken.add(("compose", node))
        if state == PROVISIONS:
            woken.add(("judge", key))
            p = new.get(r.Provision)
            if p is not None and p.state == r.RETIRING and p.ask and p.warrant is None:
                woken.add(("look", key))
    return Woken(
        frozenset(s for kind, s in woken if kind == "compose"),
        frozenset(s for kind, s in woken if kind == "judge"),
        frozenset(s for kind, s in woken if kind == "look"),
    )


def union(*woken: Woken) -> Woken:
    """What several changes wake together."""
    return Woken(
        frozenset().union(*(w.nodes for w in woken)),
        frozenset().union(*(w.keys for w in woken)),
        frozenset().union(*(w.decide for w in woken)),
    )


def next_revision() -> int:
    """A revision no key has had yet (revisions only need to differ for a compare-and-set)."""
    return next(_revisions)


def as_bytes(value: Any) -> bytes:
    """A value as the bus keeps it: bytes as they are, a record encoded, anything else as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict | list | str | int | float | bool) or value is None:
        return json.dumps(value).encode()
    return r.encode(value)


def req(provision: str, local: str = "", credential: str = "") -> dict[str, str]:
    """One requirement of a manifest, its empty fields left out."""
    out = {"provision": provision}
    if local:
        out["local"] = local
    if credential:
        out["credential"] = credential
    return out


def helper(name: str) -> dict[str, str]:
    """An offer answered by the provider's helper, through its entries."""
    return {"name": name, "answered-by": "helper"}


class Mesh:
    """A mesh in a MemoryView, written as the other modules write it."""

    def __init__(self, bound_reads: Iterable[str] | None = None) -> None:
        self.view = MemoryView() if bound_reads is None else MemoryView(bound_reads)

    # ---- any key ----------------------------------------------------------------------------------------

    def put(self, state: str, key: str, value: Any) -> Woken:
        """Set a key (bytes as they are, else encoded); answers what the change wakes."""
        reads = read_sets(self.view)
        old = self.view.get(state, key)
        new = self.view.put(state, key, as_bytes(value), next_revision())
        return woken_by(self.view, reads, state, key, old, new)

    def raw(self, state: str, key: str, value: bytes) -> Woken:
        """Set a key to exactly these bytes."""
        return self.put(state, key, value)

    def delete(self, state: str, key: str) -> Woken:
        """Delete a key; answers what it wakes."""
        reads = read_sets(self.view)
        old = self.view.delete(state, key)
        return woken_by(self.view, reads, state, key, old, None)

    def another_writer(self, state: str, key: str, value: Any | None) -> Woken:
        """Another writer than the seat sets a key of the seat's own states (None: deletes it); answers what it
        wakes."""
        reads = read_sets(self.view)
        if value is None:
            old, new = self.view.delete(state, key), None
        else:
            old, new = self.view.get(state, key), self.view.put(state, key, as_bytes(value), next_revision())
        return woken_by(self.view, reads, state, key, old, new)

    # ---- what the other modules write -------------------------------------------------------------------

    def place(self, node: str, *modules: str) -> Woken:
        """Place modules on a node (none: the node's placement says nothing is placed)."""
        return self.put(PLACEMENT, node, {"node": node, "modules": [{"module": m} for m in modules]})

    def manifest(
        self,
        name: str,
        requires: Sequence[Requirement] = (),
        provides: Sequence[Offer] = (),
        state: Sequence[str | Mapping[str, str]] = (),
        reads: Sequence[str] = (),
    ) -> dict[str, Any]:
        """A manifest as JSON, its empty lists left out."""
        out: dict[str, Any] = {"name": name}
        if requires:
            out["requires"] = [req(x) if isinstance(x, str) else dict(x) for x in requires]
        if provides:
            out["provides"] = [x if isinstance(x, str) else dict(x) for x in provides]
        if state:
            out["state"] = [x if isinstance(x, str) else dict(x) for x in state]
        if reads:
            out["reads"] = list(reads)
        return out

    def build(
        self,
        name: str,
        fp: str,
        requires: Sequence[Requirement] = (),
        provides: Sequence[Offer] = (),
        state: Sequence[str | Mapping[str, str]] = (),
        reads: Sequence[str] = (),
        *,
        manifest_id: str = "",
    ) -> Woken:
        """One build of a module and its manifest (id `<name>-<fp>`), not registered as the newest."""
        mid = manifest_id or f"{name}-{fp}"
        return union(
            self.put(MANIFESTS, mid, self.manifest(name, requires, provides, state, reads)),
            self.put(BUILDS, f"{name}.{fp}", {"module": name, "fp": fp, "manifest": mid}),
        )

    def register(self, name: str, fp: str, manifest_id: str = "") -> Woken:
        """The indexer registers a module at a build (its newest) and that build's manifest at the trunk."""
        return self.put(MODULES, name, {"module": name, "fp": fp, "manifest": manifest_id or f"{name}-{fp}"})

    def module(
        self,
        name: str,
        fp: str = "1",
        requires: Sequence[Requirement] = (),
        provides: Sequence[Offer] = (),
        state: Sequence[str | Mapping[str, str]] = (),
        reads: Sequence[str] = (),
    ) -> Woken:
        """A module registered at a build, with its build record and manifest (id `<name>-<fp>`)."""
        return union(self.build(name, fp, requires, provides, state, reads), self.register(name, fp))

    def want(self, node: str, module: str, fp: str, removed: bool = False) -> Woken:
        """The assigner wants a node to run a module at a build."""
        value: dict[str, Any] = {"fp": fp}
        if removed:
            value["removed"] = True
        return self.put(WANTS, f"want.{node}.{module}", value)

    def have(
        self, node: str, module: str, fp: str, phase: str = "running", health: str = "ok", detail: str = ""
    ) -> Woken:
        """A node's engine says what it runs."""
        value = {"fp": fp, "phase": phase, "health": health}
        if detail:
            value["detail"] = detail
        return self.put(HAVE, f"{node}.{module}", value)

    def resolved(self, node: str, module: str, providers: Mapping[str, str]) -> Woken:
        """mesh-config names the node whose provider answers each provision for a module on a node."""
        return self.put(RESOLVED, f"{node}.{module}", {"providers": dict(providers)})

    def bound(self, provider: str, key: str, **entry: Any) -> Woken:
        """A provider's outcome for one consumer; keyword names are the fields with `_` for `-`."""
        return self.put(bound(provider), key, {name.replace("_", "-"): v for name, v in entry.items()})

    def unbind(self, provider: str, key: str) -> Woken:
        """A provider lets its entry for a key go."""
        return self.delete(bound(provider), key)

    def record(self, ask_id: str, state: str, ask: r.Ask | None = None, warrant: r.Warrant | None = None) -> Woken:
        """The router's record of an ask."""
        return self.put(ASK_RECORDS, ask_id, r.AskRecord(state=state, ask=ask, warrant=warrant))

    # ---- reading back -----------------------------------------------------------------------------------

    def provision(self, key: str) -> r.Provision:
        """The provision at a key, which must be there and decode."""
        return provision(self.view, key)

    def states(self) -> dict[str, str]:
        """Every provision key's state."""
        return states(self.view)

    def plan(self, key: str) -> r.PlanRecord:
        """The plan at a key, which must be there and decode."""
        e = self.view.get(PLANS, key)
        assert e is not None, f"no plan {key}"
        value = e.get(r.PlanRecord)
        assert value is not None, e.error
        return value

    def refusal(self, key: str) -> r.Refusal:
        """The refusal at a key, which must be there and decode."""
        e = self.view.get(REFUSED, key)
        assert e is not None, f"no refusal {key}"
        value = e.get(r.Refusal)
        assert value is not None, e.error
        return value


def provision(view: MemoryView, key: str) -> r.Provision:
    """The provision at a key, which must be there and decode."""
    e = view.get(PROVISIONS, key)
    assert e is not None, f"no provision {key}"
    value = e.get(r.Provision)
    assert value is not None, e.error
    return value


def states(view: MemoryView) -> dict[str, str]:
    """Every provision key's state ("?" for one that does not decode)."""
    out = {}
    for key in sorted(view.keys(PROVISIONS)):
        e = view.get(PROVISIONS, key)
        p = e.get(r.Provision) if e is not None else None
        out[key] = p.state if p is not None else "?"
    return out


# ---- applying writes ----------------------------------------------------------------------------------------


def apply(view: MemoryView, write: Write) -> tuple[Entry | None, Entry | None]:
    """Apply one write as a compare-and-set; answers the entry before and after. A lost race fails the test."""
    have = view.get(write.state, write.key)
    current = have.revision if have is not None else 0
    assert write.revision == current, f"{write.state} {write.key}: judged at revision {write.revision}, is {current}"
    if isinstance(write, Put):
        return have, view.put(write.state, write.key, write.value, next_revision())
    assert isinstance(write, Delete)
    assert have is not None, f"a delete of {write.state} {write.key}, which is not there"
    view.delete(write.state, write.key)
    return have, None


def nodes_of(view: MemoryView) -> list[str]:
    """Every node that has anything: a placement, a want, a have, a plan, a refusal or a provision key."""
    nodes = set(view.keys(PLACEMENT))
    for state in (WANTS, HAVE, PLANS, REFUSED, PROVISIONS):
        nodes |= {group_of(state, key) for key in view.keys(state)}
    nodes.discard("")
    return sorted(nodes)


@dataclass
class Settled:
    """What settling did: the writes of each round, every composition that said something, and what was said."""

    rounds: list[list[Write]] = field(default_factory=list)
    composed: list[r.Composed] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    @property
    def writes(self) -> list[Write]:
        """Every write, in order."""
        return [w for rnd in self.rounds for w in rnd]

    def written(self) -> list[str]:
        """Every write as `state key` (with `-` for a delete), in order."""
        return [f"{'-' if isinstance(w, Delete) else ''}{w.state} {w.key}" for w in self.writes]

    def report(self, node: str) -> r.Composed:
        """The last report of a node that said something."""
        found = [c for c in self.composed if c.node == node]
        assert found, f"{node} said nothing"
        return found[-1]


def one_round(view: MemoryView, now: datetime, out: Settled) -> list[Write]:
    """Compose every node, judge every key again and read every retiring key's answer, once."""
    writes: list[Write] = []
    for node in nodes_of(view):
        res = compose_node(view, node, now)
        if res.composed or res.composed.modules_held:
            out.composed.append(res.composed)
        for w in res.writes:
            apply(view, w)
            writes.append(w)
    for key in sorted(view.keys(PROVISIONS)):
        judged = rejudge(view, key, now)
        if judged.said:
            out.said.append(judged.said)
        for w in judged.writes:
            apply(view, w)
            writes.append(w)
    for key in retiring_keys(view):
        decided = decide(view, key, now)
        if decided.said:
            out.said.append(decided.said)
        for w in decided.writes:
            apply(view, w)
            writes.append(w)
    return writes


def settle(view: MemoryView, now: datetime = NOW, max_rounds: int = 20) -> Settled:
    """Run whole rounds until one writes nothing; a seat that does not settle within max_rounds fails the test."""
    out = Settled()
    for _ in range(max_rounds):
        writes = one_round(view, now, out)
        out.rounds.append(writes)
        if not writes:
            return out
    raise AssertionError(f"not settled in {max_rounds} rounds; the last wrote {[(w.state, w.key) for w in writes]}")


def wake_settle(view: MemoryView, woken: Woken, now: datetime = NOW, max_steps: int = 2000) -> Settled:
    """From what one change woke, run only what the read sets wake, following each write's wakes, until none is left.

    Every judgment's read set is recorded first, as the seat's last runs left them; each run records its own again.
    """
    out = Settled()
    reads = read_sets(view, now)
    queue: deque[Judgment] = deque(
        [*(("compose", n) for n in sorted(woken.nodes)), *(("judge", x) for x in sorted(woken.keys)),
         *(("look", x) for x in sorted(woken.decide))]
    )
    steps = 0
    while queue:
        steps += 1
        assert steps <= max_steps, "the wakes do not settle"
        j = queue.popleft()
        recording = Reads(view)
        writes, said, composed = run(recording, j, now)
        reads[j] = frozenset(recording.tokens)
        if composed:
            out.composed.append(composed)
        if said:
            out.said.append(said)
        for w in writes:
            old, new = apply(view, w)
            more = woken_by(view, reads, w.state, w.key, old, new)
            for nxt in [*(("compose", n) for n in sorted(more.nodes)), *(("judge", x) for x in sorted(more.keys)),
                        *(("look", x) for x in sorted(more.decide))]:
                if nxt != j and nxt not in queue:
                    queue.append(nxt)
        out.rounds.append(writes)
    return out


def token_keys(view: MemoryView, state: str) -> list[str]:
    """A state's keys that are made of tokens."""
    return sorted(key for key in view.keys(state) if all(k.is_token(t) for t in key.split(".")))


def sample_mesh() -> Mesh:
    """The sample mesh the package ships (mesh_provisioner/samples/mesh.json)."""
    from importlib import resources

    data = json.loads(resources.files("mesh_provisioner").joinpath("samples/mesh.json").read_text())
    m = Mesh()
    for state, entries in data["states"].items():
        for key, value in entries.items():
            m.put(state, key, value)
    return m


def keeper(m: Mesh, name: str, *provides: Offer, fp: str = "1", reads_plans: bool = True) -> Woken:
    """A provider that keeps its outcomes in its entries (`bound`), reading the seat's plans."""
    return m.module(name, fp, provides=provides, state=["bound"], reads=[PLANS] if reads_plans else [])
