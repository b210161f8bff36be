"""A seeded synthetic mesh for the benchmarks: N nodes of about twenty modules each, and its loading into a bus.

The catalogue has providers that keep their outcomes in their `bound` entries (in BoundReads) and providers judged by
their own have, consumers ("apps") that require one to three provisions with an own, a shared or no credential, and
a share of apps that are held (one requires a provision nobody provides, one's manifest is missing). Where a
provision is provided on several nodes and none on the consumer's own, `mesh-config.resolved` names one.

The mesh is the other modules' states (contract section 2) as bytes, by state and key, and the generator knows
what the seat will make of it: which provision key each requirement gets and who provides it (`Mesh.keys`), so the
steady-state benchmark can change a provider's word and know which write it causes.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any, Final

import nats
from nats.js.api import StreamConfig

from mesh_provisioner.contract import (
    ASK_RECORDS,
    BUILDS,
    DEFAULT_BOUND_READS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    PLANS,
    RESOLVED,
    ROUTER_STREAM,
    ROUTER_SUBJECTS,
    VAULT_MODULE,
    WANTS,
    bound,
    bucket,
)

MODULES_PER_NODE: Final = 20
APP_KINDS: Final = 60

# The providers: module, what it provides, whether it keeps its outcomes in `bound` entries, what it requires,
# and on which share of the nodes it is placed (1.0: every node; 0: one node).
PROVIDERS: Final[tuple[tuple[str, tuple[Any, ...], bool, tuple[dict[str, str], ...], float], ...]] = (
    (VAULT_MODULE, ("secret",), True, (), 0.0),
    ("node-tools", ("node-agent",), True, (), 1.0),
    ("postgres", ("postgres-database",), True, (), 0.2),
    ("keycloak", ("oidc-client",), True,
     ({"provision": "postgres-database", "credential": "shared"},), 0.05),
    ("gitea", ({"name": "forge-account", "answered-by": "helper"}, "npm-package-registry"), True,
     ({"provision": "postgres-database", "local": "main", "credential": "own"},), 0.0),
    ("route-proxy", ("route",), True, (), 0.25),
    ("redis", ("cache",), False, (), 0.25),
    ("object-store", ("bucket",), False, (), 0.1),
    ("smtp", ("mail-relay",), False, (), 0.0),
    ("metrics", ("metrics-sink",), False, (), 0.125),
)
# What an app may require, each with the credential forms it is asked with.
NEEDS: Final = (
    ("postgres-database", ("own", "shared", "own")),
    ("oidc-client", ("own", "")),
    ("forge-account", ("",)),
    ("npm-package-registry", ("",)),
    ("route", ("",)),
    ("node-agent", ("",)),
    ("cache", ("", "own")),
    ("bucket", ("own", "shared")),
    ("mail-relay", ("shared", "")),
    ("metrics-sink", ("",)),
)
NOWHERE: Final = "quantum-link"  # provided by no module: an app requiring it is held


def offer_name(o: Any) -> str:
    """An offer's name, from its string or object form."""
    return o if isinstance(o, str) else str(o["name"])


@dataclass
class Key:
    """A provision key the seat makes from the mesh, and who provides it."""

    key: str
    provider: str  # module
    provider_node: str
    bound: bool  # its outcome is the provider's `bound` entry


@dataclass
class Mesh:
    """A generated mesh: the states by key, as bytes, and the keys the seat will make of it."""

    nodes: list[str]
    states: dict[str, dict[str, bytes]] = field(default_factory=dict)
    keys: dict[str, Key] = field(default_factory=dict)
    placed: dict[str, list[str]] = field(default_factory=dict)  # node -> modules
    bound_providers: frozenset[str] = frozenset()

    def count(self) -> int:
        """How many keys the mesh puts."""
        return sum(len(v) for v in self.states.values())

    def put(self, state: str, key: str, value: Any) -> None:
        """Keep one value, JSON-encoded."""
        self.states.setdefault(state, {})[key] = json.dumps(value, separators=(",", ":")).encode()


