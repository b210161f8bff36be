"""The watched cache: every bucket the rules read, kept in memory by key-value watches (an informer).

Compositions read memory, not the network (design.md). The cache fills a `Memory` (bus/memory.py: the view,
changed only forwards, each change told to a listener) from one key-value watch per state: the states the rules
read (contract section 2: `READS`, each BoundReads provider's `<provider>.bound`, `asks.records`), the seat's own
(section 4, `OWN`), and `applied` and `collect` for the verb (section 9). Each watch first loads the bucket's
current values, then follows its changes.

- A bucket that does not exist yet is waited for (section 2): logged once, retried with backoff and woken at
  once by JetStream's stream-created advisory. It never stops the seat.
- After a reconnect every watch is made again (nats-py's watchers can go silent after a server restart): the
  old watcher is stopped and its consumer deleted, the bucket's current values are loaded anew and reconciled
  with memory, so that changes made while the seat was away arrive as changes.
- A writer puts its own successful write in at once (`note_written`, read your writes).
- A partitioned seat's memory keeps only some keys (`Memory.keeping`, rules/kept.py): the states that decide which are
  loaded first, the others' values not kept are dropped as they load, and a change that widens what is kept is
  applied only once the states it widens are loaded again.

The view is changed only on the loop's thread; other threads read it as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from mesh_provisioner.bus.connection import STREAM_ADVISORIES, open_bucket, stream_of, subject_of
from mesh_provisioner.bus.link import link
from mesh_provisioner.bus.memory import Listener, Memory
from mesh_provisioner.bus.watch import (
    ATTEMPT,
    CHUNK,
    INACTIVE_THRESHOLD,
    RETRY_MAX,
    Stretch,
    Watch,
    WatchingJetStream,
    drop_watch,
    first_values,
)
from mesh_provisioner.contract import (
    APPLIED,
    ASK_RECORDS,
    COLLECT,
    DEFAULT_BOUND_READS,
    NEEDS,
    OWN,
    READS,
    REGISTRY,
    bound,
    bucket,
)
from mesh_provisioner.rules.memory_view import MemoryView

log = logging.getLogger("mesh_provisioner.bus.cache")



def watched_states(bound_reads: Iterable[str] = DEFAULT_BOUND_READS) -> tuple[str, ...]:
    """Every state the cache watches: what the rules read (section 2), the seat's own (section 4, with the
    retired `needs`, whose keys it deletes, and the `registry`, whose keys another writer deletes it writes back),
    and what the verb reads (section 9: `applied` and `collect`)."""
    return (*READS, *(bound(p) for p in bound_reads), ASK_RECORDS, *OWN, NEEDS, REGISTRY, APPLIED, COLLECT)


class Cache:
    """The bus in memory: one key-value watch per state fills a MemoryView, and each change is told on."""

    def __init__(
        self,
        nc: Client,
        *,
        bound_reads: Iterable[str] = DEFAULT_BOUND_READS,
        states: Iterable[str] | None = None,
        on_change: Listener | None = None,
        on_resync: Callable[[], None] | None = None,
        backoff: tuple[float, float] = (0.05, RETRY_MAX),
        poll_missing: float = 30.0,
        load_timeout: float = 10.0,
        request_timeout: float = 10.0,
    ) -> None:
        """A cache over `nc`'s buckets; `states` defaults to `watched_states(bound_reads)`. Call `start()`.

        `on_change` is told every change applied, `on_resync` each time a resync has loaded every bucket again;
        both are called on the loop and must not block.

        A watch that fails is made again after `backoff` (first, most) seconds, doubling. A missing bucket is
        looked for again on the same backoff up to `poll_missing` seconds, but JetStream's advisory of its
        creation wakes its watch at once. `load_timeout` bounds the wait for each value of a bucket's first load,
        `request_timeout` each request to JetStream (a bucket opened, a key read again), of which each try waits
        `ATTEMPT` s at most (bus/watch.py): one unanswered is made again.
        """
        self.memory = Memory(MemoryView(bound_reads), on_change)
        self.view = self.memory.view
        self.states = tuple(states) if states is not None else watched_states(self.view.bound_reads)
        self.on_resync = on_resync
        self.resyncs = 0
        self._nc = nc
        self._js = WatchingJetStream(nc, timeout=min(request_timeout, ATTEMPT))
        self._link = link(nc)
        self._backoff = backoff
        self._poll_missing = poll_missing
        self._load_timeout = load_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._watchers: dict[str, Watch] = {}  # each state's current watch, once it follows
        # Each state's load under way, for how far it has come (`headway`): its watch while loading, the most values one
        # watch of it received in the load under way, the values it took into memory.
        self._loading_watch: dict[str, Watch] = {}
        self._reached: dict[str, int] = {}
        self._taken: dict[str, int] = {}
        self._latest: dict[str, int] = {}  # each state's newest revision its watch delivered
        self._loading: set[str] = set()
        self._missing: set[str] = set()  # states whose bucket does not exist (section 2)
        self._loaded = asyncio.Event()
        self._progress = asyncio.Event()  # set each time a state is loaded, and when the cache stops
        self._widening: set[str] = set()  # states loading again because memory keeps more of them
        self._stopped = False
        self._background: set[asyncio.Task[None]] = set()  # the start of the others, reloads: cancelled by `stop`
        self._synced = False
        self._created: dict[str, asyncio.Event] = {}
        self._advisories: Subscription | None = None
        self._resync_task: asyncio.Task[None] | None = None

    def headway(self, states: Iterable[str]) -> int:
        """How far the loads of those of the states still loading have come: for each, the most values one watch of it
        received in the load under way, and the values it took into memory (`wait_loaded`). A load made again from
        the start (its watch failed) adds only once it gets further than the one before; a state that follows its
        bucket adds nothing."""
        total = 0
        for state in states:
            if state in self._loading:
                watch = self._loading_watch.get(state)
                reached = max(self._reached.get(state, 0), watch.received if watch is not None else 0)
                total += reached + self._taken.get(state, 0)
        return total

    @property
    def changes(self) -> int:
        """How many changes memory has applied so far (`Memory.changes`)."""
        return self.memory.changes

    # ---- the cache's life -------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Whether every bucket that exists has had its values loaded once."""
        return self._synced

    @property
    def requests(self) -> int:
        """How many requests the bus layer has sent on this cache's connection so far (counted on the seat's own
        connections only: 0 on a host's)."""
        return self._link.requests

    async def start(self) -> None:
        """Start every watch; returns at once (see `wait_synced`). Runs on the loop that owns the connection.

        When memory keeps only some keys (`Memory.keeping`), the states that decide which are loaded first: the
        others are then kept as they load, not loaded whole and dropped after.
        """
        self._loop = asyncio.get_running_loop()
        self._loading = set(self.states)
        self._loaded.clear()
        self._advisories = await self._nc.subscribe(STREAM_ADVISORIES, cb=self._advisory)
        self._link.on_reconnected(self._reconnected)
        keeping = self.memory.keeping
        first = [s for s in keeping.deciding if s in self.states] if keeping is not None else []
        for state in first:
            self._restart(state)
        rest = [s for s in self.states if s not in first]
        if first:
            self._in_background(self._start_after(first, rest), "cache start")
        else:
            for state in rest:
                self._restart(state)

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run work on the loop beside the watches, until done or `stop`."""
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_after(self, first: list[str], rest: list[str]) -> None:
        """Start the watches of `rest` once the states of `first` are loaded."""
        await self.wait_loaded(first)
        for state in rest:
            if state not in self._tasks:
                self._restart(state)

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until every existing bucket's values are loaded; TimeoutError past `timeout` seconds."""
        if not self._synced:
            await asyncio.wait_for(self._loaded.wait(), timeout)

    async def resync(self) -> None:
        """Watch every bucket again from scratch and reconcile memory with it; returns once all are loaded.

        Called after each reconnect (a watcher may have gone silent across a server restart); usable by hand.
        """
        self.resyncs += 1
        log.info("watching every bucket again (resync %d)", self.resyncs)
        await self.reload(self.states)
        log.info("resync %d done: %d keys", self.resyncs, len(self.view))
        if self.on_resync is not None:
            try:
                self.on_resync()
            except Exception:
                log.exception("the resync listener failed")

    async def reload(self, states: Iterable[str], widening: bool = False, stall: float | None = None) -> None:
        """Watch some buckets again from scratch and reconcile memory with them (a partitioned seat's memory keeps
        more of them once it holds more shards, or `widening`: see `_begin_reload`); returns once they are loaded
        (`wait_loaded`, with `stall`)."""
        states = [s for s in states if s in self.states]
        if not states:
            return
        self._begin_reload(states, widening)
        await self.wait_loaded(states, stall)

    async def let_go(self, states: Iterable[str]) -> int:
        """Drop from memory the keys of some states it no longer keeps (`Memory.let_go`), a chunk at a time, the loop
        given back after each stretch; answers how many were dropped."""
        dropped = 0
        stretch = Stretch()
        for state in states:
            keys = list(self.view.keys(state))
            for start in range(0, len(keys), CHUNK):
                dropped += self.memory.let_go(state, keys[start:start + CHUNK])
                if stretch.over():
                    await asyncio.sleep(0)
        return dropped

    async def _widened(self, state: str) -> None:
        """Wait until the states read again for memory keeping more are loaded (but `state`): a change that may widen
        what is kept is applied only then, whichever session asked for them."""
        if waiting := self._widening - {state}:
            await self.wait_loaded(waiting)

    def _begin_reload(self, states: Iterable[str], widening: bool = False) -> None:
        """Mark the states loading (the cache is not synced until they are loaded) and watch each again; `widening`:
        memory keeps more of them now, and a change that may widen it again waits for them (`_widened`)."""
        states = list(states)
        if widening:
            self._widening |= set(states)
        self._loading |= set(states)
        self._loaded.clear()
        for state in states:
            self._restart(state)

    async def wait_loaded(self, states: Iterable[str] | None = None, stall: float | None = None) -> None:
        """Wait until none of the states (None: of every state) is loading, or the cache is stopped.

        However long that takes while their loads make headway (`headway`): a large mesh's load takes minutes, and one
        waited for a fixed time would fail there for good. TimeoutError once `stall` seconds pass with none (None:
        waits for ever), a server gone quiet; the loads go on.
        """
        states = list(self.states if states is None else states)

        def loaded() -> bool:
            return self._stopped or not any(s in self._loading for s in states)

        if not await while_headway(loaded, self._progress, lambda: self.headway(states), stall):
            loading = ", ".join(sorted(s for s in states if s in self._loading))
            raise TimeoutError(f"the cache's load of {loading} made no headway in {stall} s")

    async def caught_up(self) -> bool:
        """Whether every change JetStream holds of every watched bucket has been applied to memory now.

        Asks each bucket's stream leader for its last revision (one request per bucket) and compares it with the
        newest revision the watch applied: false while a bucket loads, while its watch is down, or while the leader
        holds a change memory has not. The leader, not the watch's consumer: a consumer on a cluster's server that
        is catching up, or that was lost, says it has nothing more to deliver while the leader has.
        """
        if self._loading:
            return False
        for state in self.states:
            if state in self._missing:
                continue
            if state not in self._watchers:
                return False  # its watch is being made again
            latest = self._latest.get(state, 0)
            try:
                info = await self._js.stream_info(stream_of(state))
                if info.state.last_seq > latest and not await self._removed_after(state, latest):
                    return False
            except (nats.errors.Error, TimeoutError):
                return False
        return True

    async def _removed_after(self, state: str, revision: int) -> bool:
        """Whether the stream holds no message after `revision`: those after it were removed before the watch
        delivered them (a key's history rolled up, an entry past its age), so there is nothing more to apply."""
        try:
            await self._js.get_msg(stream_of(state), seq=revision + 1, subject=subject_of(state, ">"), next=True)
        except nats.js.errors.NotFoundError:
            return True
        return False

    async def refresh(self, state: str, key: str) -> bool:
        """Read one key's current value from the bus into memory now, as after a conflict (one request); False when
        the bus did not answer.

        The watch would bring it too; this does not wait for it. Never backwards: an older value is ignored.
        """
        if state not in self.states:
            return True
        try:
            kv, _ = await open_bucket(self._js, state)
            found = await kv.get(key)
        except nats.js.errors.KeyNotFoundError as err:
            entry = getattr(err, "entry", None)
            if isinstance(entry, KeyValue.Entry) and entry.revision:
                self.memory.receive(state, key, None, entry.revision)  # deleted, at the marker's revision
            elif (held := self.view.get(state, key)) is not None:
                self.memory.set(state, key, None, held.revision)  # purged: no revision says when
            return True
        except nats.js.errors.BucketNotFoundError:
            self.memory.reconcile(state, {}, None)
            return True
        except (nats.errors.Error, TimeoutError) as err:
            # The bus out of reach (a server lost mid-request): the caller does its work again later.
            log.info("%s %s could not be read again: %s", state, key, err)
            return False
        self.memory.receive(state, key, found.value or b"", found.revision or 0)
        return True

    async def stop(self) -> None:
        """Stop every watch and delete its consumer; the view keeps what it holds."""
        self._stopped = True
        self._progress.set()  # whoever waits for a reload waits no more
        self._link.remove_listener(self._reconnected)
        tasks = list(self._tasks.values())
        tasks += self._background
        if self._resync_task is not None:
            tasks.append(self._resync_task)
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each watch stops its watcher as it ends
        if self._advisories is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._advisories.unsubscribe()
            self._advisories = None

    # ---- read your writes -------------------------------------------------------------------------------

    def begin_writes(self, writes: Iterable[tuple[str, str, bytes | None]]) -> None:
        """Writes this seat is making, until `end_writes` (`Memory.begin_writes`). Called on the loop."""
        self.memory.begin_writes(writes)

    def end_writes(self, writes: Iterable[tuple[str, str, bytes | None]]) -> None:
        """Writes begun are made or given up (`Memory.end_writes`). Called on the loop."""
        self.memory.end_writes(writes)

    def note_written(self, state: str, key: str, raw: bytes | None, revision: int) -> None:
        """Keep a write this seat made (None: a delete) at its new revision, unless the cache holds a newer one.

        On another thread than the loop's, the change is handed to the loop. A state not watched is ignored.
        """
        if state not in self.states:
            return
        loop = self._loop
        if loop is not None and not _on(loop):
            loop.call_soon_threadsafe(self.memory.receive, state, key, raw, revision, True)
            return
        self.memory.receive(state, key, raw, revision, True)

    # ---- one watch per state ----------------------------------------------------------------------------

    def _restart(self, state: str) -> None:
        """(Re)start a state's watch: the one running is cancelled, and the new one begins once it has ended."""
        old = self._tasks.get(state)
        if old is not None:
            old.cancel()
        self._tasks[state] = asyncio.create_task(self._session(state, old), name=f"watch {state}")

    async def _session(self, state: str, after: asyncio.Task[None] | None = None) -> None:
        """Watch one state for ever: open its bucket (waiting while there is none), load it, follow it."""
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)  # its watcher is stopped before this one starts
        name = bucket(state)
        delay = self._backoff[0]
        while True:
            created = self._created.setdefault(stream_of(state), asyncio.Event())
            created.clear()
            try:
                _, info = await open_bucket(self._js, state)
            except nats.js.errors.BucketNotFoundError:
                # Contract section 2: a missing bucket is waited for, never an error that stops the seat; said once
                # until it exists, not again at each resynchronisation.
                if state not in self._missing:
                    log.info("bucket %s does not exist yet: it is read once it is created; the seat goes on meanwhile",
                             name)
                self._missing.add(state)
                self.memory.reconcile(state, {}, None)  # no bucket: no keys
                self._done_loading(state)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(created.wait(), delay)
                delay = min(delay * 2, self._poll_missing)
                continue
            except Exception as err:
                log.warning("cannot open bucket %s (%s: %s); trying again in %.2f s",
                            name, type(err).__name__, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1])
                continue
            if state in self._missing:
                log.info("bucket %s exists now", name)
                self._missing.discard(state)
            watcher = None
            try:
                watcher = await Watch.start(self._js, state, inactive_threshold=INACTIVE_THRESHOLD)
                self._loading_watch[state] = watcher
                await self._load(state, watcher, info.state.last_seq, info.state.messages)
                self._loaded_by(state, watcher)
                if self._tasks.get(state) is not asyncio.current_task():
                    return  # loaded again by the session made meanwhile (`_load`): it follows the bucket
                delay = self._backoff[0]
                self._watchers[state] = watcher
                await self._follow(state, watcher)
                log.warning("the watch of %s ended; watching again in %.2f s", name, delay)
            except Exception as err:
                log.warning("the watch of %s failed (%s: %s); watching again in %.2f s",
                            name, type(err).__name__, err, delay)
            finally:
                # A watch that never started (watcher None) has no entry: deleting one would raise and end the
                # state's watch for good.
                if watcher is not None and self._watchers.get(state) is watcher:
                    del self._watchers[state]
                if watcher is not None:
                    self._loaded_by(state, watcher)
                    # Shielded: a second cancel while it runs must not leave the consumer behind.
                    await asyncio.shield(drop_watch(self._nc, self._js, watcher))
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _load(self, state: str, watcher: Watch, last: int, messages: int = 0) -> None:
        """Read the bucket's current values through a new watch (`first_values`) and reconcile memory with them."""
        keeping = self.memory.keeping
        keep = None if keeping is None else (lambda key, raw: keeping.keeps(state, key, raw))
        snapshot, newest = await first_values(watcher, last, messages, self._load_timeout, keep)
        self._latest[state] = newest
        contents = {k: (u.value, u.revision) for k, u in snapshot.items()}
        widened: set[str] = set()
        if keeping is not None and state in keeping.widening:
            # Values that widen what memory keeps: the states loaded already (a resync's, or this one's before a
            # bucket made late) are read again before the values are applied, as with a change followed (`_follow`).
            widened = {w for key, (raw, _) in contents.items() for w in keeping.widens(state, key, raw)}
            if before := [s for s in widened if s in self._tasks and s != state]:
                self._begin_reload(before, widening=True)
            await self._widened(state)
        # Kept a few at a time, the loop given back after each stretch (bus/watch.py): a bucket of tens of thousands
        # of keys would hold it for the whole decoding. Each key is told as it is kept, so whoever read a key early
        # is woken by it.
        keys = list(contents)
        stretch = Stretch()
        for start in range(0, max(len(keys) - CHUNK, 0), CHUNK):
            self.memory.take(state, {k: contents[k] for k in keys[start:start + CHUNK]}, last)
            self._taken[state] = self._taken.get(state, 0) + CHUNK
            if stretch.over():
                await asyncio.sleep(0)
        self.memory.reconcile(state, contents, last)
        late: set[str] = set()
        if keeping is not None and state in keeping.deciding:
            # Asked again with these values in memory: with a catalogue state loading beside this one, a module may
            # offer a provision only with both (read again now, not before they were applied).
            late = {w for key, (raw, _) in contents.items() for w in keeping.widens(state, key, raw)}
        # This state, filtered as it came by what memory kept before it widened, is read again too.
        if again := sorted({s for s in late if s in self._tasks} | ({state} & widened)):
            self._begin_reload(again, widening=True)
            if state in again:
                return  # loaded again by the session that follows this one
        self._done_loading(state)

    async def _follow(self, state: str, watcher: Watch) -> None:
        """Apply a watch's changes as they come, until it is stopped, giving the loop back after each stretch."""
        seen = 0
        stretch = Stretch()
        async for update in watcher:
            seen += 1
            if seen % CHUNK == 0 and stretch.over():
                await asyncio.sleep(0)
            key, raw, revision = update.key, update.value, update.revision
            keeping = self.memory.keeping
            if keeping is not None and state in keeping.widening:
                # Read again before the change is applied: nothing reads what memory keeps of it before then. (A
                # state reading itself again ends this watch: the next one loads the change.)
                await self.reload(keeping.widens(state, key, raw), widening=True)
                await self._widened(state)
            self.memory.receive(state, key, raw, revision)
            self._latest[state] = max(self._latest.get(state, 0), revision)

    def _loaded_by(self, state: str, watcher: Watch) -> None:
        """A watch's load of a state is over (done, or failed): how far it came stays the state's (`headway`)."""
        if self._loading_watch.get(state) is watcher:
            del self._loading_watch[state]
            if state in self._loading:
                self._reached[state] = max(self._reached.get(state, 0), watcher.received)

    def _done_loading(self, state: str) -> None:
        """Note that a state's bucket is loaded (or missing); once all are, the cache is synced."""
        self._loading.discard(state)
        self._reached.pop(state, None)  # a load begun later counts from nothing
        self._taken.pop(state, None)
        self._widening.discard(state)
        self._progress.set()
        if not self._loading and not self._loaded.is_set():
            self._loaded.set()
            if not self._synced:
                self._synced = True
                log.info("cache synced: %d keys in %d states", len(self.view), len(self.states))

    async def _advisory(self, msg: Msg) -> None:
        """JetStream's stream advisories: a bucket created wakes its waiting watch, one deleted restarts it."""
        tokens = msg.subject.split(".")
        action, stream = (tokens[4], tokens[5]) if len(tokens) == 6 else ("", "")
        if action == "CREATED" and stream in self._created:
            self._created[stream].set()
        elif action == "DELETED":
            for state in self.states:
                if stream_of(state) == stream and state in self._tasks:
                    log.info("bucket %s was deleted", bucket(state))
                    self._restart(state)

    def _reconnected(self) -> None:
        """After a reconnect, watch everything again in the background (the listener must not block)."""
        if self._resync_task is not None and not self._resync_task.done():
            self._resync_task.cancel()
        self._resync_task = asyncio.create_task(self.resync(), name="cache resync")

async def while_headway(
    done: Callable[[], bool], woken: asyncio.Event, headway: Callable[[], int], stall: float | None,
) -> bool:
    """Wait until `done()`, asked each time `woken` is set, however long that takes while `headway()` grows; False once
    `stall` seconds pass in which it did not (looked at every quarter of it; None: waits for ever)."""
    loop = asyncio.get_running_loop()
    seen, since = headway(), loop.time()
    while not done():
        woken.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if stall is None else stall / 4):
                await woken.wait()
        now, reached = loop.time(), headway()
        if reached != seen:
            seen, since = reached, now
        elif stall is not None and now - since >= stall and not done():
            return False
    return True


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling thread runs `loop`."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


