"""AskerActor: the one voice on the operator's channel (contract 5.4).

It publishes each retiring key's ask, made again from the key alone, with `Nats-Msg-Id` set to the ask id, so a
publish repeated after a crash is the same message and JetStream keeps one (design.md, property 4). It reads the
router's record of each retiring key's ask when a decided notice comes, and at start, and writes the warrant.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mesh_provisioner.actors.base import InFlight, SeatActor, Workplace
from mesh_provisioner.actors.dispatch import LOOK, Judgment
from mesh_provisioner.contract import ASK_RECORDS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import Decided
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules.retire import decide, outgoing, retiring_keys
from mesh_provisioner.rules.view import View
from mesh_provisioner.rules.writing import provision_of

log = logging.getLogger("mesh_provisioner.actors.asker")


class AskerActor(SeatActor):
    """Raises asks and takes their answers, one key at a time."""

    def __init__(self, seat: Workplace, in_flight: InFlight, *, retries: int = 8) -> None:
        super().__init__("asker", seat, in_flight, retries)
        self.published: set[str] = set()
        self.asks_raised = 0
        self.decided = 0

    def handle(self, message: Any) -> Any:
        """A decided notice, or the router's stream created: look at every retiring key again."""
        if isinstance(message, Decided):
            self.seat.dispatcher.add(self.owned(), self.name)
        return None

    def owned(self) -> list[Judgment]:
        """Every retiring key's look."""
        return [(LOOK, key) for key in sorted(retiring_keys(self.seat.view))]

    def look(self, key: str) -> None:
        """Look at a retiring key's ask, recording what it read, so that its record's arrival wakes it."""
        reads = self.seat.reads()
        try:
            self._look(key, reads)
        finally:
            self.seat.dispatcher.done((LOOK, key), reads)

    def _look(self, key: str, view: View) -> None:
        """Publish a retiring key's ask unless the router holds it; take its answer once it is decided.

        An ask is checked just before it goes out: one dead before it did (its expiry passed) is replaced in the key
        by a new one, as is one whose answer ended with no choice (5.4); the look runs again once its write is made,
        and the new ask goes out then (its own write wakes no judgment that made it: actors/dispatch.py).
        """
        p, _ = provision_of(view, key)
        if p is None or p.state != r.RETIRING or not p.ask or p.warrant is not None:
            return
        said: list[str] = []
        made: list[Write] = []  # the writes of the last try
        j: Judgment = (LOOK, key)
        answered = view.get(ASK_RECORDS, p.ask) is not None
        if not answered:
            if p.ask in self.published:
                return
            out = outgoing(view, key, self.seat.now())
            if out.ask is not None:
                self._publish(key, out.ask)
                return
            if not out.writes:
                if out.said:
                    log.warning("%s", out.said)
                return

            def judge() -> tuple[list[Write], Mapping[tuple[str, str], Judgment]]:
                again = outgoing(view, key, self.seat.now())
                said[:] = [again.said]
                writes = again.writes if again.ask is None else []
                made[:] = writes
                return writes, {(w.state, w.key): j for w in writes}

        else:

            def judge() -> tuple[list[Write], Mapping[tuple[str, str], Judgment]]:
                decided = decide(view, key, self.seat.now(), self.seat.verify)
                said[:] = [decided.said]
                made[:] = decided.writes
                return decided.writes, {(w.state, w.key): j for w in decided.writes}

        why = self.write(judge, 0.0, [j])
        if not why and made:
            self.seat.dispatcher.add([j], self.name)  # what it wrote is looked at next: a new ask goes out
        if why:
            log.warning("the %s of %s is not written: %s", "answer" if answered else "new ask", key, why)
        elif said and said[0]:
            if answered:
                self.decided += 1
                self.seat.metrics.asks_decided.inc()
            log.info("%s", said[0])

    def _publish(self, key: str, ask: r.Ask) -> None:
        try:
            first = self.seat.publish(ask)
        except Exception as err:  # the channel may be down or have no router yet: asked again at the next look
            log.warning("the retiring ask of %s is not published: %s", key, err)
            return
        self.published.add(ask.id)
        if not first:
            # Raised before, by this process or the seat's last holder (5.4: its id de-duplicates it): not again.
            log.debug("the ask to retire %s (%s) was out already", key, ask.id)
            return
        self.asks_raised += 1
        self.seat.metrics.asks_raised.inc()
        log.info("asked the operator to retire %s (%s)", key, ask.id)
