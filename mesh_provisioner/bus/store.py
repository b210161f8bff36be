"""Compare-and-set writes of the seat's states: the one way a rule's puts and deletes reach the bus.

Every write is a compare-and-set on the revision the rule judged from (design.md, messages/writes.py): a put of
revision 0 creates the key, any other put updates it only if its revision is still that one, a delete deletes it
only if its revision is still that one. A conflict means someone wrote in between: the batch stops there and says
which write it was, so the caller re-reads and judges again. There is never a blind put.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KV_DEL, KV_OP, KeyValue

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import link, open_bucket
from mesh_provisioner.messages.writes import Delete, Put, Write
from mesh_provisioner.rules.keys import is_token
from mesh_provisioner.rules.view import bucket

log = logging.getLogger("mesh_provisioner.bus.store")

# JetStream's answers to a publish whose expected last subject sequence is not the key's revision.
_WRONG_LAST_SEQUENCE: Final = (10071, 10164)


@dataclass
class Applied:
    """What a batch of writes did: each write made with its new revision, and where it stopped and why."""

    done: list[tuple[Write, int]] = field(default_factory=list)
    conflict: Write | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """Whether every write of the batch was made."""
        return self.conflict is None and not self.error


class Conflict(Exception):
    """A compare-and-set that found another revision than the one the write was judged from."""


class Refused(Exception):
    """A write that is not made at all: a bad key, a blind delete, a bucket that does not exist."""


class Store:
    """Executes a rule's writes as compare-and-sets, one after another, and tells the cache each one made."""

    def __init__(self, nc: Client, cache: Cache | None = None, *, timeout: float = 5.0) -> None:
        """A store writing through `nc`, each write waiting `timeout` s for its acknowledgement at most.

        With a cache, each write made is put into it at once (read your writes).
        """
        self.writes = 0
        self.conflicts = 0
        # Only the seat's holder writes its states (contract section 8): the guard says why not, "" when it may.
        self.guard: Callable[[], str] | None = None
        self.errors = 0
        self._js = nc.jetstream(timeout=timeout)
        link(nc)  # its requests are counted from now on
        self._cache = cache
        self._buckets: dict[str, KeyValue] = {}

    async def apply(self, writes: Iterable[Write]) -> Applied:
        """Make each write in order as a compare-and-set; stop at the first that conflicts or fails.

        The writes are awaited one by one: each is made only once the one before it is acknowledged, so a batch
        that stops leaves exactly `done` written.
        """
        applied = Applied()
        for write in writes:
            barred = self.guard() if self.guard is not None else ""
            if barred:
                self.errors += 1
                applied.error = f"{_what(write)} is not made: {barred}"
                break
            try:
                revision = await self._make(write)
            except Conflict as err:
                self.conflicts += 1
                applied.conflict, applied.error = write, str(err)
                log.info("%s", err)
                break
            except (nats.errors.Error, TimeoutError) as err:
                self.errors += 1
                self._buckets.pop(write.state, None)  # open it again next time: it may have been deleted
                applied.error = f"{_what(write)} failed: {type(err).__name__}: {err}".rstrip(": ")
                log.warning("%s", applied.error)
                break
            except Refused as err:
                self.errors += 1
                applied.error = str(err)
                log.warning("%s", applied.error)
                break
            self.writes += 1
            applied.done.append((write, revision))
            if self._cache is not None:
                self._cache.note_written(
                    write.state, write.key, write.value if isinstance(write, Put) else None, revision
                )
        return applied

    def counts(self) -> dict[str, int]:
        """The writes made, the conflicts met and the writes that failed, so far."""
        return {"writes": self.writes, "conflicts": self.conflicts, "failed writes": self.errors}

    async def _make(self, write: Write) -> int:
        """Make one write; answers the key's new revision, raises Conflict when its revision moved on."""
        if not all(is_token(t) for t in write.key.split(".")):
            # Contract section 1: a key joins tokens with dots; any other key is bad input, never written.
            raise Refused(f"{_what(write)} is not made: the key is not tokens joined by dots")
        kv = await self._bucket(write.state)
        try:
            if isinstance(write, Put):
                if write.revision == 0:
                    return await kv.create(write.key, write.value)
                return await kv.update(write.key, write.value, last=write.revision)
            return await self._delete(write)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise Conflict(f"{_what(write)} conflicts: the key is no longer at that revision") from None
        except nats.js.errors.APIError as err:
            if err.err_code in _WRONG_LAST_SEQUENCE:
                raise Conflict(f"{_what(write)} conflicts: the key is no longer at that revision") from None
            raise

    async def _delete(self, write: Delete) -> int:
        """Delete a key if it is still at the write's revision; answers the delete marker's revision.

        As nats-py's `KeyValue.delete`, but keeping the revision JetStream gives the marker.
        """
        if write.revision <= 0:
            # messages/writes.py: a delete of revision 0 is never made (it would be a blind delete).
            raise Refused(f"{_what(write)} is not made: a delete needs the revision it was judged from")
        headers = {KV_OP: KV_DEL, api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(write.revision)}
        ack = await self._js.publish(f"$KV.{bucket(write.state)}.{write.key}", headers=headers)
        return ack.seq

    async def _bucket(self, state: str) -> KeyValue:
        """A state's bucket, opened once."""
        kv = self._buckets.get(state)
        if kv is None:
            try:
                kv, _ = await open_bucket(self._js, state)
            except nats.js.errors.BucketNotFoundError:
                raise Refused(f"bucket {bucket(state)} does not exist, so nothing of {state} is written") from None
            self._buckets[state] = kv
        return kv


def _what(write: Write) -> str:
    """A write in words, for logs and whys."""
    verb = "put" if isinstance(write, Put) else "delete"
    return f"the {verb} of {write.state} {write.key} at revision {write.revision}"
