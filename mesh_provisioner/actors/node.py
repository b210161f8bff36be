"""NodeActor: one per node; composes its node, serially, and judges the keys the dispatcher queued for it.

A node is never composed twice at once: only its own actor composes it, and the dispatcher (actors/dispatch.py)
keeps one entry per judgment, so ten changes arriving while it composes give one more composition, not ten, and a
change the composition read while it ran is never lost (design.md, "Coalescing").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from mesh_provisioner.actors.base import InFlight, SeatActor, Workplace
from mesh_provisioner.actors.dispatch import COMPOSE, JUDGE, Judgment
from mesh_provisioner.actors.turns import Turns
from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import ComposeNode
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules.keys import node_of
from mesh_provisioner.rules.node import compose_node
from mesh_provisioner.rules.reads import Reads
from mesh_provisioner.rules.view import View
from mesh_provisioner.rules.writing import provision_of

log = logging.getLogger("mesh_provisioner.actors.node")


class NodeActor(SeatActor):
    """Composes one node and judges keys again, one thing at a time."""

    def __init__(
        self,
        node: str,
        seat: Workplace,
        in_flight: InFlight,
        *,
        retries: int = 8,
        turns: Turns | None = None,
        priority: int = 0,
    ) -> None:
        super().__init__(f"node:{node}", seat, in_flight, retries)
        self.node = node
        self.turns = turns
        self.priority = priority  # its place in the order nodes compose in when all wait (rules/order.py)
        self.compositions = 0

    def handle(self, message: Any) -> Any:
        """A host's `ComposeNode`: compose now, out of turn, and answer what the composition did."""
        if isinstance(message, ComposeNode):
            self.seat.dispatcher.claim((COMPOSE, self.node), self.name)
            return self.compose(self.node)
        return None

    def owned(self) -> list[Judgment]:
        """The node's composition, and every key of the node or provided from it (design.md, property 3).

        A composition leaves a held module's keys as they are (5.2), yet their state still follows their provider
        (5.3); and keys of other nodes are judged here too (those a provider on this node changes). After a
        restart, a judgment lost with what was queued would otherwise wait for its next change.
        """
        view = self.seat.view
        provided = view.provided_on(self.node)
        keys = set(view.keys(PROVISIONS, self.node)) | provided
        if self.seat.writes_on is not None:
            # A shared credential of this node that only keys of nodes another process writes depend on may not exist
            # yet: this node's writer makes it (contract 8.1, rules/node.py `shared_credential`).
            keys |= {d for u in provided for d in _depends_on(view, u)[:2] if node_of(d) == self.node}
        return [(COMPOSE, self.node), *((JUDGE, key) for key in sorted(keys))]

    def compose(self, node: str, since: float = 0.0) -> r.Composed:
        """Compose the node now, writing by compare-and-set; answers what the composition did."""
        j: Judgment = (COMPOSE, node)
        last: list[Any] = []

        def judge() -> tuple[list[Write], Mapping[tuple[str, str], Judgment]]:
            reads = self.seat.reads()
            done = compose_node(reads, node, self.seat.now(), self.seat.writes_on)
            last[:] = [reads, done.composed]
            return done.writes, {(w.state, w.key): j for w in done.writes}

        try:
            # A node composed again waits behind every node not composed yet: what woke it (a consumer's key
            # depending on it, say) may wake it again as those compose, and one composition then does for all.
            turn = (self.compositions, self.priority)
            with self.turns.turn(turn) if self.turns is not None else contextlib.nullcontext():
                why = self.write(judge, since, [j])
        except BaseException:
            self.seat.dispatcher.done(j, None)  # failed: queued again, its change not lost
            raise
        reads: Reads = last[0]
        if why:
            # Not all its writes landed: a key it judged may not say what it judged. The key's own judgment, if it
            # waits, runs (the read sets kept from the composition would take it out of the queue, actors/dispatch.py).
            reads.judged.clear()
        self.seat.dispatcher.done(j, reads)
        self.compositions += 1
        self.seat.metrics.compositions.inc()
        composed: r.Composed = last[1]
        if why:
            composed.problems.append(f"the composition of {node} is not all written: {why}")
        if composed and log.isEnabledFor(logging.INFO):  # encoded only for a log that is kept
            log.info("composed %s: %s", node, r.encode(composed).decode())
        return composed


def _depends_on(view: View, key: str) -> tuple[str, ...]:
    """What a provision key depends on, as the bus says; nothing when it does not decode."""
    p, _ = provision_of(view, key)
    return p.depends_on if p is not None else ()
