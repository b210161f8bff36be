"""The mesh a fault run works on: the sample mesh and a few more modules and builds, and a seeded stream of changes.

The stream changes the other modules' states at random (placement, wants, haves, provider outcomes, resolved
providers, a module's trunk manifest) and lets the router decide the asks it holds, then ends by setting every input
of a composition to a final mesh in which no module is held, so that what a seat ends with depends on the final
inputs alone (a held module keeps its last plan: that would depend on history).
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


def final_mesh() -> dict[tuple[str, str], bytes]:
    """The composing inputs the stream ends with: the sample's, and minio on cat, so that reports composes."""
    sample = sample_mesh()
    out = {(state, key): v for state in COMPOSING for key, v in sample.get(state, {}).items()}
    out[(PLACEMENT, "cat")] = raw({"node": "cat", "modules": [{"module": "minio"}]})
    out[(MODULES, "minio")] = raw(EXTRA[MODULES]["minio"])
    return out


def bound_keys() -> list[tuple[str, str]]:
    """The provider entries the stream writes: keys the seat may make on any node, but the referenced ones."""
    out = []
    for node in NODES:
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


def random_changes(rng: random.Random, n: int) -> list[Change]:
    """n random changes of the other modules' states (and now and then the router deciding what it holds)."""
    bounds = bound_keys()
    sample_haves = list(sample_mesh()[HAVE])
    wanted = [key.removeprefix("want.") for key in sample_mesh()[WANTS]]
    changes: list[Change] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.18:
            node = rng.choice(NODES)
            modules = [m for m in MODULES_ALL if rng.random() < 0.45]
            changes.append((PLACEMENT, node, {"node": node, "modules": [{"module": m} for m in modules]}))
        elif roll < 0.32:
            node, module = rng.choice(NODES), rng.choice(MODULES_ALL)
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
            value = rng.choice([{"state": "provided"}, {"state": "provided"}, {"state": "failed", "why": "quota"},
                                {"state": "waits", "why": "a person accepts it"}, None])
            changes.append((state, key, value))
        elif roll < 0.90:
            node = rng.choice(NODES)
            value = {"providers": {"oidc-client": rng.choice(NODES), "object-storage": rng.choice(NODES)}}
            changes.append((RESOLVED, f"{node}.webapp", value if rng.random() < 0.7 else None))
        elif roll < 0.97:
            manifest = rng.choice(["m-keycloak", "m-keycloak-s3"])
            changes.append((MODULES, "keycloak", {"module": "keycloak", "fp": "kc1", "manifest": manifest}))
        else:
            changes.append((ROUTER, "", None))
    return changes


def final_changes(changes: list[Change]) -> list[Change]:
    """The changes that set every composing key the stream touched, and every key of the final mesh, to the final
    mesh."""
    final = final_mesh()
    touched = {(state, key) for state, key, _ in changes if state in COMPOSING}
    out: list[Change] = []
    for state, key in sorted(touched | set(final)):
        value = final.get((state, key))
        out.append((state, key, msgspec.json.decode(value) if value is not None else None))
    return out


def stream(seed: int, n: int) -> list[Change]:
    """A seeded stream of n random changes of the other modules' states, then the final mesh."""
    changes = random_changes(random.Random(seed), n)
    return changes + final_changes(changes)


def decide_all(bus: Bus) -> None:
    """The router decides each ask it holds and has not decided yet: yes for about half the keys, no for the rest."""
    for msg_id, ask in bus.asks_published():
        if bus.get(ASK_RECORDS, msg_id) is None:
            key = ask.about.removeprefix("provision.")
            bus.decide(key, msg_id, "yes" if zlib.crc32(key.encode()) % 2 else "no")


def write(bus: Bus, change: Change) -> None:
    """Make one change on a bus: a state's key written, or the router deciding."""
    state, key, value = change
    if state == ROUTER:
        decide_all(bus)
    else:
        bus.write(state, key, value)


def prepare(bus: Bus, *, replicas: int = 1) -> None:
    """The sample mesh and the stream's extra states on a bus, and the router's stream of asks and its records.

    Written through the bus's connection, so that a put a new cluster cannot take yet (its streams electing their
    leaders) is made again until it is.
    """
    states = sample_mesh()
    for state, values in extra_states().items():
        states.setdefault(state, {}).update(values)
    for state, values in states.items():
        bus.create_bucket(state, replicas=replicas)
        for key, value in values.items():
            bus.put(state, key, value)
    bus.create_asks_stream(replicas=replicas)
