"""What every child of the supervisor shares: the seat it works in, death reporting, in-flight accounting.

pykka has no supervision (design.md, "Supervision"): an actor whose `on_receive` raises is simply gone. So each
child tells its supervisor when it stops, by a crash or by a stop nobody asked for, and counts the messages it has
not finished, so that `wait_settled` knows when every mailbox is empty and no write is in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import pykka

from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import ChildExited, Crash, Message, Rejudge, Tick
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.metrics import Metrics
from mesh_provisioner.rules.node import rejudge
from mesh_provisioner.rules.view import View

log = logging.getLogger("mesh_provisioner.actors")


class Applied(Protocol):
    """What applying a batch of writes did: how many landed, and the first that conflicted, if any."""

    @property
    def conflict(self) -> Write | None: ...

    @property
    def error(self) -> str: ...

    @property
    def done(self) -> list[tuple[Write, int]]: ...


class Seat(Protocol):
    """What the actors work with: the cache to read, the bus to write, the clock, and each other."""

    view: View
    metrics: Metrics

    def apply(self, writes: list[Write]) -> Applied:
        """Apply writes by compare-and-set, in order, stopping at the first conflict."""
        ...

    def refresh(self, write: Write) -> bool:
        """Read a conflicting key's current value from the bus into the cache; False when the bus did not answer."""
        ...

    def now(self) -> datetime:
        """The time to stamp writes with."""
        ...

    def publish(self, ask: r.Ask) -> None:
        """Publish an ask on the operator's channel, de-duplicated by its id."""
        ...

    def verify(self, warrant: r.Warrant | Mapping[str, Any]) -> str:
        """Why a warrant's signature is refused; "" when it holds or none is required."""
        ...

    def tell(self, name: str, message: Message) -> None:
        """Tell a child by name, counting the message as in flight."""
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


class SeatActor(pykka.ThreadingActor):
    """A child of the supervisor: it reports its death, can be killed as a crash, and resynchronises on start."""

    def __init__(self, name: str, seat: Seat, in_flight: InFlight, retries: int = 8) -> None:
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
            return self.handle(message)
        finally:
            self.in_flight.done(self.actor_urn)

    def handle(self, message: Any) -> Any:
        """What the actor does with one message."""
        raise NotImplementedError

    # ---- coalescing: many wakes before a tick are done by that one tick ------------------------------------

    ticking = False

    def tick(self) -> None:
        """Ask for one tick, unless one is already coming: whatever arrives before it is done by it."""
        if not self.ticking:
            self.ticking = True
            self.seat.tell(self.name, Tick())

    def rejudge_keys(self, keys: list[str], since: float = 0.0) -> None:
        """Judge keys again from their providers' outcomes, each written by compare-and-set.

        The keys are judged together and their writes made as one batch (one round trip to the bus, not one a
        key); a key whose write did not land (it conflicted, or failed) is judged again alone, as before.
        """
        if len(keys) <= 1:
            for key in keys:
                self._rejudge(key, since)
            return
        view, now = self.seat.view, self.seat.now()
        judged = [(key, rejudge(view, key, now)) for key in keys]
        writes = [w for _, j in judged for w in j.writes]
        if not writes:
            return
        applied = self.seat.apply(writes)
        landed = {(w.state, w.key) for w, _ in applied.done}
        for key, j in judged:
            if all((w.state, w.key) in landed for w in j.writes):
                if j.said:
                    log.info("%s", j.said)
            else:
                self._rejudge(key, since)
        if since and applied.done:
            self.seat.metrics.change_to_write.observe(time.monotonic() - since)

    def _rejudge(self, key: str, since: float) -> None:
        said: list[str] = []

        def judge() -> list[Write]:
            judged = rejudge(self.seat.view, key, self.seat.now())
            said[:] = [judged.said]
            return judged.writes

        why = self.write(judge, self.retries, since, Rejudge(frozenset({key})))
        if why:
            log.warning("%s is not judged again: %s", key, why)
        elif said and said[0]:
            log.info("%s", said[0])

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """A crash: the supervisor restarts the actor."""
        self._report(failed=True, why=str(exception_value))

    def on_stop(self) -> None:
        """A stop: the supervisor restarts the actor unless it asked for the stop itself."""
        self._report(failed=False, why="stopped by no one's request")

    def _report(self, *, failed: bool, why: str) -> None:
        if not self.reported:
            self.reported = True
            self.seat.exited(ChildExited(self.name, self.actor_urn, failed=failed, why=why))

    def write(self, judge: Callable[[], list[Write]], retries: int, since: float = 0.0,
              again: Message | None = None, written: set[tuple[str, str, int]] | None = None) -> str:
        """Judge and apply writes by compare-and-set; on a conflict read the key again and judge again.

        Answers "" once the writes landed (or there were none), else why they did not: never a blind put. `since`
        is when the change that asked for this judgement reached the cache, for the change-to-write histogram.
        A write that failed for another reason than a conflict (the bus out of reach, say) is not lost: `again`,
        the message that redoes this work, comes back after a backoff (design.md, property 3). Each write that
        landed is added to `written`, when given, as (state, key, revision).
        """
        why = ""
        for _ in range(retries + 1):
            writes = judge()
            if not writes:
                self.failures = 0
                return ""
            applied = self.seat.apply(writes)
            if written is not None:
                written.update((w.state, w.key, revision) for w, revision in applied.done)
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
        return f"{why}, {retries + 1} times; it is judged again at its next change"

    def _again_later(self, again: Message | None, why: str) -> str:
        """Have `again`, the message that redoes a piece of work the bus failed, come back after a backoff."""
        if again is not None:
            self.failures += 1
            self.seat.retry(self.name, again, self.failures)
        return why


def earliest(a: float, b: float) -> float:
    """The earlier of two change times, where 0 means none."""
    return min(a, b) if a and b else a or b
