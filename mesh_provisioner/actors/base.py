"""What every child of the supervisor shares: the seat it works in, death reporting, in-flight accounting, and
running the judgments the dispatcher queued for it.

pykka has no supervision (design.md, "Supervision"): an actor whose `on_receive` raises is simply gone. So each
child tells its supervisor when it stops, by a crash or by a stop nobody asked for, and counts the messages it has
not finished, so that `wait_settled` knows when every mailbox is empty and no write is in flight.

An actor does no coalescing of its own: at each `Tick` it takes every judgment the dispatcher queued for it
(actors/dispatch.py), runs each over a view that records what it read, and hands the read set back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Protocol

import pykka

from mesh_provisioner.actors.dispatch import COMPOSE, JUDGE, LOOK, Dispatcher, Judgment
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import ChildExited, Crash, Message, Resync, Tick, Wake
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.metrics import Metrics
from mesh_provisioner.rules.node import rejudge
from mesh_provisioner.rules.reads import Reads
from mesh_provisioner.rules.view import View

log = logging.getLogger("mesh_provisioner.actors")

# Keys judged and written together at most. A provider with thousands of consumers (one mail relay for a whole mesh)
# changes all of their keys at once; written as one batch, they held every other change's writes behind theirs on the
# connection. Each batch is a round trip the actor waits for, and waits again for the interpreter after it: batches
# of 64 made such a change wait seconds behind busy compositions. At 256 the other changes' p99 at half saturation fell
# from 94 to 26 ms (one key) and from 150 to 41 ms (2 to 65 keys); the 1,860-key change's rose from 189 to 299 ms
# (docs/BENCHMARKS.md, 21).
BATCH: Final = 256


class WriteResult(Protocol):
    """What applying a batch of writes did: how many landed, and the first that conflicted, if any."""

    @property
    def conflict(self) -> Write | None: ...

    @property
    def error(self) -> str: ...

    @property
    def done(self) -> list[tuple[Write, int]]: ...


class Workplace(Protocol):
    """What the actors work with: the cache to read, the bus to write, the clock, and each other."""

    view: View
    metrics: Metrics
    dispatcher: Dispatcher
    writes_on: Callable[[str], bool] | None
    """The nodes whose keys this seat writes (a partitioned seat's shards, contract 8.1); None: every node's."""

    def apply(self, writes: list[Write], writers: Mapping[tuple[str, str], Judgment]) -> WriteResult:
        """Apply writes by compare-and-set, in order, stopping at the first conflict; `writers` names the judgment
        that made each, which its own write does not wake."""
        ...

    def refresh(self, write: Write) -> bool:
        """Read a conflicting key's current value from the bus into the cache; False when the bus did not answer."""
        ...

    def now(self) -> datetime:
        """The time to stamp writes with."""
        ...

    def reads(self) -> Reads:
        """A view over the cache that records what a judgment reads from it, from now on."""
        ...

    def publish(self, ask: r.Ask) -> bool:
        """Publish an ask on the operator's channel, de-duplicated by its id; whether it is out for the first time."""
        ...

    def verify(self, warrant: r.Warrant | Mapping[str, Any]) -> str:
        """Why a warrant's signature is refused; "" when it holds or none is required."""
        ...

    def tell(self, name: str, message: Message) -> bool:
        """Tell a child by name, counting the message as in flight; False when it cannot hear it now."""
        ...

    def exited(self, message: ChildExited) -> None:
        """Tell the supervisor a child stopped."""
        ...

    def killed(self, urn: str) -> bool:
        """Whether an actor instance was killed through the chaos API."""
        ...

    def retry(self, name: str, message: Message, attempt: int) -> None:
        """Tell a child a message again after a backoff that grows with the attempt, counted in flight meanwhile."""
        ...


class ActorKilled(RuntimeError):
    """The chaos API killed this actor."""


def stop_actor(ref: pykka.ActorRef[Any], timeout: float) -> None:
    """Stop an actor and wait, `timeout` seconds at most, until it has: once this returns it is out of pykka's
    registry, so a seat stopped leaves no actor of its own behind in its host's (design.md, "Supervision"). One
    stopped already is not an error (pykka answers False). Never called on the actor's own thread, where it would
    wait the whole timeout."""
    try:
        ref.stop(block=True, timeout=timeout)
    except pykka.Timeout:
        log.warning("%s did not stop within %g s: it stops once it has handled what it was sent before", ref, timeout)


class InFlight:
    """Messages told to each child instance and not yet handled, by the instance's urn.

    An instance forgotten (it is gone) counts nothing more: a message told to it after that is lost with its
    mailbox, and its successor's resynchronisation recovers it. So a teller needs no lock of its own to order its
    count against the instance's death.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._forgotten: set[str] = set()
        self._idle = threading.Condition(self._lock)

    def sent(self, urn: str) -> None:
        """One more message for an instance (none for one forgotten)."""
        with self._lock:
            if urn not in self._forgotten:
                self._counts[urn] = self._counts.get(urn, 0) + 1

    def done(self, urn: str) -> None:
        """An instance finished one message."""
        with self._lock:
            count = self._counts.get(urn, 0) - 1
            if count > 0:
                self._counts[urn] = count
                return
            self._counts.pop(urn, None)
            if not self._counts:
                self._idle.notify_all()  # only an empty count is waited for

    def forget(self, urn: str) -> None:
        """An instance is gone: what was in its mailbox is recovered by its successor's resynchronisation."""
        with self._lock:
            self._forgotten.add(urn)
            self._counts.pop(urn, None)
            if not self._counts:
                self._idle.notify_all()

    def total(self) -> int:
        """Every message told and not yet handled."""
        with self._lock:
            return sum(self._counts.values())

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight, at most timeout seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._counts, timeout)


