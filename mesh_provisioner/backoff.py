"""The one backoff of the seat: a wait that doubles with each attempt, from a first to a most (design.md,
"Supervision": restarts, and the retries of writes the bus failed)."""

from __future__ import annotations


def backoff(attempt: int, first: float, most: float) -> float:
    """The wait before attempt `attempt` (1 for the first retry): `first`, doubling, never more than `most`."""
    return min(first * (1 << max(attempt - 1, 0)), most)
