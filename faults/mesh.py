"""The mesh a fault run works on: the sample mesh and a few more modules and builds, and a seeded stream of changes.

The stream changes the other modules' states at random (placement, wants, haves, provider outcomes, resolved
providers, a module's trunk manifest) and lets the router decide the asks it holds, then ends by setting every input
of a composition to a final mesh in which no module is held, so that what a seat ends with depends on the final
inputs alone (a held module keeps its last plan: that would depend on history).

The mesh has `nodes` nodes (3 by default: the sample's ace and bee, and cat). Past three, the nodes are grown
(`grown`): n003, n004, ... each placed with consumers of the sample's manifests (webapp, mailer, reports), one in ten
also a provider node (postgres, keycloak, minio), and every consumer resolved (mesh-config) to its group's provider
node, bee's to ace and cat, since each of those provisions is then provided on several nodes. The grown nodes are
loaded with the sample mesh and are part of the final mesh; the stream draws its nodes from all of them. With three
nodes the stream, the final mesh and the loaded mesh are exactly what they were before the mesh could grow, for
every seed.

The stream is over this catalogue, not over the benchmarks' generated mesh (`benchmarks/mesh.py`): that one's
modules are synthetic apps with no intermediate variety (builds, trunk manifests, retiring keys, providers judged by
their have) for the stream to change, and its keys would not be the sample's, which three-node runs keep.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import msgspec

from mesh_provisioner.contract import (
    ASK_RECORDS,
    BUILDS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    PLANS,
    RESOLVED,
    WANTS,
    bound,
)
from mesh_provisioner.samples import sample_mesh
from meshcheck.bus import Bus, raw

NODES = ("ace", "bee", "cat")
# A grown mesh: one grown node in PROVIDER_EVERY is a provider node, with these modules; every other grown node
# is placed with one of CONSUMERS, in turn.
PROVIDER_EVERY = 10
PROVIDERS = ("postgres", "keycloak", "minio", "webapp")
CONSUMERS = (("webapp",), ("mailer",), ("reports",), ("webapp", "mailer", "reports"), ("mailer", "reports"))
# What each consumer requires that a grown mesh provides on several nodes: mesh-config resolves it.
SEVERAL = {"webapp": ("postgres-database", "oidc-client"), "mailer": ("postgres-database",),
           "reports": ("object-storage",)}
FPS = {
    "postgres": ("pg1",),
    "gitea": ("gt1", "gt2"),
    "mesh-vault": ("mv1",),
    "keycloak": ("kc1",),
    "webapp": ("wa1", "wa2"),
    "reports": ("rp1",),
    "mailer": ("ml1",),
    "minio": ("mi1",),
}
MODULES_ALL = tuple(FPS)

# What the sample mesh does not have and the stream uses: minio (object-storage), keycloak's manifest that provides
# object-storage too, gitea's build that needs an oidc client, webapp's build that needs no credential.
EXTRA: dict[str, dict[str, Any]] = {
    MANIFESTS: {
        "m-minio": {"name": "minio", "provides": ["object-storage"]},
        "m-keycloak-s3": {"name": "keycloak", "provides": ["oidc-client", "object-storage"]},
        "m-gitea2": {
            "name": "gitea",
            "requires": [
                {"provision": "postgres-database", "local": "main", "credential": "own"},
                {"provision": "oidc-client"},
            ],
            "provides": [{"name": "forge-account", "answered-by": "helper"}, "npm-package-registry"],
            "state": ["bound"],
            "reads": [PLANS],
        },
        "m-webapp2": {
            "name": "webapp",
            "requires": [{"provision": "postgres-database"}, {"provision": "forge-account"},
                         {"provision": "oidc-client"}],
        },
    },
    MODULES: {"minio": {"module": "minio", "fp": "mi1", "manifest": "m-minio"}},
    BUILDS: {
        "minio.mi1": {"module": "minio", "fp": "mi1", "manifest": "m-minio"},
        "gitea.gt2": {"module": "gitea", "fp": "gt2", "manifest": "m-gitea2"},
        "webapp.wa2": {"module": "webapp", "fp": "wa2", "manifest": "m-webapp2"},
    },
}

# The states the stream changes that compose a node; the final mesh sets each of them.
COMPOSING = (PLACEMENT, WANTS, MODULES, RESOLVED, HAVE)
# The sample's bound entries that name a vault value: left alone, so that a key's reference (which a provision
# keeps from the last entry that named one) cannot depend on which intermediate entries a seat happened to see.
REFERENCED = {
    (bound("mesh-vault"), "ace.gitea.postgres-database-credential.main"),
    (bound("postgres"), "ace.gitea.postgres-database.main"),
    (bound("mesh-vault"), "ace.postgres.postgres-database-credential"),
}
Change = tuple[str, str, dict[str, Any] | None]
# Not a state: the router decides every ask it holds and has not decided yet, each key's answer always the same.
ROUTER = "router"


def extra_states() -> dict[str, dict[str, bytes]]:
    """The states the stream needs beyond the sample mesh, as bytes."""
    return {state: {key: raw(v) for key, v in values.items()} for state, values in EXTRA.items()}


def node_names(nodes: int = len(NODES)) -> tuple[str, ...]:
    """The mesh's nodes: ace, bee and cat, then n003, n004, ... up to `nodes` in all."""
    if nodes < len(NODES):
        raise ValueError(f"a fault run's mesh has at least {len(NODES)} nodes, not {nodes}")
    return NODES + tuple(f"n{i:03d}" for i in range(len(NODES), nodes))


