"""The seat's lease (contract section 8): `mesh-provisioner.seat` key `holder`, held by one process at a time.

The bucket's max age is the lease time: a holder that stops renewing loses the key to age, and a standby that keeps
trying to create it takes it then. The holder renews by compare-and-set on the revision it wrote, well inside the
lease time; a renewal that fails means someone else holds it or the bus is out of reach, and either way the holder
stops writing at once: `guard` says so to every write from the moment the lease may have lapsed.

A renewal the bus does not answer is tried again while the lease holds (`renew_key`): on a cluster, a leader lost
with the renewal in flight answers nothing, and the next leader, elected within seconds, does. A holder that lapsed
with its key still on the bus takes it back by compare-and-set on its own key, at once: no one else can have taken a
key that never aged out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mesh_provisioner.bus.connection import open_bucket, stream_of
from mesh_provisioner.bus.unanswered import Unanswered
from mesh_provisioner.bus.watch import Watch, drop_watch, first_values
from mesh_provisioner.contract import HOLDER_KEY, LEASE_SECONDS, SEAT, SHARD_KEY_PREFIX, bucket
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Write

log = logging.getLogger("mesh_provisioner.bus.lease")

# A holder counts its lease as lapsed this share of the lease time before the bus would let it age out, so that
# no write of a holder that lost the lease can land after a standby took it over.
SAFETY: Final = 0.2
# How long one try of a lease's write waits for its answer, and the pause before the next: a leader's answer comes in
# milliseconds; a leader lost takes a second or more to replace, and the lease holds for several such tries.
ATTEMPT: Final = 1.0
PAUSE: Final = 0.1


async def renew_key(kv: KeyValue, key: str, value: bytes, last: int, holder: str, until: float) -> int:
    """Write a lease key of `holder`'s by compare-and-set on revision `last`, tried again until `until` (monotonic
    time) while the bus does not answer; answers the key's new revision.

    A try that finds the key at another revision reads it: still `holder`'s (an earlier try landed and its answer was
    lost), the write is made on that revision. Raises when the key is someone else's or gone, or no try landed in time.
    """
    while True:
        try:
            return await kv.update(key, value, last=last)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        except nats.js.errors.APIError as err:
            if err.err_code not in (10071, 10164):
                raise
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() + ATTEMPT + PAUSE > until:
                raise
            await asyncio.sleep(PAUSE)
            continue
        entry = await kv.get(key)
        lease = r.decode(r.Lease, entry.value or b"")
        if lease is None or lease.holder != holder:
            raise nats.js.errors.KeyWrongLastSequenceError(description=f"{key} is held by another process")
        last = entry.revision or 0


class SeatLease:
    """This process's claim to the seat: taken by create, kept by compare-and-set, given back on a clean exit."""

    shards = 1
    """The shard count this process runs with: 1, the whole seat (contract 8.1)."""

    def __init__(self, nc: Client, seconds: float = LEASE_SECONDS, *, holder: str = "") -> None:
        self.nc = nc
        self.seconds = seconds
        self.holder = holder or uuid.uuid4().hex
        self.revision = 0
        self._deadline = 0.0  # monotonic time until which this process may write
        self._since: datetime | None = None  # when this process took the seat: renewals keep it
        self._kv: KeyValue | None = None
        # Set when a renewal found the lease another process's, or gone: holding is over (a renewal that met no
        # answer leaves it unset, and the next one may find the key still this process's).
        self.taken_over = False
        self._said: set[str] = set()  # the processes of another shard count already said
        # What a process of another shard count holds of this mesh, in words ("" when nothing): this one waits for it.
        self.blocker = ""
        self._taken: set[int] = set()  # shards (the one shard 0 of the whole seat) taken again since last asked
        # The writes sent under this lease and not yet answered: the store counts them (store.py), a lease given back
        # waits for them before its key is deleted (unanswered.py).
        self.unanswered = Unanswered(self.shard_of)

    def record(self) -> r.Lease:
        """The lease record this process writes: `since` is when it took the seat, not when it last renewed."""
        since = self._since or datetime.now(UTC).replace(microsecond=0)
        return r.Lease(holder=self.holder, host=socket.gethostname(), pid=os.getpid(), since=since)

    @property
    def renew_every(self) -> float:
        """How often the lease is renewed: a quarter of the lease time, well inside it."""
        return self.seconds / 4

    @property
    def poll_every(self) -> float:
        """How often a process that holds no lease asks for it: a fifth of the lease time, so that a killed holder's
        lease is taken within the lease time and a fifth."""
        return self.seconds / 5

    @property
    def held(self) -> bool:
        """Whether this process holds the lease now, with the safety margin."""
        return time.monotonic() < self._deadline

    def left(self) -> float:
        """Seconds left until this process counts its lease as lapsed; 0 when it does not hold it."""
        return max(self._deadline - time.monotonic(), 0.0)

    def lapse(self) -> None:
        """Count the lease as lapsed now: a renewal that did not answer in time stops every write at once."""
        self._deadline = 0.0

    def guard(self, write: Write | None = None) -> str:
        """Why this process may not make a write of the seat's states ("" while it holds the lease)."""
        return "" if self.held else "this process does not hold the seat's lease"

    def owns(self, node: str) -> bool:
        """Whether this process composes a node: every node, one lease holding them all (contract 8)."""
        return True

    async def ready(self, shards: Collection[int]) -> None:
        """What is kept of the shards' nodes is read: a partitioned seat composes them from now on (8.1). The whole
        seat composes every node from its start."""

    def shard_of(self, write: Write) -> int | None:
        """The shard whose lease a write is made under: the whole seat is shard 0 of 1."""
        return 0

    async def take(self) -> bool:
        """Take the lease if no one holds it, or this process's own key is still on the bus; answers whether this
        process holds it now."""
        asked = time.monotonic()
        kv = await self._bucket()
        sharded = [(lease, key) for key, (lease, _) in (await read_leases(self.nc, self.seconds)).items()
                   if key.startswith(SHARD_KEY_PREFIX)]
        for lease, key in sharded:
            self._other(lease, f"holds {key} (--shards {lease.shards or 1})")
        self.blocker = described(sharded[0][0], "holds shards of the seat (--shards "
                            f"{sharded[0][0].shards or 1})") if sharded else ""
        if sharded:
            return False  # a partitioned seat holds shards of this mesh: two ways of splitting it would both write
        self._since = None  # taken again: since now
        taken = self.record()
        self.revision = await _create(kv, HOLDER_KEY, r.encode(taken))
        if not self.revision:
            try:
                entry = await kv.get(HOLDER_KEY)
            except nats.js.errors.KeyNotFoundError:
                return False  # given back or aged out since: free again, taken at the next try
            mine = r.decode(r.Lease, entry.value or b"")
            if mine is None or mine.holder != self.holder:
                return False
            # This process's own key, its lease lapsed here but not on the bus: taken back at once.
            self.revision = await renew_key(kv, HOLDER_KEY, r.encode(taken), entry.revision or 0, self.holder,
                                            asked + self.seconds * (1 - SAFETY))
        self._since, self.taken_over = taken.since, False
        self._deadline = asked + self.seconds * (1 - SAFETY)
        log.info("this process holds the seat (holder %s)", self.holder)
        return True

    def taken(self) -> set[int]:
        """The shards taken (again) since this was last asked: their nodes are to be composed from the bus, as writes
        of them may have been refused meanwhile (8.1; the whole seat is shard 0 of 1)."""
        taken, self._taken = self._taken, set()
        return taken

    def waiting_for(self) -> str:
        """Why this process does not hold the lease now, for the log and `/readyz`."""
        if self.blocker:
            return f"{self.blocker}: this process takes no lease until they are given back"
        return "another process holds the seat's lease: this one waits for it as a standby"

    def _other(self, lease: r.Lease, what: str) -> None:
        """Say once that a process of this mesh runs with another shard count than this one (8.1: they must agree)."""
        if lease.holder in self._said:
            return
        self._said.add(lease.holder)
        log.error("%s, this one with --shards %d: every process of a mesh must use the same count; this one takes "
                  "nothing it holds", described(lease, what), self.shards)

    async def current(self) -> r.Lease | None:
        """The lease on the bus now (whoever holds it), None when no one does or it cannot be read."""
        try:
            kv, _ = await open_bucket(self.nc.jetstream(), SEAT)
            entry = await kv.get(HOLDER_KEY)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            return None
        return r.decode(r.Lease, entry.value or b"") if entry.value else None

    async def ensure_age(self) -> str:
        """Make the lease bucket's max age this lease time (contract 8); answers what was changed ("" when nothing).

        A bucket made by a seat with another lease time ages the key out at that time: a longer lease on a shorter
        bucket loses the key between renewals, a shorter one on a longer bucket leaves a killed holder's key for
        long after. Every seat of a mesh must use one lease time; the bucket follows the last seat started.
        """
        js = self.nc.jetstream()
        info = await js.stream_info(stream_of(SEAT))
        age = info.config.max_age or 0.0
        if abs(age - self.seconds) < 0.001:
            return ""
        config = info.config
        config.max_age = self.seconds
        # JetStream keeps a stream's window of duplicates within its max age.
        if config.duplicate_window and config.duplicate_window > self.seconds:
            config.duplicate_window = self.seconds
        try:
            await js.update_stream(config)
        except nats.js.errors.APIError as err:
            same = f"run every seat with --lease-seconds {age:g}, or " if age else ""
            raise RuntimeError(
                f"the lease bucket {bucket(SEAT)} {_ages(age)}, not after the lease time {self.seconds:g} s, and "
                f"cannot be changed ({err.description or err}): {same}let a user allowed to update it start a seat"
            ) from None
        return (f"the lease bucket {bucket(SEAT)} {_ages(age)}, not after the lease time {self.seconds:g} s; it does "
                "now: every seat of this mesh must run with the same --lease-seconds")

    async def _bucket(self) -> KeyValue:
        """The lease's bucket, each request of it waiting `ATTEMPT` s for its answer; opened once, so that a renewal
        asks the bus nothing but the renewal."""
        if self._kv is None:
            self._kv, _ = await open_bucket(self.nc.jetstream(timeout=ATTEMPT), SEAT)
        return self._kv

    async def renew(self) -> bool:
        """Renew the lease by compare-and-set, tried again while it holds; answers False, and stops writing at
        once, when that fails. Holding is over only when the key is found another process's or gone
        (`taken_over`); a renewal that met no answer leaves the next one to find the key still this process's."""
        asked = time.monotonic()
        try:
            kv = await self._bucket()
            self.revision = await renew_key(kv, HOLDER_KEY, r.encode(self.record()), self.revision, self.holder,
                                            self._deadline)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError) as err:
            self._deadline, self.taken_over = 0.0, True
            log.warning("the seat's lease is no longer this process's (%s): this process stops writing",
                        err or type(err).__name__)
            return False
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as err:
            # No answer (a stream's leader lost, a server frozen): the key may still be this process's, and a later
            # renewal that finds it so goes on holding. Meanwhile no write goes out.
            if self.held:
                log.warning("the seat's lease is not renewed in time (%s): this process's writes wait until it is",
                            err or type(err).__name__)
            self._deadline = 0.0
            return False
        if not self.held:
            log.info("the seat's lease is renewed again: this process writes again, and composes every node anew")
            self._taken.add(0)
        self._deadline = asked + self.seconds * (1 - SAFETY)
        return True

    async def give_back(self) -> None:
        """Delete the lease this process holds, so a standby takes over at once (a clean exit): once the writes sent
        under it are answered, or else left to age out."""
        held, ages_out, self._deadline = self.revision, self._deadline + self.seconds * SAFETY, 0.0
        if not held:
            return
        if not await self.unanswered.cleared(None, ages_out - time.monotonic()):
            log.info("the seat's lease is not given back: writes sent under it are not answered; it ages out")
            self.revision = 0
            return
        try:
            kv, _ = await open_bucket(self.nc.jetstream(), SEAT)
            await kv.delete(HOLDER_KEY, last=held)
            log.info("gave the seat's lease back")
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as err:
            log.info("the seat's lease is not given back (%s); it ages out", err or type(err).__name__)
        self.revision = 0


