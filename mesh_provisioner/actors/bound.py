"""BoundActor: one per BoundReads provider; judges again each key its provider's entries change.

It owns nothing: the keys it judges are the nodes', and it writes them by compare-and-set (design.md). On start it
judges every key its provider provides or has an entry for that is a provision, so a restarted one recovers whatever
its dead predecessor's queue held.
"""

from __future__ import annotations

from mesh_provisioner.actors.base import InFlight, SeatActor, Workplace
from mesh_provisioner.actors.dispatch import JUDGE, Judgment
from mesh_provisioner.contract import PROVISIONS, bound


class BoundActor(SeatActor):
    """Judges again the keys a provider's `bound` entries speak of."""

    def __init__(self, provider: str, seat: Workplace, in_flight: InFlight, *, retries: int = 8) -> None:
        super().__init__(f"bound:{provider}", seat, in_flight, retries)
        self.provider = provider

    def owned(self) -> list[Judgment]:
        """Every key the provider provides, or has an entry for that is a provision.

        An entry for a key no composition made yet is left alone: that key's judgment would find no provision and
        write nothing (5.3), and the composition that makes the key starts its judgment (actors/routing.py). At a
        first start nearly every entry is such a key (docs/BENCHMARKS.md, 20). So is, in a partitioned seat, a shared
        credential that only another process's keys depend on, which its judgment makes (contract 8.1, rules/node.py
        `shared_credential`): its node's actor judges it again (actors/node.py `owned`).
        """
        view = self.seat.view
        entries = [key for key in view.keys(bound(self.provider)) if view.get(PROVISIONS, key) is not None]
        keys = set(entries) | view.provided_by_module(self.provider)
        return [(JUDGE, key) for key in sorted(keys)]