def provider_node(i: int) -> str:
    """The provider node of grown node i's group (itself, for a provider node)."""
    return f"n{i - (i - len(NODES)) % PROVIDER_EVERY:03d}"


def grown(nodes: int) -> dict[tuple[str, str], bytes]:
    """The composing inputs of the nodes past the first three (nothing for three): their placement, wants, haves and
    resolved providers, and bee's resolved providers, which the grown provider nodes make ambiguous."""
    if nodes <= len(NODES):
        return {}
    out: dict[tuple[str, str], bytes] = {}
    for i, node in enumerate(node_names(nodes)[len(NODES):], start=len(NODES)):
        provider = provider_node(i)
        first = (i - len(NODES)) % PROVIDER_EVERY == 0
        modules = PROVIDERS if first else CONSUMERS[(i - len(NODES)) % len(CONSUMERS)]
        out[(PLACEMENT, node)] = raw({"node": node, "modules": [{"module": m} for m in modules]})
        for m in modules:
            out[(WANTS, f"want.{node}.{m}")] = raw({"fp": FPS[m][0]})
            out[(HAVE, f"{node}.{m}")] = raw({"fp": FPS[m][0], "phase": "running", "health": "ok"})
            if m in SEVERAL:
                out[(RESOLVED, f"{node}.{m}")] = raw({"providers": dict.fromkeys(SEVERAL[m], provider)})
    sample_node = {"postgres-database": "ace", "oidc-client": "ace", "object-storage": "cat"}
    for m in ("webapp", "mailer", "reports"):
        out[(RESOLVED, f"bee.{m}")] = raw({"providers": {p: sample_node[p] for p in SEVERAL[m]}})
    return out


def initial_states(nodes: int = len(NODES)) -> dict[str, dict[str, bytes]]:
    """What a run's buses are loaded with: the sample mesh, the stream's extra states and the grown nodes."""
    states = sample_mesh()
    for state, values in extra_states().items():
        states.setdefault(state, {}).update(values)
    for (state, key), value in grown(nodes).items():
        states.setdefault(state, {})[key] = value
    return states


def final_mesh(nodes: int = len(NODES)) -> dict[tuple[str, str], bytes]:
    """The composing inputs the stream ends with: the sample's, minio on cat, so that reports composes, and the
    grown nodes' (as loaded)."""
    sample = sample_mesh()
    out = {(state, key): v for state in COMPOSING for key, v in sample.get(state, {}).items()}
    out[(PLACEMENT, "cat")] = raw({"node": "cat", "modules": [{"module": "minio"}]})
    out[(MODULES, "minio")] = raw(EXTRA[MODULES]["minio"])
    out.update(grown(nodes))
    return out


def bound_keys(nodes: int = len(NODES)) -> list[tuple[str, str]]:
    """The provider entries the stream writes: keys the seat may make on any node, but the referenced ones."""
    out = []
    for node in node_names(nodes):
        for provider, key in (
            ("postgres", f"{node}.webapp.postgres-database"),
            ("postgres", f"{node}.mailer.postgres-database.mail"),
            ("postgres", f"{node}.gitea.postgres-database.main"),
            ("gitea", f"{node}.webapp.forge-account"),
            ("mesh-vault", f"{node}.mailer.postgres-database-credential.mail"),
            ("mesh-vault", f"{node}.gitea.postgres-database-credential.main"),
            ("mesh-vault", f"{node}.postgres.postgres-database-credential"),
        ):
            if (bound(provider), key) not in REFERENCED:
                out.append((bound(provider), key))
    return out


