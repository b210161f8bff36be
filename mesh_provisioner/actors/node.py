"""NodeActor: one per node; composes its node serially, coalescing changes, and owns the node's keys.

As a workqueue of controller-runtime: a node is never composed twice at once (one actor, one thread), and ten
changes arriving while it composes give one more composition, not ten; none is lost, since a change arriving
during a composition always causes another (design.md, "Coalescing"). Two wakes compose nothing, since composing
again for them would write nothing:

- a change the composition wrote itself, which wakes its node too (contract section 6: a key's depends-on names its
  node's own credentials; a plan wakes the node consuming it): a composition judges each key after the writes it
  made before it (`Overlay`), and its node's own keys are not among those "another node's provision depends on"
  (`View.depended_on`). A cold start of 1,000 nodes made 10,000 such wakes;
- a change the last composition, all written, had already read: one the cache held before that composition began
  (the wake is routed once the cache holds the change, and stamped then), and that reached the mailbox behind the
  tick that composed. In the same cold start each provider's new plan woke its consumers, most of which had composed
  after it was written: 2,300 compositions that wrote nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from mesh_provisioner.actors.base import InFlight, Seat, SeatActor, earliest
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import Changed, ComposeNode, Look, Rejudge, Resync, Tick
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules.node import compose_node
from mesh_provisioner.rules.view import PROVISIONS

log = logging.getLogger("mesh_provisioner.actors.node")


class NodeActor(SeatActor):
    """Composes one node and judges its keys again, one thing at a time."""

    def __init__(
        self,
        node: str,
        seat: Seat,
        in_flight: InFlight,
        *,
        retries: int = 8,
        parallel: threading.Semaphore | None = None,
    ) -> None:
        super().__init__(f"node:{node}", seat, in_flight, retries)
        self.node = node
        self.parallel = parallel
        self.dirty = False
        self.keys: set[str] = set()
        self.compositions = 0
        # What this node's last composition wrote, each (state, key, revision): every wake one of them causes is
        # routed while the write is made (the cache applies it before the store answers), so it is in the mailbox
        # before the composition ends, and is read before the next one begins.
        self.written: set[tuple[str, str, int]] = set()
        # When the last composition that was all written began to read the cache (monotonic seconds; 0: none).
        self.composed_at = 0.0
        # The earliest change each pending piece of work answers (monotonic seconds; 0: none, or unknown).
        self.changed_since = 0.0
        self.keys_since = 0.0

    def handle(self, message: Any) -> Any:
        """Coalesce changes into one tick; compose on the tick or when asked."""
        if isinstance(message, Tick):
            self.ticking = False
            if self.dirty:
                self.compose()
            self._rejudge_pending()
        elif isinstance(message, Changed | Resync):
            if isinstance(message, Changed) and self._composed_already(message):
                return None
            self.dirty = True
            self.changed_since = earliest(self.changed_since, getattr(message, "at", 0.0))
            if isinstance(message, Resync):
                self._every_key()
            self.tick()
        elif isinstance(message, Rejudge):
            self.keys |= message.keys
            self.keys_since = earliest(self.keys_since, message.at)
            self.tick()
        elif isinstance(message, ComposeNode):
            try:
                composed = self.compose()
                self._rejudge_pending()
            except Exception:
                # The asker hears the error, and pykka keeps an actor whose asked message failed alive: what was
                # pending (a change coalesced into this composition, keys to judge) is done again from the bus at
                # the next tick, as after a restart; a failure there is a crash the supervisor restarts.
                self.dirty = True
                self._every_key()
                self.tick()
                raise
            return composed
        return None

    def _composed_already(self, changed: Changed) -> bool:
        """Whether the last composition wrote this change, or had read it (module docstring)."""
        if (changed.state, changed.key, changed.revision) in self.written:
            return True
        return 0.0 < changed.at < self.composed_at

    def _every_key(self) -> None:
        """Judge at the next tick, from the bus, every key of the node and every key a module of the node provides
        (design.md, property 3).

        A composition leaves a held module's keys as they are (5.2), yet their state still follows their provider
        (5.3). And this actor is told to judge keys of other nodes: those a provider's have or want on this node
        changes, as the bound actors do theirs, and those depending on a key of this node whose state changed
        (`Woken.judged_on`), which are keys its modules provide too (their depends-on names their provider's shared
        credential or own needs, 5.2). After a restart, or a failure, a judgement lost with what was pending would
        otherwise never be made.
        """
        view = self.seat.view
        self.keys |= set(view.keys(PROVISIONS, self.node)) | view.provided_on(self.node)

    def compose(self) -> r.Composed:
        """Compose the node now, writing by compare-and-set; answers what the composition did."""
        self.dirty = False
        since, self.changed_since = self.changed_since, 0.0
        result: list[r.Composed] = []
        self.written.clear()

        def judge() -> list[Write]:
            done = compose_node(self.seat.view, self.node, self.seat.now())
            result[:] = [done.composed]
            return done.writes

        with self.parallel if self.parallel is not None else contextlib.nullcontext():
            began = time.monotonic()  # before the rule reads the cache: a change stamped earlier is in what it reads
            why = self.write(judge, self.retries, since, Changed(), self.written)
        self.compositions += 1
        self.seat.metrics.compositions.inc()
        composed = result[0]
        self.composed_at = 0.0 if why else began
        if why:
            composed.problems.append(f"the composition of {self.node} is not all written: {why}")
        if composed and log.isEnabledFor(logging.INFO):  # encoded only for a log that is kept
            log.info("composed %s: %s", self.node, r.encode(composed).decode())
        if composed.retiring_asked:
            self.seat.tell("asker", Look(frozenset(composed.retiring_asked)))
        return composed

    def _rejudge_pending(self) -> None:
        keys, self.keys = sorted(self.keys), set()
        since, self.keys_since = self.keys_since, 0.0
        self.rejudge_keys(keys, since)
