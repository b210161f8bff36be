"""Chaos: a seat whose actors are killed again and again, or whose NATS server restarts, while the mesh changes,
ends where an undisturbed seat given the same changes ends (design.md, properties 1, 3 and 4).

These are the fault runner's `kills` and `restarts` scenarios (faults/scenarios), run larger than their bounded
versions in test_scenarios.py: two servers get the same sample mesh and, change by change, the same seeded stream of
random changes (the router deciding the asks it holds now and then); one seat serves each, the disturbed one killed
at random (through the chaos API, `sup.kill`, and by `ActorRef.stop()` from outside) or its server restarted
mid-stream, the other left alone. Once both are settled (meshcheck.check):

- each bus is at a fixed point: a fresh seat over it writes nothing;
- every plan, every needed (non-retiring) provision and every refusal is the same on both, `at`, `v` and a
  refusal's `since` aside; a retiring key may be on one bus only, and a key may be needed on one bus only while a
  retiring key there depends on it (a transient need, kept until the operator answers);
- no ask was published twice: the router's stream holds each `Nats-Msg-Id` once, and every ask it holds is the
  ask its key names;
- every write of the seat's states carried the revision it was judged from (a compare-and-set), a node never
  composed twice at once, the restart intensity never tripped, and no exception escaped an actor.

The stream ends by setting the composition's inputs to a final mesh in which no module is held, so that what each
seat ends with depends on the final inputs alone (a held module keeps its last plan: that depends on history).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faults.runner import run_scenario
from faults.twin import Params

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("CHAOS_SEED", "20261203"))  # another seed: CHAOS_SEED=n
CHANGES = 300
KILLS = 200  # at least this many children die during the stream
STREAM_SECONDS = 90.0  # the stream and its kills end by then, whatever happened


def test_chaos_kills_during_a_stream_of_changes(tmp_path: Path) -> None:
    run = run_scenario("kills", Params(seed=SEED, work=tmp_path, changes=CHANGES, rate=80.0, faults=KILLS,
                                       seconds=STREAM_SECONDS))
    print(f"chaos: {run.changes} changes, {run.faults} kills, settled {run.settle_seconds} s after the last; "  # noqa: T201
          f"{run.summary}; {run.figures}")
    assert run.ok, "\n".join(run.lost + run.errors)
    assert run.changes > CHANGES, "the stream did not end in time"
    assert run.figures["restarts"] >= KILLS


def test_nats_server_restarted_mid_stream(tmp_path: Path) -> None:
    run = run_scenario("restarts", Params(seed=SEED + 1, work=tmp_path, changes=CHANGES // 2, faults=2,
                                          seconds=STREAM_SECONDS))
    print(f"restart: {run.changes} changes, the server restarted {run.faults} times, "  # noqa: T201
          f"settled {run.settle_seconds} s after the last; {run.summary}; {run.figures}")
    assert run.ok, "\n".join(run.lost + run.errors)
    assert run.faults == 2 and run.figures["resyncs"] >= 2
