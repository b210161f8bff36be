"""The runner's scales: what each scenario does at each, in one table (`--scale small|goal`).

`small` is the runner as it always ran: the sample's three nodes, three runs of each scenario, each scenario's own
counts, the stream written as fast as it is written. `goal` is the reliability goal, in one run of every scenario:

    on a mesh of at least 200 nodes with changes flowing at half the seat's saturation rate, at least 1,000 actor
    kills, 10 nats-server restarts, 10 seat processes killed (SIGKILL) with a standby waiting, a server of a
    three-server cluster killed and brought back 5 times with every bucket at 3 replicas, 100,000 malformed values
    and keys across every bucket the seat reads, 1,000 forged or replayed answers; and shard processes killed and
    joining.

The pace of the goal's stream, 100 changes a second, is half the saturation docs/BENCHMARKS.md measured for one
seat process (200 changes a second, on its 1,000-node mesh with its mix of changes; `benchmarks/partitioned.py`).
A flag given to the runner (`--count`, `--faults`, `--rate`, `--inputs`, `--seconds`, `--runs`, `--nodes`,
`--pace`) overrides the scale's value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

# One seat process's saturation, changes a second (docs/BENCHMARKS.md, "the most changes a second the seat
# sustains with its backlog bounded"), when the goal's pace and the soak's rate were set (benchmarks/partitioned.py, run
# by `python -m benchmarks.converge --nodes 1000` at 3870296, on the 2-core machine of those figures); both flow at
# half of it.
# Kept, not followed: the figures of every scenario and of the soak were measured at that pace.
SATURATION: Final = 200.0
SATURATION_SOURCE: Final = ("docs/BENCHMARKS.md: one seat process saturated at 200 changes a second on the "
                            "1,000-node benchmark mesh (benchmarks/partitioned.py) when this pace was set, 250 in its "
                            "later runs; the goal's stream flows at half of 200")


@dataclass(frozen=True)
class Setting:
    """What one scenario does at a scale; None keeps the scenario's own default (or the runner's)."""

    changes: int | None = None
    """`--count`: changes of the stream (bad input: bad values through the live seat; storm: its entries;
    warrants: forged and replayed answers)."""
    faults: int | None = None
    """`--faults`: faults of a run where the scenario counts them (kills: at least this many)."""
    rate: float | None = None
    """`--rate`: actor kills a second (kills)."""
    inputs: int | None = None
    """`--inputs`: bad values through the pure rules (bad input), shared among the runs."""


@dataclass(frozen=True)
class Scale:
    """A scale of the runner: the mesh, the runs, the stream's pace and bound, and each scenario's setting."""

    name: str
    nodes: int
    runs: int
    seconds: float
    """The bound of each run's stream of changes and faults."""
    pace: float | None
    """Changes a second of each stream; None: as fast as the runner writes them."""
    rate: float = 40.0
    inputs: int = 100_000
    scenarios: MappingProxyType[str, Setting] = field(default_factory=lambda: MappingProxyType({}))

    def setting(self, scenario: str) -> Setting:
        """The scenario's setting at this scale (its own defaults where the table says nothing)."""
        return self.scenarios.get(scenario, Setting())


SMALL: Final = Scale("small", nodes=3, runs=3, seconds=60.0, pace=None)
GOAL: Final = Scale(
    "goal", nodes=200, runs=1, seconds=900.0, pace=SATURATION / 2,
    scenarios=MappingProxyType({
        "kills": Setting(changes=4000, faults=1000, rate=25.0),
        "restarts": Setting(changes=1100, faults=10),
        "pause": Setting(changes=300),
        "sigkill": Setting(changes=1100, faults=10),
        "shards": Setting(changes=600, faults=5),
        "cluster": Setting(changes=1100, faults=5),
        "storm": Setting(),
        "bad-input": Setting(changes=100_000, inputs=100_000),
        "warrants": Setting(changes=1000),
    }),
)
SCALES: Final = MappingProxyType({s.name: s for s in (SMALL, GOAL)})