def generate(
    nodes: int,
    seed: int = 1,
    *,
    modules_per_node: int = MODULES_PER_NODE,
    heavy: int = 0,
    bound_share: float = 0.9,
) -> Mesh:
    """A mesh of `nodes` nodes of about `modules_per_node` modules each, the same for the same seed.

    With `heavy`, one more node (`heavy`) carries that many modules: the head-of-line benchmark's heavy node.
    `bound_share` of the keys whose provider keeps entries have one (provided); the rest wait for their provider.
    """
    rnd = random.Random(seed)
    names = [f"n{i:05d}" for i in range(nodes)]
    mesh = Mesh(nodes=list(names))
    offers: dict[str, str] = {}  # provision -> its one provider module
    bound_modules = set()
    helped: dict[str, set[str]] = {}
    for module, provides, keeps, requires, _ in PROVIDERS:
        for o in provides:
            offers[offer_name(o)] = module
        if keeps:
            bound_modules.add(module)
            helped[module] = {offer_name(o) for o in provides if not isinstance(o, str)}
        manifest: dict[str, Any] = {"name": module, "provides": list(provides)}
        if requires:
            manifest["requires"] = list(requires)
        if keeps:
            manifest["state"] = ["bound"]
            manifest["reads"] = [PLANS]
        _register(mesh, module, manifest)
    mesh.bound_providers = frozenset(bound_modules)

    # The apps: one to three needs each; every fifteenth is held for a provision nobody provides, and one has no
    # manifest at all.
    apps: dict[str, list[dict[str, str]]] = {}
    for i in range(APP_KINDS):
        name = f"app-{i:03d}"
        needs: list[dict[str, str]] = []
        for provision, forms in rnd.sample(NEEDS, rnd.choice((1, 2, 2, 3))):
            req = {"provision": provision}
            form = rnd.choice(forms)
            if form:
                req["credential"] = form
            if rnd.random() < 0.2:
                req["local"] = rnd.choice(("main", "audit", "ro"))
            needs.append(req)
        if i % 15 == 14:
            needs.append({"provision": NOWHERE})
        apps[name] = needs
        if i == APP_KINDS - 1:
            mesh.put(MODULES, name, {"module": name, "fp": "1", "manifest": f"{name}-1"})  # no build, no manifest
        else:
            _register(mesh, name, {"name": name, "requires": needs})

    # Placement: the providers by their share of nodes, then apps up to the node's size.
    where: dict[str, list[str]] = {}  # provider module -> nodes, in order
    for module, _, _, _, share in PROVIDERS:
        if share >= 1.0:
            chosen = list(names)
        elif share <= 0.0:
            chosen = [names[0]] if module == VAULT_MODULE else [names[min(len(names) - 1, 1)]]
        else:
            chosen = sorted(rnd.sample(names, max(1, round(share * len(names)))))
        where[module] = chosen
        for n in chosen:
            mesh.placed.setdefault(n, []).append(module)
    app_names = sorted(apps)
    for n in names:
        have = mesh.placed.setdefault(n, [])
        have += rnd.sample(app_names, max(0, modules_per_node - len(have)))
    if heavy:
        # The heavy node: many modules, each an app of its own kind, all needing what every node has.
        hv = f"heavy{heavy}"
        mesh.nodes.append(hv)
        mesh.placed[hv] = ["node-tools"]
        where["node-tools"].append(hv)
        for j in range(heavy - 1):
            name = f"hv-{j:04d}"
            needs = [{"provision": "node-agent", "local": "main"}, {"provision": "node-agent", "local": "aux"}]
            apps[name] = needs
            _register(mesh, name, {"name": name, "requires": needs})
            mesh.placed[hv].append(name)

    for n in mesh.nodes:
        mesh.put(PLACEMENT, n, {"node": n, "modules": [{"module": m} for m in mesh.placed[n]]})
        for m in mesh.placed[n]:
            mesh.put(WANTS, f"want.{n}.{m}", {"fp": "1"})
            mesh.put(HAVE, f"{n}.{m}", {"fp": "1", "phase": "running", "health": "ok"})

    # The keys each placed app's needs make, their providers, and what those providers said.
    vault_node = where[VAULT_MODULE][0]
    entries: list[tuple[str, str]] = []  # (provider module, key) whose provider keeps entries

    def keep(key: str, module: str, pnode: str) -> None:
        keeps = module in bound_modules and (not helped[module] or any(key.split(".")[2] == h for h in helped[module]))
        mesh.keys[key] = Key(key, module, pnode, keeps)
        if keeps:
            entries.append((module, key))

    consumers = [(n, m, apps.get(m) or _provider_needs(m)) for n in mesh.nodes for m in mesh.placed[n]]
    for n, m, needs in consumers:
        if m == app_names[-1] or any(r["provision"] == NOWHERE for r in needs):
            continue  # held: no keys
        resolved: dict[str, str] = {}
        for r in needs:
            provision = r["provision"]
            pmodule = offers[provision]
            pnodes = where[pmodule]
            if n in pnodes:
                pnode = n
            elif len(pnodes) == 1:
                pnode = pnodes[0]
            else:
                pnode = resolved.get(provision) or rnd.choice(pnodes)
                resolved[provision] = pnode
            local = r.get("local", "")
            key = ".".join(x for x in (n, m, provision, local) if x)
            keep(key, pmodule, pnode)
            form = r.get("credential", "")
            if form == "own":
                keep(".".join(x for x in (n, m, provision + "-credential", local) if x), VAULT_MODULE, vault_node)
            elif form == "shared":
                keep(f"{pnode}.{pmodule}.{provision}-credential", VAULT_MODULE, vault_node)
        if resolved:
            mesh.put(RESOLVED, f"{n}.{m}", {"providers": resolved})
    for module, key in entries:
        if rnd.random() < bound_share:
            mesh.put(bound(module), key, {"state": "provided", "vault-name": f"vault/{key}", "generation": 1})
    return mesh


