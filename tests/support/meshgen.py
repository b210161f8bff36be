"""Random small meshes from a seed, and a random history that ends at them.

`generate(seed)` makes one mesh of 2 to 6 nodes as the other modules of the mesh would have written it (contract
section 2): placements (several nodes of one module, nodes with nothing), manifests at one or two builds
(requirements with and without `local`, own and shared credentials, now and then a credential word that makes a
manifest bad), registrations (now and then missing or at an older build), wants and haves (mostly running healthy
at the wanted build), resolved choices where a provision is offered on several nodes, providers that keep their
outcomes in `<provider>.bound` (for all their offers, or only for those `answered-by: helper`) and ones that do
not, mesh-vault placed or not, and a share of values that do not decode. Its `inputs` are the final values,
`{(state, key): bytes}`.

Its `ops` are one history that ends at those inputs: each key put, some first with another value (a decoy), some
deleted and written again, some keys that only the history has (put, then deleted), in a random interleaving;
with where a seat starts, where an actor is killed, where the test waits for the seat to settle, and (when asked)
where the server restarts.

A provider's entry names a vault value (`vault-name`, `generation`) only in mesh-vault's entries, and a decoy names
one only when the final entry names the same: a provision keeps the last reference an entry gave it (section 4),
so that another would make the final bus depend on history, which the comparison could not tell from a fault.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mesh_provisioner.contract import (
    BUILDS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    PLANS,
    PROVISIONS,
    RESOLVED,
    VAULT_MODULE,
    WANTS,
    bound,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.judge import keeps_entries
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.settle import settle
from meshcheck import settled

Inputs = dict[tuple[str, str], bytes]

# The providers whose entries the seat reads here; redis keeps entries sometimes, and is not read (section 2).
BOUND_READS = ("postgres", "gitea", "keycloak", "mesh-vault")
OFFERS = {
    "postgres": ("postgres-database",),
    "gitea": ("forge-account", "npm-registry"),
    "keycloak": ("oidc-client",),
    "redis": ("cache",),
    "minio": ("object-storage",),
    VAULT_MODULE: ("secret",),
}
CONSUMERS = ("wiki", "webapp", "reports")
REQUIRABLE = ("postgres-database", "forge-account", "npm-registry", "oidc-client", "cache", "object-storage")
JUNK = (b"{", b"[]", b'"x"', b"null", b'{"fp": [1]}', b'{"modules": 3}', b'{"providers": "n1"}', b"\xff\xfe",
        b'{"state": {}}', b'{"requires": [{"provision": 7}]}')
NOW = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)


def js(value: Any) -> bytes:
    """A value as another module writes it: JSON."""
    return json.dumps(value).encode()


@dataclass(frozen=True)
class Op:
    """One step of a history: `put` or `delete` a key, `start` the seat, `kill` a child (the `pick`th, modulo how
    many there are), `quiet` (wait until the seat settles), `restart` the server."""

    kind: str
    state: str = ""
    key: str = ""
    value: bytes | None = None
    pick: int = 0

    def __str__(self) -> str:
        if self.kind == "put":
            assert self.value is not None
            return f"put {self.state} {self.key} {self.value[:80]!r}"
        if self.kind == "delete":
            return f"delete {self.state} {self.key}"
        return f"{self.kind} {self.pick}" if self.kind == "kill" else self.kind


@dataclass
class Generated:
    """One random mesh: its final inputs, and a history that ends at them."""

    seed: int
    nodes: tuple[str, ...]
    inputs: Inputs
    ops: list[Op] = field(default_factory=list)

    def history(self) -> str:
        """The history, one step a line, for a failing run's message."""
        return "\n".join(f"  {i:3d} {op}" for i, op in enumerate(self.ops))


@dataclass
class _Catalogue:
    modules: dict[str, list[str]]  # module -> its builds, oldest first
    manifests: dict[str, dict[str, Any]]  # manifest id -> manifest
    placed: dict[str, list[str]]  # node -> modules placed there


def generate(seed: int, *, restart: bool = False, cycles: bool = False) -> Generated:
    """The mesh and history of a seed; with `restart`, the history restarts the server once after the seat starts;
    with `cycles`, modules may require, in turn, what each other provides."""
    rng = random.Random(seed)
    nodes = tuple(f"n{i}" for i in range(1, rng.randint(2, 6) + 1))
    cat = _catalogue(rng, nodes, cycles)
    inputs = _inputs(rng, nodes, cat)
    inputs.update(_entries(rng, inputs))
    ops = _history(rng, nodes, cat, inputs, restart=restart)
    return Generated(seed, nodes, inputs, ops)


def view_of(inputs: Iterable[tuple[tuple[str, str], bytes]], bound_reads: tuple[str, ...] = BOUND_READS) -> MemoryView:
    """A view holding exactly these values, each at its own revision (meshcheck.settled.view_of)."""
    return settled.view_of(inputs, bound_reads)


