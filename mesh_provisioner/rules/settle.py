"""Settling a view: compose every node and judge every key, applying each write to the view, until none is left.

This is the seat's fixed point (contract section 6) computed in memory: what `reconcile --dry-run` says it would
write, and what a test compares a running seat with.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put, Write
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import known_nodes


class Settled(msgspec.Struct):
    """The writes that brought a view to its fixed point, each node's reports, and the rounds it took."""

    writes: list[Write]
    composed: list[r.Composed]
    rounds: int
    settled: bool


def apply(view: MemoryView, writes: list[Write]) -> None:
    """Apply writes to a view as the bus would, each at the next revision."""
    for w in writes:
        revision = view.last_revision + 1
        if isinstance(w, Put):
            view.put(w.state, w.key, w.value, revision)
        else:
            view.delete(w.state, w.key)
            view.last_revision = revision


def settle(view: MemoryView, now: datetime, max_rounds: int = 50) -> Settled:
    """Compose every node and judge every key of a view until a round writes nothing; the view is changed."""
    out = Settled([], [], 0, False)
    while out.rounds < max_rounds:
        out.rounds += 1
        wrote = 0
        for node in sorted(known_nodes(view)):
            result = compose_node(view, node, now)
            apply(view, result.writes)
            wrote += len(result.writes)
            out.writes += result.writes
            if result.composed:
                out.composed.append(result.composed)
        for key in sorted(view.keys(PROVISIONS)):
            judged = rejudge(view, key, now)
            apply(view, judged.writes)
            wrote += len(judged.writes)
            out.writes += judged.writes
        if wrote == 0:
            out.settled = True
            break
    return out
