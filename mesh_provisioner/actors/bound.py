"""BoundActor: one per BoundReads provider; judges again each key its provider's entries change.

It owns nothing: the keys it judges are the nodes', and it writes them by compare-and-set (design.md). On start it
judges all of them, so a restarted one recovers whatever its dead predecessor's queue held.
"""

from __future__ import annotations

from mesh_provisioner.actors.base import InFlight, SeatActor, Workplace
from mesh_provisioner.actors.dispatch import JUDGE, Judgment
from mesh_provisioner.contract import bound


class BoundActor(SeatActor):
    """Judges again the keys a provider's `bound` entries speak of."""

    def __init__(self, provider: str, seat: Workplace, in_flight: InFlight, *, retries: int = 8) -> None:
        super().__init__(f"bound:{provider}", seat, in_flight, retries)
        self.provider = provider

    def owned(self) -> list[Judgment]:
        """Every key the provider has an entry for or provides."""
        view = self.seat.view
        keys = set(view.keys(bound(self.provider))) | view.provided_by_module(self.provider)
        return [(JUDGE, key) for key in sorted(keys)]