def described(lease: r.Lease, what: str) -> str:
    """A process, by its lease, and what it does, in words."""
    return f"process {lease.pid} on {lease.host or '?'} {what}"


async def read_leases(nc: Client, seconds: float) -> dict[str, tuple[r.Lease, int]]:
    """Every lease in the seat's bucket now (the holder's, the shards', the members'), by key, with its revision;
    a value that is not a lease is said and left out. Each value waits `seconds` at most."""
    js = nc.jetstream(timeout=ATTEMPT)
    _, info = await open_bucket(js, SEAT)
    watcher = await Watch.start(js, SEAT)
    try:
        values, _ = await first_values(watcher, info.state.last_seq or 0, info.state.messages or 0, seconds)
    finally:
        await drop_watch(nc, js, watcher)
    leases: dict[str, tuple[r.Lease, int]] = {}
    for key, update in values.items():
        value, revision = update.value, update.revision
        if value is None:
            continue
        lease = r.decode(r.Lease, value)
        if lease is None:
            log.warning("the seat's %s is not a lease: it is ignored", key)
            continue
        leases[key] = (lease, revision)
    return leases


async def _create(kv: KeyValue, key: str, value: bytes) -> int:
    """Create a lease key; answers its revision, 0 when the key is there already."""
    try:
        return await kv.create(key, value)
    except nats.js.errors.KeyWrongLastSequenceError:
        return 0
    except nats.js.errors.APIError as err:
        if err.err_code in (10071, 10164):
            return 0
        raise


def _ages(age: float) -> str:
    """How a bucket of this max age ages its keys out, in words."""
    return f"ages keys out after {age:g} s" if age else "never ages keys out"
