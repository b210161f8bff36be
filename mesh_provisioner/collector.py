"""Keeping the interpreter's collections few and short: young ones come seldom, and what the seat holds once settled
is frozen out of full ones.

Python collects its youngest generation every 700 objects allocated (net of those freed), and each tenth of those
the next, and so on: on a seat's first start, with hundreds of thousands of records, read sets and index entries made
in seconds, that is some 1,600 young collections and ten full ones, about a second of a 9-second cold start of 1,000
nodes (docs/BENCHMARKS.md, change 41). Nearly all of what the seat makes lives as long as the seat, or is freed by
its count of references; a collection finds almost no cycle to free. The seat process has young collections come
every `YOUNG` objects instead (`collect_seldom`), which leaves some 35 young collections and one full one.

A full collection (generation 2) walks every object the interpreter tracks, with every thread stopped. With a mesh of
1,000 nodes in memory that is 0.2 to 1 s, during which no change is written (docs/BENCHMARKS.md, "What was slow").
Most of those objects live as long as the seat: the cache's records, the actors, the indices. `gc.freeze` moves every
object tracked now out of the collector's sight, so that later full collections walk only what came since.

The seat process freezes once its first load has settled, and again when it is quiet and the last freeze is
`EVERY` old, so that what was replaced since is frozen too; before each freeze, a collection frees the cyclic garbage
there is (a frozen cycle would never be freed). A host that runs the seat in its own process decides both for
itself: they are for the whole interpreter.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger("mesh_provisioner.collector")

EVERY: Final = 600.0
YOUNG: Final = 20_000  # objects allocated between two young collections (Python's default: 700)


def collect_seldom(young: int = YOUNG) -> None:
    """Have the interpreter's young collections come every `young` objects allocated at least (the older
    generations' thresholds as they are); for the whole interpreter: a seat process's decision, not a host's."""
    first, *older = gc.get_threshold()
    if first < young:
        gc.set_threshold(young, *older)


class Freezer:
    """Freezes the interpreter's objects when the seat is quiet: once settled, then at most every `EVERY` s."""

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self.freezes = 0
        self._last: float | None = None

    def tick(self, quiet: Callable[[], bool]) -> bool:
        """Freeze now if it is time and `quiet()` says nothing is being worked on; answers whether it froze."""
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every:
            return False
        if not quiet():
            return False
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self._last = now
        self.freezes += 1
        log.debug("froze %d objects out of full collections (%.0f ms)", gc.get_freeze_count(),
                 (time.perf_counter() - started) * 1000)
        return True
