"""Reading a bucket through a key-value watch: its current values first, then its changes (bus/cache.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.client import DEFAULT_JS_SUB_PENDING_BYTES_LIMIT, DEFAULT_JS_SUB_PENDING_MSGS_LIMIT, Callback
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE

from mesh_provisioner.bus.connection import stream_of, subject_of
from mesh_provisioner.bus.natsfix import consumer_of, unsubscribe_js

log = logging.getLogger("mesh_provisioner.bus.cache")

# How long the cache works on the loop in one stretch before it gives the loop back (a host's tasks run on it too):
# a host's loop waits for the interpreter lock behind the seat's threads too, so a stretch is kept well below the
# interpreter's switch interval (5 ms), within which it is seldom made to wait for the lock mid-way.
STRETCH: Final = 0.002
# Values taken between two looks at the clock.
CHUNK: Final = 16


class Stretch:
    """Tells work on the loop when it has run its stretch and should give the loop back (`await asyncio.sleep(0)`)."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since = time.perf_counter()

    def over(self) -> bool:
        """Whether the stretch is over; if so, the next one begins now."""
        now = time.perf_counter()
        if now - self._since < STRETCH:
            return False
        self._since = now
        return True
# A consumer of a watch nobody listens to any more is reaped by the server after this long, should deleting
# it have failed (the connection was down when the watch was dropped).
INACTIVE_THRESHOLD: Final = 30.0
# How long one request of the cache (a bucket opened, a watch's consumer made, a stream asked for its last revision)
# waits for its answer before it is made again on the watch's backoff, and one of the store's opening a bucket before
# it is made again. On a cluster, a request about a stream whose leader was lost is not answered until another is
# elected (5 to 10 s here): waiting the whole request timeout for the first try kept a resync blind for seconds after
# the new leaders were in place.
ATTEMPT: Final = 2.0
# The longest pause between two tries of a watch that cannot be made (a bucket not opened, a consumer not made): a
# watch is made again within a try and a second of its stream's leader being elected.
RETRY_MAX: Final = 1.0
# How often a watch's consumer says it is alive when it has nothing to deliver. A watch's consumer lives on one server
# of a cluster, not always the one the seat is connected to; lost with its server, it is made again when two
# heartbeats are missed (nats-py's check). At nats-py's default of 5 s a watch was blind for 10 to 15 s; at this one it
# is made again within a second, for four small messages a second a watch.
WATCH_HEARTBEAT: Final = 0.25


class WatchingJetStream(JetStreamContext):
    """A JetStream context whose ordered consumers (the key-value watches) beat every `WATCH_HEARTBEAT` s.

    A watch (`Watch.start`) makes its consumer with this context's `subscribe`, which gives an ordered consumer this
    heartbeat when none is asked for.
    """

    async def subscribe(
        self,
        subject: str,
        queue: str | None = None,
        cb: Callback | None = None,
        durable: str | None = None,
        stream: str | None = None,
        config: api.ConsumerConfig | None = None,
        manual_ack: bool = False,
        ordered_consumer: bool = False,
        idle_heartbeat: float | None = None,
        flow_control: bool = False,
        pending_msgs_limit: int = DEFAULT_JS_SUB_PENDING_MSGS_LIMIT,
        pending_bytes_limit: int = DEFAULT_JS_SUB_PENDING_BYTES_LIMIT,
        deliver_policy: api.DeliverPolicy | None = None,
        headers_only: bool | None = None,
        inactive_threshold: float | None = None,
    ) -> JetStreamContext.PushSubscription:
        """nats-py's subscribe, with `WATCH_HEARTBEAT` for an ordered consumer's heartbeat by default."""
        if ordered_consumer and idle_heartbeat is None:
            idle_heartbeat = WATCH_HEARTBEAT
        return await super().subscribe(
            subject, queue, cb, durable, stream, config, manual_ack, ordered_consumer, idle_heartbeat, flow_control,
            pending_msgs_limit, pending_bytes_limit, deliver_policy, headers_only, inactive_threshold,
        )


