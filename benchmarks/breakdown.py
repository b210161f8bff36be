"""Where a seat process's CPU goes: thread-CPU counters around the parts of the seat that its ceiling does not count.

`benchmarks.seat_proc --breakdown` installs them before the seat starts. Each part is a function of the package,
replaced in place by one that adds the CPU its thread spent in it (`time.thread_time`), less what parts called
within it spent (counted as theirs), and its calls. A sampling profiler cannot do this here: py-spy, walking a
thousand actor threads at each sample, falls seconds behind and misses most samples.

Only functions are counted, not coroutines (a coroutine's thread CPU would count whatever ran while it waited): the
bus loop's own work (reading the watches, publishing the writes, their acknowledgements) is its thread's CPU less
the parts counted on it (memory and routing). The counters cost about a microsecond a call (some 0.3 s over a
1,000-node cold start): compare parts with each other, and a seat with them against one with them, not against a
seat without.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from mesh_provisioner.actors import base as actor_base
from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.actors.dispatch import Dispatcher
from mesh_provisioner.actors.routing import Router
from mesh_provisioner.bus.memory import Memory

# (owner, attribute, part): each function counted, where the seat looks it up.
PARTS: tuple[tuple[Any, str, str], ...] = (
    (node_actor, "compose_node", "rules: a node's composition, its reads recorded"),
    (actor_base, "rejudge", "rules: a key's judgment alone, its reads recorded"),
    (Dispatcher, "done", "dispatcher: a run's read set indexed, its keys' too"),
    (Dispatcher, "add", "dispatcher: judgments queued whatever they read"),
    (Router, "changed", "routing: the judgments a change woke, queued"),
    (Memory, "set", "memory: a change decoded and indexed"),
)


class Breakdown:
    """The CPU seconds and calls of each part so far, summed over threads."""

    def __init__(self, parts: tuple[tuple[Any, str, str], ...] = PARTS) -> None:
        self.parts = parts
        self.seconds: dict[str, float] = {part: 0.0 for _, _, part in parts}
        self.calls: dict[str, int] = {part: 0 for _, _, part in parts}
        self._lock = threading.Lock()
        self._local = threading.local()

    def install(self) -> None:
        """Count every part from now on, for the life of the process."""
        for owner, name, part in self.parts:
            setattr(owner, name, self._counted(getattr(owner, name), part))

    def _counted(self, real: Callable[..., Any], part: str) -> Callable[..., Any]:
        local = self._local

        @functools.wraps(real)
        def counted(*args: Any, **kwargs: Any) -> Any:
            inner: list[float] = getattr(local, "inner", None) or [0.0]
            local.inner = inner
            outer, inner[0] = inner[0], 0.0
            began = time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                spent = time.thread_time() - began
                own = spent - inner[0]
                inner[0] = outer + spent  # the caller's parts within it, this one's whole time among them
                with self._lock:
                    self.seconds[part] += own
                    self.calls[part] += 1

        return counted

    def figures(self) -> dict[str, Any]:
        """Each part's CPU seconds and calls, and each kind of thread's CPU seconds (Linux: schedstat)."""
        parts = {part: {"cpu_seconds": round(self.seconds[part], 3), "calls": self.calls[part]}
                 for _, _, part in self.parts}
        return {"cpu_by_part": parts, "cpu_by_thread": cpu_by_thread()}


def cpu_by_thread() -> dict[str, float]:
    """The CPU seconds of the bus loop's thread, the main thread, and every other thread alive together."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out = {"bus loop": 0.0, "main": 0.0, "others": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
        except OSError:  # the thread ended meanwhile
            continue
        kind = "main" if int(tid) == main else "bus loop" if names.get(int(tid)) == "mesh-provisioner-bus" else "others"
        out[kind] += seconds
    return {k: round(v, 3) for k, v in out.items()}