# ---- the mesh ---------------------------------------------------------------------------------------------------


def _manifest(rng: random.Random, module: str, requires: list[dict[str, str]]) -> dict[str, Any]:
    offers: list[Any] = list(OFFERS.get(module, ()))
    if module == "gitea" and rng.random() < 0.6:
        offers[0] = {"name": "forge-account", "answered-by": "helper"}
    out: dict[str, Any] = {"name": module, "requires": requires, "provides": offers}
    keeps = {VAULT_MODULE: 0.9, "redis": 0.5}.get(module, 0.6 if module in OFFERS else 0.0)
    if rng.random() < keeps:
        out["state"] = [rng.choice(["bound", {"name": "bound"}]), "data"]
    if rng.random() < 0.85:
        out["reads"] = [PLANS]
    return out


def _requirement(rng: random.Random, module: str, among: Iterable[str] = REQUIRABLE) -> dict[str, str]:
    provision = rng.choice([p for p in among if p not in OFFERS.get(module, ())])
    req = {"provision": provision}
    local = rng.choice(["", "", "", "main", "extra"])
    if local:
        req["local"] = local
    credential = rng.choices(["", "own", "shared", "mine"], [50, 25, 22, 3])[0]
    if credential:
        req["credential"] = credential
    return req


def _catalogue(rng: random.Random, nodes: tuple[str, ...], cycles: bool) -> _Catalogue:
    providers = [m for m in OFFERS if m in ("postgres", VAULT_MODULE) or rng.random() < 0.7]
    consumers = rng.sample(CONSUMERS, rng.randint(1, 3))
    # Without cycles, a module requires only what modules after it in a random order provide (or, now and then,
    # what no module of the mesh provides, which holds it): no provider then waits, through the keys it depends on,
    # for a key that waits for it.
    order = rng.sample(providers, len(providers))
    offered = {p for m in providers for p in OFFERS[m] if p in REQUIRABLE}
    absent = [p for p in REQUIRABLE if p not in offered]
    modules: dict[str, list[str]] = {}
    manifests: dict[str, dict[str, Any]] = {}
    for module in providers + consumers:
        later = order[order.index(module) + 1:] if module in order else order
        among = [p for m in later for p in OFFERS[m] if p in REQUIRABLE]
        if cycles:
            among = sorted(offered)
        if rng.random() < 0.1:
            among += absent
        most = 0 if module == VAULT_MODULE or not among else 2 if module in OFFERS else 3
        requires = [_requirement(rng, module, among) for _ in range(rng.randint(min(most, 0 if module in OFFERS
                                                                                    else 1), most))]
        requires = list({(q["provision"], q.get("local", "")): q for q in requires}.values())
        modules[module] = ["1", "2"] if rng.random() < 0.4 else ["1"]
        manifests[f"{module}-1"] = _manifest(rng, module, requires)
        if len(modules[module]) == 2:
            newer = [*requires[: rng.randint(0, len(requires))], *([_requirement(rng, module, among)] if most else [])]
            newer = list({(q["provision"], q.get("local", "")): q for q in newer}.values())
            manifests[f"{module}-2"] = {**manifests[f"{module}-1"], "requires": newer}
    placed: dict[str, list[str]] = {n: [] for n in nodes}
    for module in modules:
        if module == VAULT_MODULE:
            count = rng.choices([0, 1, 2], [15, 75, 10])[0]
        else:
            count = rng.choices([1, 2, 3], [65, 28, 7] if module in OFFERS else [40, 40, 20])[0]
        for node in rng.sample(nodes, min(count, len(nodes))):
            placed[node].append(module)
    return _Catalogue(modules, manifests, placed)


def _want(rng: random.Random, builds: list[str]) -> Any:
    """A want of a module: mostly its newest build; now and then an older one, removed, or one never built."""
    return rng.choices(
        [{"fp": builds[-1]}, {"fp": builds[0]}, {"fp": "", "removed": True}, {"fp": "9"}, None], [74, 8, 5, 4, 9]
    )[0]


def _have(rng: random.Random, fp: str, builds: list[str]) -> dict[str, str]:
    """A have: mostly running healthy at `fp`."""
    if rng.random() < 0.8:
        return {"fp": fp, "phase": "running", "health": "ok"}
    phase, health = rng.choice([("starting", "unknown"), ("failed", "failed"), ("running", "failed"),
                                ("stopped", "unknown"), ("running", "ok")])
    return {"fp": rng.choice(builds), "phase": phase, "health": health, "detail": "as the engine says"}


