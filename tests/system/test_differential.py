"""The live seat ends where `settle()` of the same final inputs ends, whatever the order of changes, kills and
restarts (design.md, "The live seat equals settle()"; contract section 6).

Each random mesh (tests/support/meshgen.py) is played on a real nats-server in a random history: keys written in a
random interleaving, some first with another value, some deleted and written again, some only in the history;
the seat started before, during or after the changes; actors killed through the chaos API; now and then the test
waiting for the seat to settle mid-way; every `RESTART_EVERY`-th mesh with a server restart. Once the seat
settles, every state is read back from the server and checked (tests/support/differential.py):

1. The bus holds the mesh's final inputs, exactly.
2. Key by key, the seat's plans, provisions and refusals equal `settle()` (mesh_provisioner/rules/settle.py) of a
   view holding only the final inputs, but for what the contract lets history decide, and only that:
   - a provision in state `retiring`, with its ask and warrant (5.4: a key needed only in an intermediate state
     retires, asking the operator, and stays until the operator approves);
   - the plan of a module held at its wanted build, and its keys the composition does not need (5.2: its last
     plan and provisions are kept as they were);
   - the plans, refusals and keys of a node whose placement does not decode (5.1.4: nothing is written for it);
   - keys that any of those depend on, in turn (5.2: a key another node's provision depends on stays needed);
   - a key the bus holds and `settle()` does not, which a provision `settle()` makes on another node depends on,
     and what it depends on in turn (5.2: it stays needed once made; section 4: a credential's key is named even
     while no node runs mesh-vault);
   these may be on one side only, and are compared field by field where both sides have them;
   - depends-on, state and why of a provision whose provider is held on another node, or on a node whose
     placement does not decode (section 4: its depends-on follows the provider's plan in `plans`, which history
     kept);
   - state and why of a provision that depends, in turn, on a key above that is on one side only, or on one of
     the provisions just named (5.3: a provider judged by its have provides once all it depends on is provided);
   - a provision's `at` and `v` (section 4: two provisions are the same with them aside), a refusal's `since`.
   Plans are compared byte for byte (section 4: a plan is encoded deterministically).
3. The history-free property: `settle()` over the bus as it is (the inputs and the seat's own states) writes
   nothing: the seat stopped at its fixed point (section 6).

Every key where a check fails is named, with the mesh's seed. Replay one mesh with
`MESH_DIFF_FIRST=<seed> MESH_DIFF_MESHES=1 MESH_DIFF_REPEAT=20 pytest tests/system/test_differential.py` (a race
may show once in a few runs); run thousands with `MESH_DIFF_MESHES=5000`. The pure variant, with no bus, is
tests/rules/test_settle_order.py: a failure there is the rules', not the runtime's.

The generator's requirements between modules have no cycle: on a cycle of providers judged by their haves the
rules have more than one fixed point (tests/rules/test_settle_order.py, MESH_DIFF_CYCLES=1).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from helpers import NatsServer

from tests.support.differential import expected
from tests.support.meshgen import generate
from tests.support.seatrun import Outcome, Runner, run_meshes

FIRST = int(os.environ.get("MESH_DIFF_FIRST", "1"))
MESHES = int(os.environ.get("MESH_DIFF_MESHES", "500"))
RESTART_EVERY = int(os.environ.get("MESH_DIFF_RESTART_EVERY", "100"))
REPEAT = int(os.environ.get("MESH_DIFF_REPEAT", "1"))
QUIET_MESHES = min(MESHES, 25)

pytestmark = pytest.mark.differential


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    """One nats-server for every mesh of the module, and another module's connection to it."""
    server = NatsServer(tmp_path_factory.mktemp("differential"))
    server.start()
    try:
        run = Runner(server)
        try:
            yield run
        finally:
            run.close()
    finally:
        server.stop()


def report(outcomes: list[Outcome], seconds: float) -> str:
    """How many meshes differ, every failing seed, the first ten's differences and the first one's history."""
    failed = [o for o in outcomes if o.problems]
    kills = sum(o.kills for o in outcomes)
    restarts = sum(o.restarts for o in outcomes)
    head = (f"{len(failed)} of {len(outcomes)} meshes differ ({kills} kills, {restarts} server restarts, "
            f"{seconds:.1f} s); seeds: {sorted({o.seed for o in failed})}")
    history = f"\nthe history of seed {failed[0].seed}:\n{failed[0].history}" if failed else ""
    return head + "".join("\n" + o.said() for o in failed[:10]) + history


@pytest.mark.timeout(max(300, MESHES * REPEAT))
def test_live_seat_equals_settle(runner: Runner) -> None:
    started = time.monotonic()
    outcomes = run_meshes(runner, range(FIRST, FIRST + MESHES), restart_every=RESTART_EVERY, repeat=REPEAT)
    said = report(outcomes, time.monotonic() - started)
    print(said.splitlines()[0])  # noqa: T201
    assert not any(o.problems for o in outcomes), said


def test_a_seat_started_again_on_a_settled_bus_writes_nothing(runner: Runner) -> None:
    """A seat started on a settled bus writes nothing, nor does a `reconcile` after it (contract section 6): on
    the bus `settle()` made of a mesh's final inputs, and on the bus the live seat settled after the mesh's
    history when that bus is at its fixed point. Where the live seat stopped off it, the fresh seat and the
    reconcile must bring the bus there (what else the live seat got wrong is test_live_seat_equals_settle's)."""
    problems: dict[int, list[str]] = {}
    for seed in range(FIRST, FIRST + QUIET_MESHES):
        mesh = generate(seed)
        runner.load(expected(mesh.inputs))
        found = runner.started_again("on the bus settle() made", settled=True)
        off = [p for p in runner.run(mesh).problems if p.startswith("off the fixed point")]
        found += runner.started_again("on the bus the live seat settled", settled=not off)
        if found:
            problems[seed] = found
    said = "\n".join(f"seed {seed}:\n    " + "\n    ".join(ps[:6]) for seed, ps in list(problems.items())[:10])
    assert not problems, f"{len(problems)} of {QUIET_MESHES} meshes:\n{said}"
