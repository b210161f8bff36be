"""The scenarios of the fault runner, by name: each a module with NAME, FAULTS (what it injects, in words),
CHANGES (its default count) and `run(params) -> Run`."""

from __future__ import annotations

from types import ModuleType

from faults.scenarios import bad_input, cluster, kills, pause, restarts, shards, sigkill, storm, warrants

SCENARIOS: dict[str, ModuleType] = {
    m.NAME: m for m in (kills, restarts, pause, sigkill, shards, cluster, storm, bad_input, warrants)
}