def _inputs(rng: random.Random, nodes: tuple[str, ...], cat: _Catalogue) -> Inputs:
    out: Inputs = {}
    for mid, manifest in cat.manifests.items():
        out[(MANIFESTS, mid)] = js(manifest)
    for module, builds in cat.modules.items():
        for fp in builds:
            out[(BUILDS, f"{module}.{fp}")] = js({"module": module, "fp": fp, "manifest": f"{module}-{fp}"})
        registered = rng.choices([builds[-1], builds[0], None], [93, 3, 4])[0]
        if registered is not None:
            out[(MODULES, module)] = js({"module": module, "fp": registered, "manifest": f"{module}-{registered}"})
    for node in nodes:
        if cat.placed[node] or rng.random() < 0.5:
            out[(PLACEMENT, node)] = js({"node": node, "modules": [{"module": m} for m in cat.placed[node]]})
        others = [m for m in cat.modules if m not in cat.placed[node] and rng.random() < 0.04]
        for module in cat.placed[node] + others:
            builds = cat.modules[module]
            want = _want(rng, builds)
            if want is not None:
                out[(WANTS, f"want.{node}.{module}")] = js(want)
            fp = want["fp"] if want is not None and want["fp"] in builds else builds[-1]
            if want is not None or rng.random() < 0.5:
                out[(HAVE, f"{node}.{module}")] = js(_have(rng, fp, builds))
    offered: dict[str, set[str]] = {}
    for node, modules in cat.placed.items():
        for module in modules:
            for provision in OFFERS.get(module, ()):
                offered.setdefault(provision, set()).add(node)
    for node, modules in cat.placed.items():
        for module in modules:
            needs = {q["provision"] for mid in (f"{module}-1", f"{module}-2") for q in
                     cat.manifests.get(mid, {}).get("requires", [])}
            choices = {p: sorted(offered[p]) for p in sorted(needs) if len(offered.get(p, ())) > 1}
            if (choices and rng.random() < 0.8) or rng.random() < 0.05:
                providers = {p: rng.choice(ns if rng.random() < 0.85 else nodes) for p, ns in choices.items()}
                out[(RESOLVED, f"{node}.{module}")] = js({"providers": providers})
    # A share of meshes has one value that does not decode; now and then a placement (its node is not composed).
    if rng.random() < 0.25:
        keys = sorted(k for k in out if k[0] in (WANTS, HAVE, RESOLVED, BUILDS, MANIFESTS, MODULES))
        out[rng.choice(keys)] = rng.choice(JUNK)
    if rng.random() < 0.04:
        keys = sorted(k for k in out if k[0] == PLACEMENT)
        if keys:
            out[rng.choice(keys)] = rng.choice(JUNK)
    return out


def _entry(rng: random.Random, state: str, key: str) -> bytes:
    """A provider's outcome for a key: mostly provided; failed, waits, nothing said, or not decoding now and then."""
    roll = rng.random()
    if roll < 0.55:
        value: dict[str, Any] = {"state": "provided"}
        if state == bound(VAULT_MODULE) and rng.random() < 0.3:
            value.update({"vault-name": f"vault/{key}", "generation": rng.randint(1, 3)})
        return js(value)
    return rng.choice([js({"state": "failed", "why": "the quota is used up"}), js({"state": "waits",
                      "waits": "an admin accepts it"}), js({}), js({"refused": "not for this consumer"}),
                      js({"state": "pending"}), b"junk"])


def _entries(rng: random.Random, inputs: Inputs) -> Inputs:
    """Providers' entries for the keys `settle()` makes of these inputs (most of those whose provider keeps
    entries, a few of those whose provider does not), and one for a key nothing makes now and then."""
    view = view_of(inputs.items())
    settle(view, NOW)
    out: Inputs = {}
    for key in sorted(view.keys(PROVISIONS)):
        e = view.get(PROVISIONS, key)
        p = e.get(r.Provision) if e is not None else None
        if p is None:
            continue
        keeps, _ = keeps_entries(view, p.provider.module, p.provision)
        if rng.random() < (0.75 if keeps else 0.05):
            state = bound(p.provider.module)
            out[(state, key)] = _entry(rng, state, key)
    if rng.random() < 0.1:
        state = bound(rng.choice(BOUND_READS))
        out[(state, "n1.wiki.postgres-database")] = _entry(rng, state, "n1.wiki.postgres-database")
    return out


# ---- the history ------------------------------------------------------------------------------------------------


