"""The seat's settings: where the bus is, what it reads, how it runs. Every field has a default but the bus."""

from __future__ import annotations

from typing import Final

import msgspec

from mesh_provisioner.rules.view import DEFAULT_BOUND_READS

# The bus calls one piece of an actor's work makes one after another, at most: a batch of writes opens its bucket,
# gathers its acknowledgements, and makes a create again on a delete marker (the marker read, the write made).
CALLS_PER_WORK: Final = 4


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """How one seat connects and runs; `Config(nats="nats://127.0.0.1:4222")` is a whole configuration."""

    nats: str | tuple[str, ...] = "nats://127.0.0.1:4222"
    """One server URL, several separated by commas, or a tuple of them (a cluster)."""
    bound_reads: tuple[str, ...] = DEFAULT_BOUND_READS
    """The providers whose `<provider>.bound` entries the seat reads (contract section 2)."""
    max_parallel: int = 4
    """How many compositions run at once; 0 is no bound, 1 composes one node at a time.

    A few: while one composition waits for the bus another composes, and a heavy node takes one place of four. More
    only add threads contending for the one interpreter lock, and working sets alive at once (a thousand nodes
    composing together held 40% more memory at their peak, and a change waited seconds, not tenths, to be written:
    docs/BENCHMARKS.md)."""
    lease_seconds: float = 15.0
    """The seat's lease time: the max age of `mesh-provisioner_seat` (contract section 8)."""
    replicas: int = 1
    """How many servers of a JetStream cluster keep each bucket the seat creates (its own states, section 4)."""
    request_timeout: float = 10.0
    """How long one call to the bus may take before it counts as failed: a request, or the acknowledgements of a batch
    of writes (the store's own timeout)."""
    conflict_retries: int = 8
    """How often a judgement is made again after a compare-and-set conflict before it waits for the next change."""
    restart_intensity: int = 10
    """At most this many restarts of one child ..."""
    restart_period: float = 60.0
    """... within this many seconds; past it the supervisor stops its children and reports failure."""
    backoff_first: float = 0.05
    """The first restart's delay, doubling up to backoff_max."""
    backoff_max: float = 5.0
    user: str = ""
    password: str = ""
    token: str = ""
    creds: str = ""
    nkey: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    metrics_addr: str = ""
    """`host:port` to serve `/metrics`, `/healthz` and `/readyz` on; "" serves nothing."""
    router_key: str = ""
    """The router's ed25519 public key; when set, a warrant is taken only with a valid signature."""
    registry: str = ""
    """The operator's registry file (TOML or JSON), written into `mesh-provisioner.registry` when the seat is taken
    (contract 4.1); "" leaves that state as it is."""

    @property
    def work_timeout(self) -> float:
        """How long an actor waits for the bus layer to finish one piece of its work (a batch of writes, a key read
        again, an ask published): as long as the most calls such work makes one after another, each within
        `request_timeout`, so that a slow call fails in the bus layer, which says why and has the work made again,
        never in the actor's wait, which would crash the actor."""
        return self.request_timeout * CALLS_PER_WORK

    def servers(self) -> list[str]:
        """The server URLs to connect to."""
        urls = self.nats.split(",") if isinstance(self.nats, str) else list(self.nats)
        return [u.strip() for u in urls if u.strip()]
