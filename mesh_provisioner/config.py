"""The seat's settings: where the bus is, what it reads, how it runs. Every field has a default but the bus."""

from __future__ import annotations

import math
from typing import Final
from urllib.parse import urlsplit

import msgspec

from mesh_provisioner.contract import DEFAULT_BOUND_READS, LEASE_SECONDS, MAX_SHARDS, MIN_LEASE_SECONDS, SHARDS
from mesh_provisioner.rules.keys import is_token
from mesh_provisioner.rules.signature import BadRouterKey, parse_key

# The bus calls one piece of an actor's work makes one after another, at most: a batch of writes opens its bucket,
# gathers its acknowledgements, and makes a create again on a delete marker (the marker read, the write made).
CALLS_PER_WORK: Final = 4
# How many request timeouts a load of the cache may go without headway (no value received, none taken into memory)
# before it is given up: a server gone quiet. A load that makes headway is waited for however long it takes.
LOAD_STALL_REQUESTS: Final = 6
# JetStream keeps a bucket on at most five servers.
MAX_REPLICAS: Final = 5
# The URL schemes a NATS client speaks; a URL with none is nats://.
NATS_SCHEMES: Final = ("nats", "tls", "ws", "wss")


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
    lease_seconds: float = LEASE_SECONDS
    """The seat's lease time: the max age of `mesh-provisioner_seat` (contract section 8)."""
    shards: int = SHARDS
    """The mesh's shard count (contract 8.1): 1 is the single lease `holder`, one process composing every node; more
    lets several processes share the mesh, each holding its fair share of the shards' leases. Every process of a mesh
    uses the same count."""
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

    @property
    def load_stall(self) -> float:
        """How long the cache's load (the first, or a shard's keys read again) may go without headway before the seat
        gives it up: a large mesh's load takes minutes, and is waited for while values come (`Cache.wait_loaded`)."""
        return self.request_timeout * LOAD_STALL_REQUESTS

    def problems(self) -> list[tuple[str, str]]:
        """What is wrong with this configuration, as (field, why), found before anything connects; [] when nothing.

        A seat started on a wrong setting fails in ways far from its cause (a lease of 0 s that never ages out, a
        negative bound taken as none), so each is refused up front with what it must be.
        """
        out: list[tuple[str, str]] = []
        servers = self.servers()
        if not servers:
            out.append(("nats", "names no server: give a URL such as nats://127.0.0.1:4222"))
        for url in servers:
            why = url_problem(url)
            if why:
                out.append(("nats", why if len(servers) == 1 else f"{url}: {why}"))
        bad = [p for p in self.bound_reads if not is_token(p)]
        if bad:
            out.append(("bound_reads", f"{', '.join(map(repr, bad))}: a provider is one token ([A-Za-z0-9_-]+)"))
        if self.max_parallel < 0:
            out.append(("max_parallel", "must be 0 (no bound) or more"))
        if not math.isfinite(self.lease_seconds) or self.lease_seconds < MIN_LEASE_SECONDS:
            out.append(("lease_seconds", f"the lease time must be at least {MIN_LEASE_SECONDS:g} seconds"))
        if not 1 <= self.shards <= MAX_SHARDS:
            out.append(("shards", f"a mesh has 1 to {MAX_SHARDS} shards"))
        if not 1 <= self.replicas <= MAX_REPLICAS:
            out.append(("replicas", f"JetStream keeps a bucket on 1 to {MAX_REPLICAS} servers"))
        if self.metrics_addr:
            out += [("metrics_addr", why) for why in [addr_problem(self.metrics_addr)] if why]
        if self.router_key:
            try:
                parse_key(self.router_key)
            except BadRouterKey as err:
                out.append(("router_key", str(err)))
        if self.password and not self.user:
            out.append(("password", "a password needs a user"))
        if self.tls_key and not self.tls_cert:
            out.append(("tls_key", "a client key needs its certificate (--tls-cert)"))
        return out

    def servers(self) -> list[str]:
        """The server URLs to connect to."""
        urls = self.nats.split(",") if isinstance(self.nats, str) else list(self.nats)
        return [u.strip() for u in urls if u.strip()]


def url_problem(url: str) -> str:
    """Why a server URL is not one a NATS client can connect to ("" when it is)."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme not in NATS_SCHEMES:
        return (f"not a NATS URL: {parts.scheme}:// is the wrong scheme, the seat speaks NATS "
                f"({', '.join(s + '://' for s in NATS_SCHEMES)}), as in nats://127.0.0.1:4222")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError as err:
        return str(err)
    if not parts.hostname:
        return "names no host"
    return ""


def addr_problem(addr: str) -> str:
    """Why a `host:port` to listen on is not one ("" when it is); the host may be empty (127.0.0.1)."""
    _, colon, port = addr.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        return "not host:port (such as 127.0.0.1:9464, or 0.0.0.0:9464 for every interface)"
    return ""
