"""BoundActor: one per BoundReads provider; judges again each key its provider's entries change.

It owns nothing: the keys it judges are the nodes', and it writes them by compare-and-set (design.md). On start it
judges all of them, so a restarted one recovers whatever its dead predecessor's mailbox held.
"""

from __future__ import annotations

from typing import Any

from mesh_provisioner.actors.base import InFlight, Seat, SeatActor, earliest
from mesh_provisioner.messages.protocol import Rejudge, Resync, Tick
from mesh_provisioner.rules.view import bound


class BoundActor(SeatActor):
    """Judges again the keys a provider's `bound` entries speak of."""

    def __init__(self, provider: str, seat: Seat, in_flight: InFlight, *, retries: int = 8) -> None:
        super().__init__(f"bound:{provider}", seat, in_flight, retries)
        self.provider = provider
        self.keys: set[str] = set()
        self.since = 0.0

    def handle(self, message: Any) -> Any:
        """Gather keys until the tick, then judge each once."""
        if isinstance(message, Rejudge):
            self.keys |= message.keys
            self.since = earliest(self.since, message.at)
            self.tick()
        elif isinstance(message, Resync):
            view = self.seat.view
            self.keys |= set(view.keys(bound(self.provider))) | view.provided_by_module(self.provider)
            self.tick()
        elif isinstance(message, Tick):
            self.ticking = False
            keys, self.keys = sorted(self.keys), set()
            since, self.since = self.since, 0.0
            self.rejudge_keys(keys, since)
        return None