def _provider_needs(module: str) -> list[dict[str, str]]:
    for name, _, _, requires, _ in PROVIDERS:
        if name == module:
            return list(requires)
    return []


def _register(mesh: Mesh, module: str, manifest: dict[str, Any]) -> None:
    """A module registered at build 1, with a second build (2) of the same manifest for want changes."""
    mid = f"{module}-1"
    mesh.put(MANIFESTS, mid, manifest)
    mesh.put(MODULES, module, {"module": module, "fp": "1", "manifest": mid})
    for fp in ("1", "2"):
        mesh.put(BUILDS, f"{module}.{fp}", {"module": module, "fp": fp, "manifest": mid})


def read_states(bound_reads: tuple[str, ...] = DEFAULT_BOUND_READS) -> tuple[str, ...]:
    """Every bucket the seat reads, which the mesh's other modules own: made before the mesh is loaded."""
    return (PLACEMENT, WANTS, MODULES, MANIFESTS, BUILDS, HAVE, RESOLVED, ASK_RECORDS,
            *(bound(p) for p in bound_reads))


async def load(url: str, mesh: Mesh, *, window: int = 4096) -> int:
    """Create the read buckets and put every key of the mesh with pipelined publishes; answers how many.

    Puts are published `window` at a time without waiting for each acknowledgement, then gathered.
    """
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=30)
        for state in read_states():
            await js.create_key_value(bucket=bucket(state), history=1)
        await js.add_stream(StreamConfig(name=ROUTER_STREAM, subjects=list(ROUTER_SUBJECTS),
                                         duplicate_window=24 * 3600.0))
        items = [(f"$KV.{bucket(s)}.{k}", v) for s, kv in mesh.states.items() for k, v in kv.items()]
        for i in range(0, len(items), window):
            await asyncio.gather(*(js.publish(subject, value) for subject, value in items[i : i + window]))
        return len(items)
    finally:
        await nc.close()