def random_changes(rng: random.Random, n: int, nodes: int = len(NODES)) -> list[Change]:
    """n random changes of the other modules' states (and now and then the router deciding what it holds), over a
    mesh of `nodes` nodes."""
    bounds = bound_keys(nodes)
    names = node_names(nodes)
    sample_haves = list(sample_mesh()[HAVE])
    wanted = [key.removeprefix("want.") for key in sample_mesh()[WANTS]]
    wanted += [key.removeprefix("want.") for state, key in grown(nodes) if state == WANTS]
    changes: list[Change] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.18:
            node = rng.choice(names)
            modules = [m for m in MODULES_ALL if rng.random() < 0.45]
            changes.append((PLACEMENT, node, {"node": node, "modules": [{"module": m} for m in modules]}))
        elif roll < 0.32:
            node, module = rng.choice(names), rng.choice(MODULES_ALL)
            choice = rng.random()
            value = {"fp": rng.choice(FPS[module])} if choice < 0.7 else {"fp": "", "removed": True}
            changes.append((WANTS, f"want.{node}.{module}", value if choice < 0.9 else None))
        elif roll < 0.46:
            # Only haves of modules the final mesh wants: a have of a module with no want composes it.
            key = rng.choice(sample_haves + wanted)
            module = key.split(".", 1)[1]
            phase, health = rng.choice([("running", "ok"), ("running", "ok"), ("starting", "unknown"),
                                        ("failed", "failed"), ("running", "failed")])
            changes.append((HAVE, key, {"fp": FPS[module][0], "phase": phase, "health": health}))
        elif roll < 0.80:
            state, key = rng.choice(bounds)
            outcome = rng.choice([{"state": "provided"}, {"state": "provided"}, {"state": "failed", "why": "quota"},
                                  {"state": "waits", "why": "a person accepts it"}, None])
            changes.append((state, key, outcome))
        elif roll < 0.90:
            node = rng.choice(names)
            resolved = {"providers": {"oidc-client": rng.choice(names), "object-storage": rng.choice(names)}}
            changes.append((RESOLVED, f"{node}.webapp", resolved if rng.random() < 0.7 else None))
        elif roll < 0.97:
            manifest = rng.choice(["m-keycloak", "m-keycloak-s3"])
            changes.append((MODULES, "keycloak", {"module": "keycloak", "fp": "kc1", "manifest": manifest}))
        else:
            changes.append((ROUTER, "", None))
    return changes


def final_changes(changes: list[Change], nodes: int = len(NODES)) -> list[Change]:
    """The changes that set every composing key the stream touched, and every key of the three nodes' final mesh, to
    the final mesh (a grown node's key the stream did not touch holds its final value since it was loaded)."""
    final = final_mesh(nodes)
    touched = {(state, key) for state, key, _ in changes if state in COMPOSING}
    out: list[Change] = []
    for state, key in sorted(touched | set(final_mesh())):
        value = final.get((state, key))
        out.append((state, key, msgspec.json.decode(value) if value is not None else None))
    return out


def stream(seed: int, n: int, nodes: int = len(NODES)) -> list[Change]:
    """A seeded stream of n random changes of the other modules' states, then the final mesh."""
    changes = random_changes(random.Random(seed), n, nodes)
    return changes + final_changes(changes, nodes)


class Router:
    """The router of one bus, as the stream plays it: decides each ask it has not decided yet, yes for about half the
    keys and no for the rest. It reads the asks published since it last looked, not the whole stream again: a run's
    stream of asks grows with the run, and reading all of it at each decision slowed the stream below its pace."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.read = 0  # the last sequence of the router's stream decided (or not an ask)

    def decide(self) -> None:
        """Decide each ask published since the last look."""
        for seq, msg_id, ask in self.bus.asks_since(self.read):
            if self.bus.get(ASK_RECORDS, msg_id) is None:
                key = ask.about.removeprefix("provision.")
                self.bus.decide(key, msg_id, "yes" if zlib.crc32(key.encode()) % 2 else "no")
            self.read = seq


def write(bus: Bus, change: Change, router: Router) -> None:
    """Make one change on a bus: a state's key written, or its router deciding."""
    state, key, value = change
    if state == ROUTER:
        router.decide()
    else:
        bus.write(state, key, value)


def prepare(bus: Bus, *, replicas: int = 1, nodes: int = len(NODES)) -> None:
    """The sample mesh, the stream's extra states and the grown nodes on a bus, and the router's stream of asks and
    its records.

    Written through the bus's connection, so that a put a new cluster cannot take yet (its streams electing their
    leaders) is made again until it is.
    """
    for state, values in initial_states(nodes).items():
        bus.create_bucket(state, replicas=replicas)
        for key, value in values.items():
            bus.put(state, key, value)
    bus.create_asks_stream(replicas=replicas)
