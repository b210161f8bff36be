"""A bounded run of every scenario of the fault runner, as CI affords it: each must lose nothing and let no exception
escape (meshcheck.check). The long version, whose figures are docs/RELIABILITY.md, is `python -m faults` (see there)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from faults.runner import run_scenario
from faults.scenarios import SCENARIOS
from faults.twin import Params

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("FAULTS_SEED", "20261203"))
# Each scenario small: a few dozen changes, one or two faults, a few thousand bad values through the pure rules.
SMALL: dict[str, dict[str, Any]] = {
    "kills": {"changes": 80, "rate": 40.0},
    "restarts": {"changes": 40, "faults": 2},
    "pause": {"changes": 20, "faults": 1},
    "sigkill": {"changes": 20, "faults": 1},
    "shards": {"changes": 20, "faults": 1},
    "cluster": {"changes": 40, "faults": 1},
    "storm": {"changes": 2000},
    "bad-input": {"changes": 80, "inputs": 3000},
    "warrants": {"changes": 40},
}


def test_every_scenario_has_a_bounded_run() -> None:
    assert set(SMALL) == set(SCENARIOS)


@pytest.mark.parametrize("name", list(SMALL))
def test_scenario_loses_nothing(name: str, tmp_path: Path) -> None:
    run = run_scenario(name, Params(seed=SEED, work=tmp_path, seconds=30.0, **SMALL[name]))
    print(f"{name}: {run.faults} faults, {run.changes} changes, settled {run.settle_seconds} s after the last; "  # noqa: T201
          f"{run.summary}; {run.figures}")
    assert run.ok, "\n".join(run.lost + run.errors)
    assert run.faults > 0 and run.changes > 0
    assert run.settle_seconds is not None
