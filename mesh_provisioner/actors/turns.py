"""Turns: the bound on compositions at once (`Config.max_parallel`), given in an order rather than to whoever wakes
first.

When every node is composed at once (a start, a reconnect), the nodes whose providers' plans others read go first
(rules/order.py), so that fewer consumers compose before the plan they depend on is written and compose again.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    """At most `n` holders at once; of those waiting, the lowest priority goes first, then the earliest."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._busy = 0
        self._waiting: list[tuple[tuple[int, int], int]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()

    @contextmanager
    def turn(self, priority: tuple[int, int]) -> Iterator[None]:
        """Hold one of the `n` turns for the block, waiting for it behind every lower priority."""
        with self._cond:
            me = (priority, next(self._seq))
            heapq.heappush(self._waiting, me)
            self._cond.wait_for(lambda: self._busy < self._n and self._waiting[0] == me)
            heapq.heappop(self._waiting)
            self._busy += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def waiting(self) -> int:
        """How many wait for a turn now."""
        with self._cond:
            return len(self._waiting)
