"""The names of the bus contract (docs/contract.md), each defined here once: the modules, the states and their
buckets, the subjects and the router's stream, the lease's key and times, and the seat's verb.

Other modules of the mesh, operators' tools and tests find the seat by these names. The module is pure: it imports
nothing of the package, so every layer (rules, bus, actors, the process) takes its names from here. What a record
says (a provision's states, an ask's options) stays with the record, or with the rule that writes it.
"""

from __future__ import annotations

from typing import Final

# The module whose states these are: `MODULE` (contract section 1).
MODULE: Final = "mesh-provisioner"
# The module that provides every credential (contract section 4).
VAULT_MODULE: Final = "mesh-vault"

# ---- the states, by their names on the bus ------------------------------------------------------------------

# What the seat reads, other modules' states (contract section 2).
PLACEMENT: Final = "mesh-controller.placement"
WANTS: Final = "mesh-assigner.wants"
MODULES: Final = "mesh-indexer.modules"
MANIFESTS: Final = "mesh-indexer.manifests"
BUILDS: Final = "mesh-builder.builds"
HAVE: Final = "node-engine.have"
RESOLVED: Final = "mesh-config.resolved"
ASK_RECORDS: Final = "asks.records"  # the router's records of asks (contract sections 2 and 5.4)

# What the seat writes, its states alone (contract section 4).
PLANS: Final = "mesh-provisioner.plans"
PROVISIONS: Final = "mesh-provisioner.provisions"
REFUSED: Final = "mesh-provisioner.refused"
NEEDS: Final = "mesh-provisioner.needs"  # retired: emptied when the seat is taken
REGISTRY: Final = "mesh-provisioner.registry"  # contract 4.1
SEAT: Final = "mesh-provisioner.seat"  # the lease (contract section 8)

# What each machine's provisioner client writes; the seat reads them only for its verb (contract section 9).
APPLIED: Final = "mesh-provisioner.applied"
COLLECT: Final = "mesh-provisioner.collect"

# The states of section 2 the rules read, but the providers' `<provider>.bound` and the router's records.
READS: Final = (PLACEMENT, WANTS, MODULES, MANIFESTS, BUILDS, HAVE, RESOLVED)
# The states the seat's rules compose (contract section 4): plans, provisions and refusals.
OWN: Final = (PLANS, PROVISIONS, REFUSED)
# Every state of contract section 4: the seat creates their buckets when they are missing.
SEAT_STATES: Final = (PLANS, PROVISIONS, REFUSED, NEEDS, REGISTRY, SEAT)

# BoundReads when none is configured: the providers whose `<provider>.bound` the seat reads (contract section 2).
DEFAULT_BOUND_READS: Final = ("gitea", "keycloak", "postgres", "route-adapter", "route-proxy", "node-tools",
                              "mesh-vault")


def bound(provider: str) -> str:
    """The state a provider keeps its outcomes in: `<provider>.bound` (contract section 2)."""
    return provider + ".bound"


def bucket(state: str) -> str:
    """The key-value bucket of a state: `M.S` is `M_S` (contract section 1)."""
    module, _, name = state.rpartition(".")
    return f"{module}_{name}"


# ---- the operator's channel (contract 5.4) ------------------------------------------------------------------

# The subject asks are published on through JetStream, and the one the router says it decided one on.
ASK_SUBJECT: Final = f"asks.ask.{MODULE}"
DECIDED_SUBJECT: Final = f"asks.decided.{MODULE}"
# The stream a router of asks keeps, and the subjects it takes: what `load --router` and the demo make in its stead.
ROUTER_STREAM: Final = "asks"
ROUTER_SUBJECTS: Final = ("asks.ask.>",)
# The verb of the act a retiring ask's option binds.
RETIRE_VERB: Final = f"{MODULE}.retire"

# ---- the lease (contract section 8) -------------------------------------------------------------------------

# The key of `mesh-provisioner.seat` that holds the lease.
HOLDER_KEY: Final = "holder"
# A partitioned seat (contract 8.1): the key of shard i's lease is `shard.<i>`, and a process announces itself live
# under `member.<its holder id>`, renewed as its leases are; both age out with the bucket as `holder` does.
SHARD_KEY_PREFIX: Final = "shard."
MEMBER_KEY_PREFIX: Final = "member."
# The shard count when none is configured: one shard, the single lease `holder` (contract 8).
SHARDS: Final = 1
# The most shards a mesh may have: a process renews each of its leases a quarter of the lease time apart.
MAX_SHARDS: Final = 1024
# The lease time, the max age of the lease bucket, when none is configured.
LEASE_SECONDS: Final = 15.0
# The shortest lease time a seat takes: the holder renews every quarter of it and stops writing a fifth of it early,
# so below this a renewal's round trip on a busy bus would lose the lease it renews.
MIN_LEASE_SECONDS: Final = 2.0

# ---- the seat's verb (contract section 9) -------------------------------------------------------------------

# The NATS service that answers it, its one endpoint, and the endpoint's subject.
VERB_SERVICE: Final = MODULE
VERB_ENDPOINT: Final = "provisioning"
VERB_SUBJECT: Final = f"{MODULE}.{VERB_ENDPOINT}"