# The operations a key-value message's header names that leave its key with no value (section 2's "no key"); and
# those of the markers nats-server 2.11 and later puts for a key aged out or removed (`Nats-Marker-Reason`).
_NO_VALUE: Final = (KV_DEL, KV_PURGE)
_MARKERS: Final = {"MaxAge": KV_PURGE, "Purge": KV_PURGE, "Remove": KV_DEL}
# A JetStream message's reply subject: `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.
# <pending>` (9 tokens), or with a domain and an account hash after `ACK` (11 or 12): where the stream's sequence
# (the key's revision) and the count still pending are.
_V1_TOKENS: Final = 9
_V1_AT: Final = (5, 8)
_V2_AT: Final = (7, 10)
# Updates a watch holds before its consumer is made to wait (as nats-py's watch does).
_QUEUED: Final = 256


class Update(msgspec.Struct, frozen=True, gc=False):
    """One value a watch delivered."""

    key: str
    value: bytes | None
    """None: deleted or purged (section 2's "no key")."""
    revision: int
    pending: int
    """How many more values its consumer had to deliver then: 0 when it was up to date."""


class Watch:
    """A watch of a state's whole bucket: the newest value of each key, then every change, each an `Update`, in the
    stream's order; iterated until stopped.

    nats-py's `KeyValue.watch` does the same through nats-py's ordered consumer, as this does, but makes each message a
    `KeyValue.Entry` with all of its metadata parsed (a timestamp as a datetime, pairs of sequences): on the benchmarks'
    1,000-node mesh a message cost 10.6 µs of the loop to the cache that way, against 5.0 for the ordered consumer
    alone. This reads of a message only what the cache uses: its key, its value or operation, its revision and the
    count still pending, from the reply subject and one header.
    """

    def __init__(self, state: str) -> None:
        self.state = state
        self._prefix = len(subject_of(state, ""))
        self._updates: asyncio.Queue[Update | None] = asyncio.Queue(_QUEUED)  # None: stopped
        self._sub: JetStreamContext.PushSubscription | None = None
        self._stopped = False
        self.received = 0
        """How many messages of the bucket it has received so far (the cache's load's headway)."""

    @classmethod
    async def start(cls, js: JetStreamContext, state: str, *, headers_only: bool = False,
                    inactive_threshold: float = INACTIVE_THRESHOLD) -> Watch:
        """Watch a state's bucket through `js` (its ordered consumers beat as `js` says: `WatchingJetStream`);
        `headers_only`: the values are left out (each update's value is b"", or None for no key)."""
        watch = cls(state)
        watch._sub = await js.subscribe(
            subject_of(state, ">"), stream=stream_of(state), cb=watch._received, ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, headers_only=headers_only or None,
            inactive_threshold=inactive_threshold,
        )
        return watch

    @property
    def consumer(self) -> str | None:
        """The name of the watch's consumer now (made again by nats-py on a gap), None before it has one."""
        return None if self._sub is None else consumer_of(self._sub)

    async def _received(self, msg: Msg) -> None:
        """Queue one message of the bucket as an update (nats-py calls this for each, in order); a message that is no
        key-value message, or a marker of a reason not known, is left out; so is any once the watch is stopped."""
        if self._stopped:
            return
        self.received += 1
        value: bytes | None = msg.data
        headers = msg.headers
        if headers:
            operation = headers.get(KV_OP)
            if operation is None and (reason := headers.get(KV_MARKER_REASON)) is not None:
                operation = _MARKERS.get(reason)
                if operation is None:
                    log.debug("a marker of %s for %s is left out: its reason %r is not known", self.state,
                              msg.subject, reason)
                    return
            if operation in _NO_VALUE:
                value = None
        tokens = (msg.reply or "").split(".")
        at = _V1_AT if len(tokens) == _V1_TOKENS else _V2_AT
        try:
            revision, pending = int(tokens[at[0]]), int(tokens[at[1]])
        except (IndexError, ValueError):
            log.warning("a message of %s for %s has no JetStream reply (%r): it is left out", self.state,
                        msg.subject, msg.reply)
            return
        await self._updates.put(Update(msg.subject[self._prefix:], value, revision, pending))

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Update:
        if self._stopped and self._updates.empty():
            raise StopAsyncIteration
        update = await self._updates.get()
        if update is None:
            raise StopAsyncIteration
        return update

    async def stop(self) -> None:
        """Stop the watch: its consumer is unsubscribed (deleted by `drop_watch`, or reaped by the server once
        inactive), nothing more is queued, and iterating it ends once what was queued is read. Raises nats-py's errors
        as its `unsubscribe` does."""
        self._stopped = True
        try:
            if self._sub is not None:
                await unsubscribe_js(self._sub)
        finally:
            # A reader waiting for an update is woken; one reading later takes what was queued, then ends.
            if self._updates.empty():
                self._updates.put_nowait(None)


