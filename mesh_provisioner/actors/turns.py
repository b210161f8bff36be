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
    """At most `n` holders at once; of those waiting, the lowest priority goes first, then the earliest.

    A turn given back goes straight to the first waiter, woken alone: a thousand nodes waiting at a start would
    otherwise all wake at every turn given back, to find it is not theirs.
    """

    def __init__(self, n: int) -> None:
        self._n = n
        self._busy = 0
        self._waiting: list[tuple[tuple[int, int], int, threading.Event]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    @contextmanager
    def turn(self, priority: tuple[int, int]) -> Iterator[None]:
        """Hold one of the `n` turns for the block, waiting for it behind every lower priority."""
        with self._lock:
            mine: threading.Event | None = None
            if self._busy < self._n and not self._waiting:
                self._busy += 1
            else:
                mine = threading.Event()
                heapq.heappush(self._waiting, (priority, next(self._seq), mine))
        if mine is not None:
            mine.wait()  # the turn is handed over, already counted
        try:
            yield
        finally:
            with self._lock:
                if self._waiting:
                    heapq.heappop(self._waiting)[2].set()
                else:
                    self._busy -= 1

    def waiting(self) -> int:
        """How many wait for a turn now."""
        with self._lock:
            return len(self._waiting)
