"""Reading a bucket through a key-value watch: its current values first, then its changes (bus/cache.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.client import DEFAULT_JS_SUB_PENDING_BYTES_LIMIT, DEFAULT_JS_SUB_PENDING_MSGS_LIMIT, Callback
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from mesh_provisioner.bus.natsfix import stop_watch, watch_consumer

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
# waits for its answer before it is made again on the watch's backoff. On a cluster, a request about a stream whose
# leader was lost is not answered until another is elected (5 to 10 s here): waiting the whole request timeout for the
# first try kept a resync blind for seconds after the new leaders were in place.
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

    nats-py's `KeyValue.watch` takes no heartbeat; it makes its consumer with this context's `subscribe`, which
    gives an ordered consumer this heartbeat when none is asked for.
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


def content(entry: KeyValue.Entry) -> tuple[bytes | None, int]:
    """A watched entry's value (None: a delete or purge marker, section 2's "no key") and its revision."""
    deleted = entry.operation in (KV_DEL, KV_PURGE)
    return (None if deleted else entry.value or b""), entry.revision or 0


async def first_values(
    watcher: KeyValue.KeyWatcher, name: str, last: int, messages: int, load_timeout: float,
    keep: Callable[[str, bytes], bool] | None = None,
) -> tuple[dict[str, KeyValue.Entry], int]:
    """The bucket `name`'s current values, by key, as a new watch delivers them first, and the newest revision
    delivered (`last` at least). `keep` says which values to hold on to (a delete is always held): the others are
    dropped as they come, never all held at once.

    `last` is the stream's last revision and `messages` its count of messages from just before the watch
    started: everything up to `last` is in the values the watch delivers first, in order, and the last of them
    is of revision `last` or later (the key written last holds it, or a newer value). The load ends there.
    nats-py's marker (None) that says they have all come may come before them (it races the consumer's first
    deliveries), and a consumer on a cluster's server that is catching up says nothing is pending before it has
    them: neither ends the load. Values ignored as loaded would be lost for
    good: the cache's floor drops them. Should nothing come for `load_timeout` s after a value with nothing
    pending (the stream's last message removed by hand), what came is taken as the bucket. (A value is waited for
    seven eighths of `load_timeout` at least, all of it at most: the deadline is moved on that often, not at each.)

    A bucket that held nothing (`messages` 0) has nothing to load: what is written to it once the watch started
    comes as its changes. Its load does not wait for the marker, which may never come: nats-py counts an idle
    heartbeat of the watch's consumer as a delivered value, and puts no marker when one came before the consumer's
    info (`WATCH_HEARTBEAT` is a quarter of a second: starting on a 1,000-node mesh, an empty bucket's load then
    waited the whole `load_timeout`, failed, and was made again).
    """
    if not messages:
        return {}, last
    snapshot: dict[str, KeyValue.Entry] = {}
    newest = last
    seen = 0
    stretch = Stretch()
    quiet = False
    loop = asyncio.get_running_loop()
    step = load_timeout / 8
    try:
        # One deadline, moved on as values come: nats-py's `updates(timeout)` runs each wait as a task of its own
        # (asyncio.wait_for), 19 µs a value. Moving it cancels a timer and makes one (the cancelled one stays in the
        # loop's heap until swept): done at each value, a tenth of the loop's work loading a 1,000-node mesh.
        async with asyncio.timeout(load_timeout) as deadline:
            moved = loop.time()
            while True:
                try:
                    update = await anext(watcher)
                except StopAsyncIteration:
                    raise RuntimeError(f"the watch of {name} was stopped while loading") from None
                now = loop.time()
                if now - moved > step:
                    deadline.reschedule(now + load_timeout)
                    moved = now
                if update is None:
                    continue
                revision = update.revision or 0
                if keep is None or update.operation in (KV_DEL, KV_PURGE) or keep(update.key, update.value or b""):
                    snapshot[update.key] = update
                else:
                    snapshot.pop(update.key, None)
                if revision >= last:
                    newest = revision
                    break
                quiet = not update.delta
                seen += 1
                if seen % CHUNK == 0 and stretch.over():
                    await asyncio.sleep(0)  # queued values do not yield the loop: a host's tasks get theirs
    except TimeoutError:
        if not quiet:
            raise nats.errors.TimeoutError from None
    return snapshot, newest


async def drop_watch(nc: Client, js: JetStreamContext, stream: str, watcher: KeyValue.KeyWatcher) -> None:
    """Stop a watcher and delete its consumer, so that no consumer is left behind."""
    consumer = watch_consumer(watcher)
    try:
        await stop_watch(watcher)
    except nats.errors.Error as err:
        log.debug("stopping the watch of %s: %s", stream, err)
    if consumer is not None and nc.is_connected:
        try:
            await js.delete_consumer(stream, consumer)
        except (nats.errors.Error, TimeoutError) as err:
            log.debug("deleting the watch consumer %s of %s: %s", consumer, stream, err)