def _decoy(rng: random.Random, state: str, key: str, final: bytes, nodes: tuple[str, ...], cat: _Catalogue) -> bytes:
    """Another value of a key than its final one, as the history may have had it."""
    if rng.random() < 0.08:
        return rng.choice(JUNK)
    if state == PLACEMENT:
        modules = [m for m in cat.modules if rng.random() < 0.35]
        return js({"node": key, "modules": [{"module": m} for m in modules]})
    if state == WANTS:
        builds = cat.modules.get(key.rsplit(".", maxsplit=1)[-1], ["1"])
        return js(rng.choice([{"fp": builds[0]}, {"fp": builds[-1]}, {"fp": "", "removed": True}, {"fp": "9"}]))
    if state == HAVE:
        builds = cat.modules.get(key.rsplit(".", maxsplit=1)[-1], ["1"])
        return js(_have(rng, rng.choice(builds), builds) if rng.random() < 0.5 else
                  {"fp": builds[-1], "phase": "starting", "health": "unknown"})
    if state == RESOLVED:
        return js({"providers": {rng.choice(REQUIRABLE): rng.choice(nodes)}})
    if state == MODULES:
        builds = cat.modules.get(key, ["1"])
        fp = rng.choice(builds)
        return js({"module": key, "fp": fp, "manifest": rng.choice([f"{key}-{fp}", f"{key}-9"])})
    if state == MANIFESTS:
        module = key.rsplit("-", 1)[0]
        manifest = dict(cat.manifests.get(key, {"name": module}))
        manifest["requires"] = [] if rng.random() < 0.5 else [_requirement(rng, module)]
        if rng.random() < 0.3:
            manifest.pop("state", None)
        return js(manifest)
    if state == BUILDS:
        module, fp = key.split(".", 1)
        return js({"module": module, "fp": fp, "manifest": f"{module}-{rng.choice(cat.modules.get(module, ['1']))}"})
    # A provider's entry: one that names a vault value names the final entry's, if any (the module's docstring).
    decoy = _entry(rng, state, key)
    said, named = _json(decoy), _json(final)
    if isinstance(said, dict) and ("vault-name" in said or "generation" in said):
        if isinstance(named, dict) and ("vault-name" in named or "generation" in named):
            return js({**said, "vault-name": named.get("vault-name", ""), "generation": named.get("generation", 0)})
        return js({"state": "provided"})
    return decoy


def _json(raw: bytes) -> Any:
    """What a value says as JSON, None when it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _only_in_history(rng: random.Random, nodes: tuple[str, ...], cat: _Catalogue, inputs: Inputs) -> Inputs:
    """Keys the history puts and then deletes: a node placed and taken away, wants and haves of modules not
    placed, resolved choices no longer made."""
    out: Inputs = {}
    modules = list(cat.modules)
    if rng.random() < 0.15:
        node = "n9"
        placed = rng.sample(modules, min(len(modules), rng.randint(1, 3)))
        out[(PLACEMENT, node)] = js({"node": node, "modules": [{"module": m} for m in placed]})
    for _ in range(rng.randint(0, 3)):
        node, module = rng.choice(nodes), rng.choice(modules)
        state, key = rng.choice([(WANTS, f"want.{node}.{module}"), (HAVE, f"{node}.{module}"),
                                 (RESOLVED, f"{node}.{module}")])
        if (state, key) not in inputs:
            out[(state, key)] = _decoy(rng, state, key, b"{}", nodes, cat)
    return out


def _history(rng: random.Random, nodes: tuple[str, ...], cat: _Catalogue, inputs: Inputs, *, restart: bool) -> list[Op]:
    """A random interleaving of each key's own steps, ending at `inputs`, with the seat's start, kills, waits for
    the seat to settle, and a server restart."""
    lanes: list[list[Op]] = []
    decoys = rng.choice([0.0, 0.15, 0.3, 0.5])
    deletes = rng.choice([0.0, 0.08, 0.2])
    for (state, key), value in sorted(inputs.items()):
        lane: list[Op] = []
        if rng.random() < decoys:
            lane.append(Op("put", state, key, _decoy(rng, state, key, value, nodes, cat)))
        if rng.random() < deletes:
            lane.append(Op("delete", state, key))
        lane.append(Op("put", state, key, value))
        lanes.append(lane)
    for (state, key), value in sorted(_only_in_history(rng, nodes, cat, inputs).items()):
        lanes.append([Op("put", state, key, value), Op("delete", state, key)])
    steps: list[Op] = []
    while lanes:
        lane = rng.choices(lanes, [len(x) for x in lanes])[0]
        steps.append(lane.pop(0))
        if not lane:
            lanes.remove(lane)
    # Where the seat starts: before anything (it sees every change), after everything (a cold start), or between.
    start = rng.choices([0, len(steps), rng.randint(0, len(steps))], [30, 40, 30])[0]
    extra = [Op("kill", pick=rng.randrange(1000)) for _ in range(rng.choices([0, 1, 2, 4], [40, 30, 20, 10])[0])]
    extra += [Op("quiet") for _ in range(rng.choices([0, 1, 2], [70, 22, 8])[0])]
    if restart:
        extra.append(Op("restart"))
    after = steps[start:]
    for op in extra:
        after.insert(rng.randint(0, len(after)), op)
    return [*steps[:start], Op("start"), *after]
