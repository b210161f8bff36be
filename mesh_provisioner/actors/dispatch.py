"""The dispatcher: turns each change of the bus into the judgments whose last reads it touched, and queues them.

A judgment is `(kind, subject)`: a node's composition, a key's judgment or a retiring key's look at its ask. The
dispatcher keeps each one's read set from its last run (rules/reads.py; a key's, from its own run or from the
composition that last judged it) and an index from each token to the judgments that read it; a change wakes exactly
those (contract section 6's rule, by construction).

It is also the one work queue of the seat, as controller-runtime's workqueue is of a controller: one entry per
judgment, coalesced (ten wakes while it waits give one run), never two workers on one judgment, and no wake lost: a
change that lands while a judgment runs is kept with the run, and if the run read what it touched, the judgment is
queued again when the run ends. Each queued judgment waits at one actor (its node's, its provider's, the asker),
which `take`s all of its own at its next tick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from mesh_provisioner.rules.reads import Reads, Token

COMPOSE: Final = "compose"
JUDGE: Final = "judge"
LOOK: Final = "look"

_FEW: Final = 8  # readers a token keeps in a list; a set past that (a list of 8 is a third of a set's memory)

Judgment = tuple[str, str]
"""`(kind, subject)`: `("compose", node)`, `("judge", key)`, `("look", key)`."""


class _Run:
    """A judgment running at an actor, and whether it was asked for again meanwhile."""

    __slots__ = ("actor", "again", "since", "taken")

    def __init__(self, actor: str, since: float, taken: int) -> None:
        self.actor = actor
        self.since = since
        self.taken = taken  # the change count when it was taken: it began reading at this count or later
        self.again = False


class Dispatcher:
    """Read sets, the index of who read what, and the queue of judgments each actor has to run."""

    def __init__(self, kick: Callable[[str], bool], scope: Callable[[Judgment], bool] | None = None) -> None:
        """`kick(actor)` tells an actor to take its queue (a `Tick`); False when the actor cannot hear it now (it
        is down, waiting for its restart): `kick` is then called again by `restarted`.

        `scope` says which judgments this seat runs (a partitioned seat's, those of the nodes its shards hold:
        contract 8.1); None: all. One out of scope is never queued, and one queued when its node left the scope is
        dropped when taken: the process that holds the node now runs it."""
        self._kick = kick
        self.scope = scope
        self._lock = threading.Lock()
        # Kept small, a key's judgment each (design.md: 2 KiB a key): one shared tuple per token (`_tokens`, each
        # forgotten once nothing reads it), a read set as a tuple of them, and a token's readers as the one judgment
        # that most tokens have, a short list while there are few, a set only past that.
        self._tokens: dict[Token, Token] = {}
        self._reads: dict[Judgment, tuple[Token, ...]] = {}
        self._began: dict[Judgment, int] = {}  # the change count each judgment's last run began reading at
        self._readers: dict[Token, Judgment | list[Judgment] | set[Judgment]] = {}
        self._queued: dict[Judgment, str] = {}
        self._pending: dict[str, dict[Judgment, float]] = {}  # by actor, in the order queued, each its first wake
        self._running: dict[Judgment, _Run] = {}
        self._ticked: set[str] = set()
        self._writing: dict[tuple[str, str], list[Judgment]] = {}
        # The count of the last change that touched each token and the one judgment that wrote it (None: not one
        # judgment alone), while a run may not have read it: a run that ends finds there whether anything it read
        # changed after it first read it, in one lookup a token. A change is a judgment's own only when every change
        # kept for the token was. Emptied whenever no run is under way: every later run begins after all of them.
        self._last: dict[Token, tuple[int, Judgment | None]] = {}
        self._count = 0
        self._pruned_at = 0

    # ---- waking ---------------------------------------------------------------------------------------------

    def changed(
        self, tokens: set[Token], route: Callable[[Judgment], str], at: float = 0.0,
        writers: Iterable[Judgment] = (), count: int = 0, spared: Token | None = None,
    ) -> None:
        """A change (the view's `count`th) touched `tokens`: queue every judgment that read one (at the actor `route`
        names), and note it with every run under way. The judgments that wrote the change (`writers`) are not woken
        by it: their run already holds what they wrote (contract 6's fixed point: a judgment run again over its own
        writes writes nothing). Nor are the compositions that read only the token `spared` of them: the change is one
        they would make alike (actors/routing.py)."""
        mine = set(writers)
        writer = next(iter(mine)) if len(mine) == 1 else None
        kicks: list[str] = []
        with self._lock:
            self._count = max(self._count, count)
            if self._running:
                for t in tokens:
                    kept = self._last.get(t)
                    self._last[t] = (count, writer if kept is None or kept[1] == writer else None)
                self._prune(count)
            woken: set[Judgment] = set()
            for t in tokens:
                readers = self._readers.get(t)
                if readers is None:
                    continue
                if t == spared:
                    readers = [j for j in ((readers,) if isinstance(readers, tuple) else readers) if j[0] != COMPOSE]
                if isinstance(readers, tuple):
                    woken.add(readers)
                else:
                    woken.update(readers)
            for j in woken - mine:
                # A run that began reading after this change was counted has read it already.
                if j not in self._running and not (count and self._began.get(j, 0) >= count):
                    self._queue(j, route(j), at, kicks)
        self._kick_all(kicks)

    def add(self, judgments: Iterable[Judgment], actor: str | Callable[[Judgment], str], at: float = 0.0) -> None:
        """Queue judgments to run whatever they read (a start, a restart, a new node or key); one running now runs
        again when it ends."""
        route = actor if callable(actor) else None
        kicks: list[str] = []
        with self._lock:
            for j in judgments:
                run = self._running.get(j)
                if run is not None:
                    run.again = True
                else:
                    self._queue(j, route(j) if route is not None else str(actor), at, kicks)
        self._kick_all(kicks)

    def knows(self, j: Judgment) -> bool:
        """Whether a judgment has run, runs or waits to."""
        return j in self._reads or j in self._queued or j in self._running

    def _queue(self, j: Judgment, actor: str, at: float, kicks: list[str]) -> None:
        """Queue a judgment at an actor, unless it waits already (then it keeps its place and its earliest wake)."""
        if self.scope is not None and not self.scope(j):
            return
        if j in self._queued:
            pending = self._pending[self._queued[j]]
            first = pending[j]
            if at and (not first or at < first):
                pending[j] = at
            return
        self._queued[j] = actor
        self._pending.setdefault(actor, {})[j] = at
        if actor not in self._ticked:
            self._ticked.add(actor)
            kicks.append(actor)

    def _kick_all(self, actors: list[str]) -> None:
        for actor in actors:
            if not self._kick(actor):
                with self._lock:
                    self._ticked.discard(actor)

    # ---- running --------------------------------------------------------------------------------------------

    def take(self, actor: str) -> list[tuple[Judgment, float]]:
        """Everything queued at an actor, now running there, each with its first wake's time (0: unknown)."""
        with self._lock:
            self._ticked.discard(actor)
            pending = self._pending.pop(actor, {})
            scope = self.scope
            for j in [j for j in pending if scope is not None and not scope(j)]:
                del self._queued[j]
                del pending[j]
            for j, since in pending.items():
                del self._queued[j]
                self._running[j] = _Run(actor, since, self._count)
            return list(pending.items())

    def claim(self, j: Judgment, actor: str) -> None:
        """Run a judgment now at an actor, out of turn (a host's `ComposeNode`); it leaves the queue if it waited."""
        with self._lock:
            since = 0.0
            queued_at = self._queued.pop(j, None)
            if queued_at is not None:
                since = self._pending[queued_at].pop(j)
            self._running[j] = _Run(actor, since, self._count)

    def done(self, j: Judgment, reads: Reads | None) -> None:
        """A run ended with what it read; None: it failed, and is queued again (its last read set stays).

        Queued again at once too when something it read changed after it began reading, or it was asked for again. A
        composition's run also gives the keys it judged their read sets (`_judged_within`).
        """
        kicks: list[str] = []
        with self._lock:
            run = self._running.pop(j, None)
            if reads is not None:
                self._index(j, reads.tokens)
                self._began[j] = reads.began
                if reads.judged and run is not None:
                    self._judged_within(j, run.actor, reads.judged, kicks)
            if run is None:
                return
            if reads is None or run.again or self._missed(j, reads):
                self._queue(j, run.actor, run.since, kicks)
            if not self._running:
                self._last.clear()
        self._kick_all(kicks)

    def _judged_within(self, j: Judgment, actor: str, judged: Mapping[str, Reads], kicks: list[str]) -> None:
        """Give the keys a composition `j` (run at `actor`) judged the read sets it kept for them, and drop or queue
        each key's judgment (rules/reads.py `judging`; the composition's writes all landed, actors/node.py).

        Each key keeps that read set, and is not judged again only to learn it. One queued meanwhile leaves the queue
        when nothing it read changed after it read it but by `j`'s own writes, which it read as written (its first
        wake is then not timed: the composition's writes were); one that missed a change is queued there. One
        running elsewhere keeps the read set its own run ends with.
        """
        for key, reads in judged.items():
            kj = (JUDGE, key)
            if kj in self._running:
                continue
            self._index(kj, reads.tokens)
            self._began[kj] = reads.began
            queued = self._queued.get(kj)
            if self._missed(j, reads):
                if queued is None:
                    self._queue(kj, actor, 0.0, kicks)
            elif queued is not None:
                del self._queued[kj]
                del self._pending[queued][kj]

    def _prune(self, count: int) -> None:
        """Forget the changes no run under way can have missed: those counted before the oldest began reading."""
        if count - self._pruned_at < 10_000:
            return
        self._pruned_at = count
        if not self._running:
            self._last.clear()
            return
        oldest = min(run.taken for run in self._running.values())
        for t in [t for t, (c, _) in self._last.items() if c <= oldest]:
            del self._last[t]

    def _missed(self, j: Judgment, reads: Reads) -> bool:
        """Whether another's change, counted after the run first read a token, touched it."""
        for t in reads.tokens:
            kept = self._last.get(t)
            if kept is not None and kept[0] > reads.read_at(t) and kept[1] != j:
                return True
        return False

    def release(self, actor: str) -> None:
        """An actor died: what it was running waits for it again, and its successor hears of it at its start."""
        with self._lock:
            self._ticked.discard(actor)
            lost = [(j, run) for j, run in self._running.items() if run.actor == actor]
            for j, run in lost:
                del self._running[j]
                self._queued[j] = actor
                self._pending.setdefault(actor, {})[j] = run.since

    def restarted(self, actor: str) -> None:
        """An actor (re)started: it hears of what waits for it."""
        kicks: list[str] = []
        with self._lock:
            if self._pending.get(actor) and actor not in self._ticked:
                self._ticked.add(actor)
                kicks.append(actor)
        self._kick_all(kicks)

    def _index(self, j: Judgment, reads: set[Token]) -> None:
        """Record the tokens a judgment's last run read, and add the judgment to each token's readers."""
        tokens = self._tokens
        kept = self._reads.get(j)
        added: Iterable[Token]
        if kept is None:
            # A judgment's first run (most of a start's): nothing to take out, nothing to compare.
            added = self._reads[j] = tuple([tokens.setdefault(t, t) for t in reads])
        else:
            new = frozenset([tokens.setdefault(t, t) for t in reads])
            old = frozenset(kept)
            if old == new:
                return
            self._reads[j] = tuple(new)
            self._unindex(j, old - new)
            added = new - old
        for t in added:
            readers = self._readers.get(t)
            if readers is None:
                self._readers[t] = j
            elif isinstance(readers, tuple):
                if readers != j:
                    self._readers[t] = [readers, j]
            elif isinstance(readers, set):
                readers.add(j)
            elif j not in readers:
                if len(readers) < _FEW:
                    readers.append(j)
                else:
                    self._readers[t] = {*readers, j}

    def _unindex(self, j: Judgment, gone: Iterable[Token]) -> None:
        """Take a judgment out of the readers of tokens its last run no longer read."""
        for t in gone:
            readers = self._readers.get(t)
            if readers == j:
                del self._readers[t]
                del self._tokens[t]
            elif isinstance(readers, set):
                readers.discard(j)
                if len(readers) == 1:
                    self._readers[t] = next(iter(readers))
            elif isinstance(readers, list) and j in readers:
                readers.remove(j)
                if len(readers) == 1:
                    self._readers[t] = next(iter(readers))

    # ---- the seat's own writes ------------------------------------------------------------------------------

    def writing(self, writers: Mapping[tuple[str, str], Judgment]) -> None:
        """Writes about to be made, each `(state, key)` by the judgment that made it, until `written`."""
        with self._lock:
            for sk, j in writers.items():
                self._writing.setdefault(sk, []).append(j)

    def written(self, writers: Mapping[tuple[str, str], Judgment]) -> None:
        """Writes made or given up."""
        with self._lock:
            for sk, j in writers.items():
                js = self._writing.get(sk)
                if js is not None:
                    js.remove(j)
                    if not js:
                        del self._writing[sk]

    def writers(self, state: str, key: str) -> list[Judgment]:
        """The judgments writing a key now."""
        with self._lock:
            return list(self._writing.get((state, key), ()))

    # ---- what waits -----------------------------------------------------------------------------------------

    def idle(self) -> bool:
        """Whether no judgment waits or runs."""
        with self._lock:
            return not self._queued and not self._running
