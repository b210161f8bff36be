"""Compare-and-set writes of the seat's states: the one way a rule's puts and deletes reach the bus.

Every write is a compare-and-set on the revision the rule judged from (design.md, messages/writes.py): a put of
revision 0 creates the key, any other put updates it only if its revision is still that one, a delete deletes it
only if its revision is still that one. A conflict means someone wrote in between: the batch says the first write
(in its order) that conflicted, so the caller re-reads and judges again. There is never a blind put.

A batch's writes are published at once, each with its own expected revision, and their acknowledgements gathered
(one round trip for the batch, not one a write): JetStream checks each one against its key alone, so a write after
a conflicting one may land too. Whatever landed is said in `done`, in batch order, and put into the cache (read your
writes); nothing is said to have landed that did not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.kv import KV_DEL, KV_OP, KeyValue

from mesh_provisioner.bus.acknowledgements import acks_of
from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import open_bucket, subject_of
from mesh_provisioner.bus.unanswered import Unanswered
from mesh_provisioner.bus.watch import ATTEMPT
from mesh_provisioner.contract import bucket
from mesh_provisioner.messages.writes import Delete, Put, Write
from mesh_provisioner.rules.keys import is_token

log = logging.getLogger("mesh_provisioner.bus.store")

# JetStream's answers to a publish whose expected last subject sequence is not the key's revision.
_WRONG_LAST_SEQUENCE: Final = (10071, 10164)
# The pause between two tries of opening a bucket (`Store._bucket`).
AGAIN: Final = 0.1


@dataclass
class Applied:
    """What a batch of writes did: each write made with its new revision (in batch order), the first write that
    conflicted, and why the batch is not all made ("" when it is)."""

    done: list[tuple[Write, int]] = field(default_factory=list)
    conflict: Write | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """Whether every write of the batch was made."""
        return self.conflict is None and not self.error


class Conflict(Exception):
    """A compare-and-set that found another revision than the one the write was judged from."""


class WriteRefused(Exception):
    """A write that is not made at all: a bad key, a blind delete, a bucket that does not exist."""


class _Error(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    """JetStream's answer to a publish: the message's sequence (the key's new revision), or an error."""

    seq: int = 0
    error: _Error | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


class Store:
    """Executes a rule's writes as compare-and-sets, a batch at once, and tells the cache each one made."""

    def __init__(self, nc: Client, cache: Cache | None = None, *, timeout: float = 5.0) -> None:
        """A store writing through `nc`, each batch waiting `timeout` s for its acknowledgements at most.

        With a cache, each write made is put into it at once (read your writes).
        """
        self.writes = 0
        self.conflicts = 0
        # Only the seat's holder writes its states (contract section 8): the guard says why not, "" when it may.
        self.guard: Callable[[Write], str] | None = None
        # The lease's count of writes in flight, which it waits on before giving a shard back (unanswered.py).
        self.unanswered: Unanswered | None = None
        self.errors = 0
        self.resent = 0  # writes sent again for want of an answer (acknowledgements.py)
        self._timeout = timeout
        self._js = nc.jetstream(timeout=timeout)
        self._tries = nc.jetstream(timeout=min(timeout, ATTEMPT))  # a request made again when it is not answered
        self._acks = acks_of(nc)
        self._cache = cache
        self._buckets: dict[str, KeyValue] = {}

    async def apply(self, writes: Iterable[Write]) -> Applied:
        """Make the writes as compare-and-sets, published at once; say which landed and the first that did not.

        The writes are checked in order first: a write that may not be made (the guard says no, a key not made of
        tokens, a blind delete, a bucket that does not exist) ends the batch there, and only the writes before it are
        published. Those are published together, each with its own expected revision, and every acknowledgement is
        gathered: `done` holds each write that landed, in batch order, `conflict` the first that found its key at
        another revision, and `error` why the first write that did not land did not.
        """
        applied = Applied()
        batch: list[Write] = []
        messages: list[tuple[str, bytes, dict[str, str]]] = []
        stop = ""
        for write in writes:
            barred = self.guard(write) if self.guard is not None else ""
            if barred:
                stop = f"{_what(write)} is not made: {barred}"
                break
            try:
                messages.append(await self._message(write))
            except WriteRefused as err:
                stop = str(err)
                break
            except (nats.errors.Error, TimeoutError) as err:
                stop = f"{_what(write)} failed: {type(err).__name__}: {err}".rstrip(": ")
                break
            batch.append(write)
        guard = self.guard
        # Counted in flight before the guard is asked the last time, until answered: a lease given back waits for
        # the writes made under it to be stored before its key is deleted (unanswered.py, contract 8.1).
        counted = self.unanswered.sent(batch) if self.unanswered is not None else []
        values: list[tuple[str, str, bytes | None]] = []
        try:
            barred = next((why for w in batch if (why := guard(w))), "") if guard is not None else ""
            if barred:
                # Making the messages may have waited on the bus (a bucket opened on a slow or frozen server), long
                # enough for the lease to lapse: asked again as they go out, none goes out without it (contract 8).
                stop, batch, messages = f"{_what(batch[0])} is not made: {barred}", [], []
            # Each write's value, as the cache tells the seat's own echo from another writer's change by it.
            values = [(w.state, w.key, w.value if isinstance(w, Put) else None) for w in batch]
            if self._cache is not None:
                self._cache.begin_writes(values)
            # A write is sent again only while its lease holds (contract 8), checked as it goes out again.
            answers, resent = (await self._acks.publish(messages, self._timeout,
                                                        resend=lambda i: not guard or not guard(batch[i]))
                               if messages else ([], set()))
            self.resent += len(resent)
            for i, (write, (_, _, value), answer) in enumerate(zip(batch, values, answers, strict=True)):
                try:
                    revision = await self._landed(write, answer)
                except Conflict as err:
                    # Sent twice, the first may have landed with its answer lost with the leader: the second then
                    # finds the key at the revision the first wrote, with this write's value.
                    revision = await self._landed_before(write) if i in resent else 0
                    if not revision:
                        self.conflicts += 1
                        if applied.conflict is None:
                            applied.conflict = write
                        applied.error = applied.error or str(err)
                        log.info("%s", err)
                        continue
                except (nats.errors.Error, TimeoutError, OSError, WriteRefused) as err:
                    self.errors += 1
                    self._buckets.pop(write.state, None)  # open it again next time: it may have been deleted
                    why = f"{_what(write)} failed: {type(err).__name__}: {err}".rstrip(": ")
                    applied.error = applied.error or why
                    log.warning("%s", why)
                    continue
                self.writes += 1
                applied.done.append((write, revision))
                if self._cache is not None:
                    self._cache.note_written(write.state, write.key, value, revision)
        finally:
            if self._cache is not None:
                self._cache.end_writes(values)
            if self.unanswered is not None:
                self.unanswered.answered(counted)
        if stop:
            self.errors += 1
            applied.error = applied.error or stop
            log.warning("%s", stop)
        return applied

    def counts(self) -> dict[str, int]:
        """The writes made, the conflicts met, the writes that failed and those sent again, so far."""
        return {"writes": self.writes, "conflicts": self.conflicts, "failed writes": self.errors,
                "writes sent again": self.resent}

    async def _message(self, write: Write) -> tuple[str, bytes, dict[str, str]]:
        """The message that makes one write: its subject, payload and headers (the expected revision)."""
        if not all(is_token(t) for t in write.key.split(".")):
            # Contract section 1: a key joins tokens with dots; any other key is bad input, never written.
            raise WriteRefused(f"{_what(write)} is not made: the key is not tokens joined by dots")
        if isinstance(write, Delete) and write.revision <= 0:
            # messages/writes.py: a delete of revision 0 is never made (it would be a blind delete).
            raise WriteRefused(f"{_what(write)} is not made: a delete needs the revision it was judged from")
        await self._bucket(write.state)
        subject = subject_of(write.state, write.key)
        expected = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(write.revision)}
        if isinstance(write, Put):
            return subject, write.value, expected
        return subject, b"", {KV_OP: KV_DEL, **expected}

    async def _landed(self, write: Write, answer: Msg | BaseException) -> int:
        """The key's new revision from a write's acknowledgement; Conflict when its revision moved on.

        A create (revision 0) of a key whose last word is a delete marker is made again on the marker's revision,
        as nats-py's `KeyValue.create` does: a deleted key is no key.
        """
        if isinstance(answer, BaseException):
            raise answer
        if answer.headers and answer.headers.get(api.Header.STATUS) == "503":
            raise nats.js.errors.NoStreamResponseError
        try:
            ack = _decode_ack(answer.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise nats.errors.Error(f"an acknowledgement that does not decode: {err}") from None
        if ack.error is None:
            return ack.seq
        if ack.error.err_code not in _WRONG_LAST_SEQUENCE:
            raise nats.js.errors.APIError(
                code=ack.error.code, err_code=ack.error.err_code, description=ack.error.description
            )
        if isinstance(write, Put) and write.revision == 0:
            marker = await self._deleted_at(write)
            # Made again only with the lease: the answer and the marker were waited for (contract 8).
            barred = self.guard(write) if self.guard is not None else ""
            if marker and barred:
                raise WriteRefused(f"{_what(write)} is not made again on its delete marker: {barred}")
            if marker:
                return await self._make(Put(write.state, write.key, write.value, marker))
        raise Conflict(f"{_what(write)} conflicts: the key is no longer at that revision")

    async def _deleted_at(self, write: Write) -> int:
        """The revision of a key's delete marker, 0 when its last word is a value (or there is none)."""
        kv = await self._bucket(write.state)
        try:
            await kv.get(write.key)
        except nats.js.errors.KeyNotFoundError as err:
            # nats-py says a deleted key is not found, with the delete marker as the error's entry.
            entry = getattr(err, "entry", None)
            return entry.revision or 0 if isinstance(entry, KeyValue.Entry) else 0
        return 0

    async def _landed_before(self, write: Write) -> int:
        """The key's revision when it holds what `write` makes (its value, or no value for a delete) at a revision
        past the one the write was judged from; 0 when it does not."""
        kv = await self._bucket(write.state)
        try:
            entry = await kv.get(write.key)
        except nats.js.errors.KeyNotFoundError as err:
            marker = getattr(err, "entry", None)  # a delete marker, as `_deleted_at` reads it
            if isinstance(write, Delete) and isinstance(marker, KeyValue.Entry):
                return marker.revision or 0 if (marker.revision or 0) > write.revision else 0
            return 0
        except (nats.errors.Error, TimeoutError):
            return 0  # unknown: said to conflict, and judged again
        landed = isinstance(write, Put) and entry.value == write.value and (entry.revision or 0) > write.revision
        return entry.revision or 0 if landed else 0

    async def _make(self, write: Write) -> int:
        """Make one write alone; answers the key's new revision, raises Conflict when its revision moved on."""
        subject, payload, headers = await self._message(write)
        try:
            ack = await self._js.publish(subject, payload, headers=headers)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise Conflict(f"{_what(write)} conflicts: the key is no longer at that revision") from None
        except nats.js.errors.APIError as err:
            if err.err_code in _WRONG_LAST_SEQUENCE:
                raise Conflict(f"{_what(write)} conflicts: the key is no longer at that revision") from None
            raise
        return ack.seq

    async def _bucket(self, state: str) -> KeyValue:
        """A state's bucket, opened once (again after a write of it failed: it may have been deleted).

        Asked for in tries of `ATTEMPT` s within the store's timeout: on a cluster, a request about a stream whose
        leader was lost is never answered, while one made again once another is elected is. A write failed for want
        of a leader, and its bucket opened again with one try of the whole timeout, waited that long past the election.
        """
        kv = self._buckets.get(state)
        if kv is None:
            deadline = time.monotonic() + self._timeout
            while True:
                try:
                    kv, _ = await open_bucket(self._js, state, ask=self._tries)
                    break
                except nats.js.errors.BucketNotFoundError:
                    why = f"bucket {bucket(state)} does not exist, so nothing of {state} is written"
                    raise WriteRefused(why) from None
                except nats.errors.TimeoutError:
                    if time.monotonic() + AGAIN + ATTEMPT > deadline:
                        raise
                    await asyncio.sleep(AGAIN)  # one failing at once (the connection lost) is not made again at once
            self._buckets[state] = kv
        return kv


def _what(write: Write) -> str:
    """A write in words, for logs and whys."""
    verb = "put" if isinstance(write, Put) else "delete"
    return f"the {verb} of {write.state} {write.key} at revision {write.revision}"
