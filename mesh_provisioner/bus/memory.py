"""What the watches brought, in memory: the view the rules read, changed only forwards, with the seat's own writes.

`Memory` applies each change a watch, a load or the seat's own write brings (bus/cache.py), and keeps to the
cache's promises (its module docstring): nothing goes backwards (a change not newer than what it holds for its key,
or at or below the state's floor, the last load's revision, is ignored); a delete's revision is kept so an older
value cannot come back; the listener is told of each change with whether the seat made it (`ours`: a write it
noted, or one whose value it is writing); a value that does not decode is kept with why (contract section 7).
`changes` counts the changes applied: a judgment that began reading at a count read each change up to it.

Called on the loop's thread only; other threads read the view as it is.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol

from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.view import Entry, entry_of

log = logging.getLogger("mesh_provisioner.bus.cache")

Listener = Callable[[str, str, Entry | None, Entry | None, bool], None]
"""Told each change memory applies: `(state, key, old entry or None, new entry or None, ours)`, `ours` when the
seat made it itself."""


class Keeping(Protocol):
    """Which keys memory keeps, and the states that decide it (rules/kept.py `Kept`)."""

    deciding: tuple[str, ...]
    """The states loaded before the others."""
    widening: tuple[str, ...]
    """The states a change of which may widen what is kept (`widens`)."""

    def keeps(self, state: str, key: str, raw: bytes) -> bool:
        """Whether memory keeps a key at this value."""
        ...

    def widens(self, state: str, key: str, raw: bytes | None) -> tuple[str, ...]:
        """The states to read again before a change is applied, memory keeping more of them after it."""
        ...


class Memory:
    """A MemoryView changed only forwards, counting its changes and telling each to a listener."""

    def __init__(self, view: MemoryView, on_change: Listener | None = None) -> None:
        self.view = view
        self.on_change = on_change
        # Which keys memory keeps (a partitioned seat's, contract 8.1: rules/kept.py); None: every key. A key not
        # kept is not held at all, not even as deleted.
        self.keeping: Keeping | None = None
        self.changes = 0  # changes applied to the view so far
        self._gone: dict[str, dict[str, int]] = defaultdict(dict)  # deleted keys' revisions, so none comes back
        self._floor: dict[str, int] = {}  # per state: every revision up to it is in memory already
        # The values of the writes this seat is making, each (state, key, value or None for a delete): counted, as
        # two actors may write the same value to a key at once.
        self._writing: Counter[tuple[str, str, bytes | None]] = Counter()

    def begin_writes(self, writes: Iterable[tuple[str, str, bytes | None]]) -> None:
        """Writes this seat is making, each (state, key, value or None for a delete), until `end_writes`.

        Meanwhile a change the watch brings with one of these values is the seat's own: the write's echo, come
        before its acknowledgement.
        """
        self._writing.update(writes)

    def end_writes(self, writes: Iterable[tuple[str, str, bytes | None]]) -> None:
        """Writes begun are made or given up: a value the watch brings for them from now on is another writer's."""
        for write in writes:
            left = self._writing[write] - 1
            if left > 0:
                self._writing[write] = left
            else:
                del self._writing[write]

    def held(self, state: str, key: str) -> int:
        """The revision the cache holds for a key, kept or deleted; 0 when none."""
        entry = self.view.get(state, key)
        return entry.revision if entry is not None else self._gone[state].get(key, 0)

    def receive(self, state: str, key: str, raw: bytes | None, revision: int, ours: bool | None = None) -> None:
        """Apply one change unless the cache already holds its revision or a newer one (never backwards); `ours`
        when the seat made it, None to tell from the writes it is making.

        Nor one at or below the state's floor: the last load already holds every change up to it, so such a
        change (a write's own note arriving after a reload, say) can only be older than what memory says.
        """
        if revision <= max(self.held(state, key), self._floor.get(state, 0)):
            return
        if ours is None:
            ours = (state, key, raw) in self._writing
        self.set(state, key, raw, revision, ours)

    def take(self, state: str, snapshot: dict[str, tuple[bytes | None, int]], last: int | None) -> None:
        """Keep each key of a freshly loaded bucket's values that memory does not hold as it is (`reconcile`)."""
        for key, (raw, revision) in snapshot.items():
            held = self.held(state, key)
            if revision == held or (last is not None and held > last and revision < held):
                continue
            self.set(state, key, raw, revision)

    def reconcile(self, state: str, snapshot: dict[str, tuple[bytes | None, int]], last: int | None) -> None:
        """Make memory say what a freshly loaded bucket says, telling each key that changed.

        A key whose revision is the same is left alone. A key the cache holds at a revision past `last` was
        written by this seat after the snapshot was taken: it stays, and the watch brings whatever follows it.
        `last` None: the bucket is gone, and so is every key.
        """
        self.take(state, snapshot, last)
        for key in self.view.keys(state):
            if key in snapshot:
                continue
            entry = self.view.get(state, key)
            if entry is not None and last is not None and entry.revision > last:
                continue
            self.set(state, key, None, last or 0)
        # From now on a change at or below `last` is old news; a deleted key's revision matters only above it.
        # (The stream's last revision only grows, unless the bucket was made anew: then it is the new one's.)
        self._floor[state] = last or 0
        gone = self._gone[state]
        for key in [k for k, rev in gone.items() if last is None or rev <= last]:
            del gone[key]

    def let_go(self, state: str, keys: Iterable[str]) -> int:
        """Drop those of some keys of a state that memory holds and no longer keeps (a partitioned seat holding fewer
        nodes, contract 8.1), each told as a delete and none held as deleted: kept again, it is read again. Answers how
        many were dropped."""
        keeping = self.keeping
        if keeping is None:
            return 0
        dropped = 0
        for key in keys:
            entry = self.view.get(state, key)
            if entry is not None and not keeping.keeps(state, key, entry.raw):
                self.set(state, key, entry.raw, entry.revision)  # a value memory does not keep: `set` drops the key
                dropped += 1
        return dropped

    def set(self, state: str, key: str, raw: bytes | None, revision: int, ours: bool = False) -> None:
        """Set a key in the view (None: delete it) and tell the listener; a bad key or value is logged."""
        dropped = False
        if raw is not None and self.keeping is not None and not self.keeping.keeps(state, key, raw):
            if self.view.get(state, key) is None:
                return
            raw, dropped = None, True  # a key memory no longer keeps leaves it, as a delete
        if raw is None and revision > 0 and not dropped:
            self._gone[state][key] = revision
        else:
            # A key dropped is still on the bus: memory keeping it again later reads it again at that revision.
            self._gone[state].pop(key, None)
        try:
            new = None if raw is None else entry_of(state, key, raw, revision)
            old = self.view.apply(state, key, new)
        except Exception:
            # Contract section 7: nothing the seat reads can crash it.
            log.exception("could not keep %s %s at revision %d", state, key, revision)
            return
        if new is not None and new.error:
            log.warning("%s", new.error)
        if old is None and new is None:
            return
        # Counted once memory holds the change: a judgment that began reading at this count or later read it.
        self.changes += 1
        listener = self.on_change
        if listener is not None:
            try:
                listener(state, key, old, new, ours)
            except Exception:
                log.exception("the change listener failed on %s %s", state, key)
