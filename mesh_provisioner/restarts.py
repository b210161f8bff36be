"""A supervised child's restarts: how to start it, how often it restarted, and how long its next restart waits
(design.md, "Supervision").

One-for-one restarts with exponential backoff (`backoff.py`), at most `Config.restart_intensity` of one child within
`Config.restart_period` seconds; past that the supervisor gives up. Counting only, no threads: the supervisor
decides what follows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka

from mesh_provisioner.backoff import backoff
from mesh_provisioner.config import Config


@dataclass
class ChildSpec:
    """How to start one child, and its restarts so far."""

    name: str
    start: Callable[[], pykka.ActorRef[Any]]
    restarts: deque[float] = field(default_factory=deque)
    total_restarts: int = 0

    def restarted(self, now: float, config: Config) -> float | None:
        """Count a restart at `now` (monotonic seconds): the wait before it, or None when the child has restarted more
        than the restart intensity within the restart period."""
        while self.restarts and self.restarts[0] < now - config.restart_period:
            self.restarts.popleft()
        self.restarts.append(now)
        self.total_restarts += 1
        if len(self.restarts) > config.restart_intensity:
            return None
        return backoff(len(self.restarts), config.backoff_first, config.backoff_max)
