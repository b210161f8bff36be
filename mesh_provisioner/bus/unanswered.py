"""The writes a process has sent and not yet seen answered, by the shard of their key (contract 8.1).

A lease key given back must not be deleted before the writes made under it are stored: the writes go out on the
seat's connection and the delete on the lease's, and the server orders nothing between two connections. A write
stored after its shard's key was deleted may land after another process took the shard and wrote the same key.

The store counts a batch in from before it asks its guard the last time until its answers are in (store.py); a
lease giving a shard back stops its writes first, then waits here for those already counted. Either the store's last
look at the guard saw the shard gone and sent nothing, or the batch was counted before the lease looked here.

The store runs on the seat's event loop and the lease on its own, each on a thread of its own: the counts are kept
under a lock, and a waiter is woken on its own loop.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterable

from mesh_provisioner.messages.writes import Write


class Unanswered:
    """Counts the writes sent and not yet answered, by shard, and wakes whoever waits for some shards to have none."""

    def __init__(self, shard_of: Callable[[Write], int | None]) -> None:
        """`shard_of` says the shard of a write's key (None: a write no lease guards, not counted)."""
        self._shard_of = shard_of
        self._lock = threading.Lock()
        self._counts: collections.Counter[int] = collections.Counter()
        # Each waiter: the shards it waits for (None: every shard), its loop, and the future it waits on.
        self._waiters: list[tuple[frozenset[int] | None, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def sent(self, writes: Iterable[Write]) -> list[int]:
        """Count writes in, before the guard is asked the last time; answers what to give `answered` once they are
        answered (or given up)."""
        shards = [s for w in writes if (s := self._shard_of(w)) is not None]
        with self._lock:
            self._counts.update(shards)
        return shards

    def answered(self, shards: list[int]) -> None:
        """Count out what `sent` counted in, and wake those waiting for shards that now have none in flight."""
        with self._lock:
            self._counts.subtract(shards)
            self._counts = +self._counts  # shards at zero are gone
            woken = [(loop, f) for wanted, loop, f in self._waiters if not self._busy(wanted)]
            self._waiters = [w for w in self._waiters if self._busy(w[0])]
        for loop, future in woken:
            loop.call_soon_threadsafe(_wake, future)

    def count(self, shards: Iterable[int] | None = None) -> int:
        """The writes in flight now, of `shards` (None: of all)."""
        with self._lock:
            return sum(self._counts.values()) if shards is None else sum(self._counts[s] for s in shards)

    async def cleared(self, shards: Iterable[int] | None, timeout: float) -> bool:
        """Wait until no write of `shards` (None: of any) is in flight, `timeout` s at most; answers whether none is."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (None if shards is None else frozenset(shards), loop, future)
        with self._lock:
            if not self._busy(waiter[0]):
                return True
            self._waiters.append(waiter)
        try:
            await asyncio.wait_for(future, max(timeout, 0.0))
        except TimeoutError:
            return False
        finally:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return True

    def _busy(self, wanted: frozenset[int] | None) -> bool:
        """Whether a write of `wanted` (None: of any shard) is in flight; the lock held."""
        return bool(self._counts) if wanted is None else any(self._counts[s] for s in wanted)


def _wake(future: asyncio.Future[None]) -> None:
    """Wake a waiter on its loop, unless its wait ran out meanwhile."""
    if not future.done():
        future.set_result(None)