Judge = Callable[[], tuple[list[Write], Mapping[tuple[str, str], Judgment]]]
"""One run of a judgment: its writes, and the judgment that made each."""


class SeatActor(pykka.ThreadingActor):
    """A child of the supervisor: it reports its death, can be killed as a crash, resynchronises on start, and runs
    the judgments queued for it."""

    def __init__(self, name: str, seat: Workplace, in_flight: InFlight, retries: int = 8) -> None:
        super().__init__()
        self.name = name
        self.retries = retries
        self.seat = seat
        self.in_flight = in_flight
        self.reported = False
        self.failures = 0  # writes failed in a row, for the backoff of their retry

    def on_receive(self, message: Any) -> Any:
        """Handle one message; a killed actor dies at its next message, as a crash would, its mailbox lost."""
        try:
            if self.seat.killed(self.actor_urn) or isinstance(message, Crash):
                self._report(failed=True, why="killed")
                # An asked message's exception goes back to the asker and leaves the actor alive: stop it here.
                pykka.ActorRegistry.unregister(self.actor_ref)
                self.actor_stopped.set()
                raise ActorKilled(f"{self.name} was killed")
            if isinstance(message, Tick):
                self.run(self.seat.dispatcher.take(self.name))
                return None
            if isinstance(message, Resync):
                # Design.md: a (re)started actor judges all it owns from the bus, never from memory.
                self.seat.dispatcher.add(self.owned(), self.name)
                return None
            if isinstance(message, Wake):
                self.seat.dispatcher.add(message.judgments, self.name)
                return None
            return self.handle(message)
        finally:
            self.in_flight.done(self.actor_urn)

    def handle(self, message: Any) -> Any:
        """What the actor does with any other message (none by default)."""
        return None

    def owned(self) -> list[Judgment]:
        """Every judgment this actor runs again when it (re)starts."""
        raise NotImplementedError

    def run(self, items: list[tuple[Judgment, float]]) -> None:
        """Run judgments taken from the queue: compositions first, so that the keys they write are judged after."""
        by_kind: dict[str, list[tuple[Judgment, float]]] = {COMPOSE: [], JUDGE: [], LOOK: []}
        for item in items:
            by_kind[item[0][0]].append(item)
        for (_, node), since in by_kind[COMPOSE]:
            self.compose(node, since)
        self.judge_keys(by_kind[JUDGE])
        for (_, key), _since in by_kind[LOOK]:
            self.look(key)

    def compose(self, node: str, since: float = 0.0) -> r.Composed:
        """Compose a node (node actors only)."""
        raise NotImplementedError(f"{self.name} composes no node")

    def look(self, key: str) -> None:
        """Look at a retiring key's ask (the asker only)."""
        raise NotImplementedError(f"{self.name} looks at no ask")

    def judge_keys(self, items: list[tuple[Judgment, float]]) -> None:
        """Judge keys again from their providers' outcomes, each written by compare-and-set (contract 5.3).

        The keys are judged together and their writes made in batches of `BATCH` keys (a round trip to the bus for
        each batch, not for each key); a key alone, and a key whose write did not land (it conflicted, or failed),
        is judged alone, its write tried again on a conflict.
        """
        for i in range(0, len(items), BATCH):
            self._judge_batch(items[i:i + BATCH])

    def _judge_batch(self, items: list[tuple[Judgment, float]]) -> None:
        """Judge some keys and write what they judged as one batch; a run whose writes did not all land again alone."""
        if len(items) == 1:
            self._judge_alone(*items[0])
            return
        dispatcher = self.seat.dispatcher
        now = self.seat.now()
        runs = []
        writes: list[Write] = []
        writers: dict[tuple[str, str], Judgment] = {}
        for j, since in items:
            reads = self.seat.reads()
            judged = rejudge(reads, j[1], now, self.seat.writes_on)
            runs.append((j, since, reads, judged))
            for w in judged.writes:
                writes.append(w)
                writers[(w.state, w.key)] = j
        applied = self.seat.apply(writes, writers) if writes else None
        landed = {(w.state, w.key) for w, _ in applied.done} if applied is not None else set()
        for j, since, reads, judged in runs:
            if all((w.state, w.key) in landed for w in judged.writes):
                dispatcher.done(j, reads)
                if judged.said:
                    log.info("%s", judged.said)
                if since and judged.writes:
                    self.seat.metrics.change_to_write.observe(time.monotonic() - since)
            else:
                self._judge_alone(j, since)

    def _judge_alone(self, j: Judgment, since: float) -> None:
        key = j[1]
        last: list[Any] = []

        def judge() -> tuple[list[Write], Mapping[tuple[str, str], Judgment]]:
            reads = self.seat.reads()
            judged = rejudge(reads, key, self.seat.now(), self.seat.writes_on)
            last[:] = [reads, judged.said]
            return judged.writes, {(w.state, w.key): j for w in judged.writes}

        why = self.write(judge, since, [j])
        self.seat.dispatcher.done(j, last[0])
        if why:
            log.warning("%s is not judged again: %s", key, why)
        elif last[1]:
            log.info("%s", last[1])

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """A crash: the supervisor restarts the actor."""
        self._report(failed=True, why=str(exception_value))

    def on_stop(self) -> None:
        """A stop: the supervisor restarts the actor unless it asked for the stop itself."""
        self._report(failed=False, why="stopped by no one's request")

    def _report(self, *, failed: bool, why: str) -> None:
        if not self.reported:
            self.reported = True
            self.seat.dispatcher.release(self.name)
            self.seat.exited(ChildExited(self.name, self.actor_urn, failed=failed, why=why))

    def write(self, judge: Judge, since: float = 0.0, again: list[Judgment] | None = None) -> str:
        """Judge and apply writes by compare-and-set; on a conflict read the key again and judge again.

        Answers "" once the writes landed (or there were none), else why they did not: never a blind put. `since`
        is when the change that asked for this judgement reached the cache, for the change-to-write histogram.
        A write that failed for another reason than a conflict (the bus out of reach, say) is not lost: `again`,
        the judgments that redo this work, are queued again after a backoff (design.md, property 3).
        """
        why = ""
        for _ in range(self.retries + 1):
            writes, writers = judge()
            if not writes:
                self.failures = 0
                return ""
            applied = self.seat.apply(writes, writers)
            if applied.conflict is None and not applied.error:
                self.failures = 0
                if since:
                    self.seat.metrics.change_to_write.observe(time.monotonic() - since)
                return ""
            if applied.conflict is None:
                return self._again_later(again, applied.error)
            why = f"{applied.conflict.key} changed while it was judged"
            if not self.seat.refresh(applied.conflict):
                # Judged again from what memory holds, it would conflict again: done again later, as a failed write.
                return self._again_later(again, f"{why}, and could not be read again")
        return f"{why}, {self.retries + 1} times; it is judged again at its next change"

    def _again_later(self, again: list[Judgment] | None, why: str) -> str:
        """Have the judgments that redo a piece of work the bus failed queued again after a backoff."""
        if again:
            self.failures += 1
            self.seat.retry(self.name, Wake(tuple(again)), self.failures)
        return why
