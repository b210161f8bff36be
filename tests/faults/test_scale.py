"""The runner's scales (faults/scale.py) and the mesh of any size (faults/mesh.py): the goal scale asks for what the
reliability goal says, a flag overrides the scale, the small scale is the runner as it was, a mesh of 200 nodes
has plans on every node with providers on several, three nodes give the stream they always gave, and a seat on a
grown mesh, its server restarted, ends where settle() of the final inputs says."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from faults.mesh import final_mesh, grown, initial_states, node_names, stream
from faults.runner import params_of, parser, run_scenario, short
from faults.scale import GOAL, SCALES, SMALL
from faults.scenarios import SCENARIOS
from faults.twin import Pacer, Params, Run
from mesh_provisioner.contract import DEFAULT_BOUND_READS, PLACEMENT, PLANS, REFUSED, RESOLVED
from meshcheck.bus import until
from meshcheck.settled import expected


def test_the_goal_scale_asks_for_what_the_goal_says() -> None:
    # The goal's own numbers, written here and not read from the table: lowering the table fails this test.
    assert GOAL.nodes >= 200
    assert GOAL.runs == 1
    assert GOAL.pace is not None and GOAL.pace >= 100.0  # half of one process's 200 changes a second
    assert set(GOAL.scenarios) == set(SCENARIOS)
    least = {("kills", "faults"): 1_000, ("restarts", "faults"): 10, ("sigkill", "faults"): 10,
             ("cluster", "faults"): 5, ("bad-input", "changes"): 100_000, ("warrants", "changes"): 1_000,
             ("shards", "faults"): 1}
    for (scenario, what), n in least.items():
        value = getattr(GOAL.setting(scenario), what)
        assert value is not None and value >= n, (scenario, what, value)


def test_the_small_scale_is_the_runner_as_it_was(tmp_path: Path) -> None:
    args = parser().parse_args([])
    assert args.scale == "small" and SCALES["small"] is SMALL
    for name in SCENARIOS:
        p = params_of(name, SMALL, args, SMALL.runs, 7, tmp_path)
        assert p == Params(seed=7, work=tmp_path, changes=None, seconds=60.0, faults=None, rate=40.0,
                           inputs=33_334, nodes=3, pace=None)


def test_a_flag_overrides_the_scale(tmp_path: Path) -> None:
    args = parser().parse_args(["--scale", "goal", "--count", "50", "--faults", "2", "--nodes", "12",
                                "--pace", "0", "--inputs", "10"])
    p = params_of("kills", GOAL, args, 1, 1, tmp_path)
    assert (p.changes, p.faults, p.nodes, p.pace, p.inputs, p.rate) == (50, 2, 12, None, 10, GOAL.setting("kills").rate)
    p = params_of("restarts", GOAL, parser().parse_args(["--scale", "goal"]), 1, 1, tmp_path)
    assert (p.changes, p.faults, p.nodes, p.pace) == (GOAL.setting("restarts").changes, 10, GOAL.nodes, GOAL.pace)


def test_a_run_short_of_its_faults_says_so(tmp_path: Path) -> None:
    p = Params(seed=1, work=tmp_path, faults=10, changes=1000)
    out = Run("restarts", 1, faults=7)
    assert "made 7 of the 10 faults" in short("restarts", p, out)[0]
    assert short("warrants", p, Run("warrants", 1, faults=1000)) == []
    assert short("warrants", p, Run("warrants", 1, faults=999)) != []


def test_three_nodes_give_the_stream_they_always_gave() -> None:
    # The streams of the mesh of three nodes, as they were before the mesh could grow.
    for seed, n, digest in ((1, 344, "589604abcb1c337a"), (20261203, 339, "07002a35b996215d"),
                            (7, 342, "621b7b06c60692b4")):
        changes = stream(seed, 300)
        assert len(changes) == n
        assert hashlib.sha256(json.dumps(changes, sort_keys=True).encode()).hexdigest()[:16] == digest
    assert grown(3) == {} and node_names() == ("ace", "bee", "cat")


def test_a_mesh_of_200_nodes_has_plans_on_every_node_and_providers_on_several() -> None:
    nodes = node_names(200)
    assert len(set(nodes)) == 200
    inputs = {(state, key): value for state, values in initial_states(200).items() for key, value in values.items()}
    inputs.update(final_mesh(200))
    settled = expected(inputs, DEFAULT_BOUND_READS)
    assert {key.split(".", 1)[0] for key in settled.keys(PLANS)} == set(nodes)
    assert list(settled.keys(REFUSED)) == []  # nothing held: the end state depends on the final inputs alone
    placed = [json.loads(v)["modules"] for (state, _), v in final_mesh(200).items() if state == PLACEMENT]
    for provider in ("postgres", "keycloak", "minio"):
        assert sum(1 for modules in placed if {"module": provider} in modules) >= 20
    assert sum(1 for state, _ in grown(200) if state == RESOLVED) >= 200
    changes = stream(1, 2000, 200)
    assert len({key for state, key, _ in changes if state == PLACEMENT}) > 100  # the stream reaches the grown nodes


def test_a_grown_mesh_settles_to_settle_of_its_final_inputs(tmp_path: Path) -> None:
    # Every check of the fault runner (meshcheck.check), settle() of the final inputs among them.
    run = run_scenario("restarts", Params(seed=20261203, work=tmp_path, changes=120, faults=2, nodes=24, pace=200.0,
                                          seconds=30.0))
    assert run.ok, "\n".join(run.lost + run.errors)
    assert run.faults == 2 and run.settle_seconds is not None
    assert run.figures["nodes"] == 24 and run.summary.startswith("50 plans")


def test_the_pacer_keeps_its_rate_from_the_first_call() -> None:
    pacer = Pacer(200.0)
    for _ in range(41):
        pacer.wait()
    assert pacer.calls == 41 and pacer.last - pacer.first >= 40 / 200.0 - 0.01  # no burst at the start
    assert Pacer(None).figures()["made"] is None


def test_the_pacer_reports_its_pace_without_the_time_the_stream_was_held() -> None:
    pacer = Pacer(200.0)
    for _ in range(21):
        pacer.wait()
    with pacer.held():
        until(lambda: time.monotonic() - pacer.last >= 1.0, 5, 0.01, "a fault's wait")
    for _ in range(20):
        pacer.wait()
    made = pacer.figures()
    assert made["held_seconds"] >= 1.0
    assert made["made"] > 100 and made["overall"] < 50, made  # held time counted, it would be 33
    assert pacer.last - pacer.first >= 40 / 200.0 + 1.0 - 0.01, "no burst after the stream was held"