async def first_values(
    watcher: Watch, last: int, messages: int, load_timeout: float, keep: Callable[[str, bytes], bool] | None = None,
) -> tuple[dict[str, Update], int]:
    """The watched bucket's current values, by key, as a new watch delivers them first, and the newest revision
    delivered (`last` at least). `keep` says which values to hold on to (a delete is always held): the others are
    dropped as they come, never all held at once.

    `last` is the stream's last revision and `messages` its count of messages from just before the watch
    started: everything up to `last` is in the values the watch delivers first, in order, and the last of them
    is of revision `last` or later (the key written last holds it, or a newer value). The load ends there.
    A consumer on a cluster's server that is catching up says nothing is pending before it has them: that does not
    end the load. Values ignored as loaded would be lost for
    good: the cache's floor drops them. Should nothing come for `load_timeout` s after a value with nothing
    pending (the stream's last message removed by hand), what came is taken as the bucket. (A value is waited for
    seven eighths of `load_timeout` at least, all of it at most: the deadline is moved on that often, not at each.)

    A bucket that held nothing (`messages` 0) has nothing to load: what is written to it once the watch started
    comes as its changes.
    """
    if not messages:
        return {}, last
    snapshot: dict[str, Update] = {}
    newest = last
    seen = 0
    stretch = Stretch()
    quiet = False
    loop = asyncio.get_running_loop()
    step = load_timeout / 8
    try:
        # One deadline, moved on as values come: a wait of its own for each value (asyncio.wait_for) runs it as a
        # task, 19 µs a value. Moving it cancels a timer and makes one (the cancelled one stays in the
        # loop's heap until swept): done at each value, a tenth of the loop's work loading a 1,000-node mesh.
        async with asyncio.timeout(load_timeout) as deadline:
            moved = loop.time()
            while True:
                try:
                    update = await anext(watcher)
                except StopAsyncIteration:
                    raise RuntimeError(f"the watch of {watcher.state} was stopped while loading") from None
                now = loop.time()
                if now - moved > step:
                    deadline.reschedule(now + load_timeout)
                    moved = now
                if keep is None or update.value is None or keep(update.key, update.value):
                    snapshot[update.key] = update
                else:
                    snapshot.pop(update.key, None)
                if update.revision >= last:
                    newest = update.revision
                    break
                quiet = not update.pending
                seen += 1
                if seen % CHUNK == 0 and stretch.over():
                    await asyncio.sleep(0)  # queued values do not yield the loop: a host's tasks get theirs
    except TimeoutError:
        if not quiet:
            raise nats.errors.TimeoutError from None
    return snapshot, newest


async def drop_watch(nc: Client, js: JetStreamContext, watcher: Watch) -> None:
    """Stop a watch and delete its consumer, so that no consumer is left behind."""
    consumer = watcher.consumer
    try:
        await watcher.stop()
    except nats.errors.Error as err:
        log.debug("stopping the watch of %s: %s", watcher.state, err)
    if consumer is not None and nc.is_connected:
        try:
            await js.delete_consumer(stream_of(watcher.state), consumer)
        except (nats.errors.Error, TimeoutError) as err:
            log.debug("deleting the watch consumer %s of %s: %s", consumer, watcher.state, err)
