"""`settle()` is order-independent: the rules alone, with no bus, end where `settle()` of the final inputs ends.

Over the random meshes of the differential test (tests/support/meshgen.py), each mesh's history (decoys, deletes,
keys that only the history has, in a random interleaving) is fed into a `MemoryView`; after each change the rules
run as a seat might have run them by then: all of them to their fixed point (`settle()`), or only a few
compositions and judgements, or none. Once the history is over, `settle()` runs to the fixed point, and the view
is compared key by key with `settle()` of a view holding only the final inputs, with the comparison's rules of
tests/support/differential.py (what the contract lets history decide is left aside, and nothing else).

A failure here is the rules' (or the comparison's) own, not the runtime's: the live differential test
(tests/system/test_differential.py) runs the same meshes through a real seat. MESH_DIFF_MESHES=n runs n meshes
(500 by default), MESH_DIFF_FIRST=s from seed s.
"""

from __future__ import annotations

import os
import random

import pytest

from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import known_nodes
from mesh_provisioner.rules.settle import apply, settle
from tests.support.differential import compare, expected, inputs_of, off_fixed_point
from tests.support.meshgen import BOUND_READS, NOW, generate

FIRST = int(os.environ.get("MESH_DIFF_FIRST", "1"))
MESHES = int(os.environ.get("MESH_DIFF_MESHES", "500"))
# Meshes whose modules may require, in turn, what each other provides: off by default, as the rules have more than
# one fixed point there (two providers judged by their haves, each waiting for a key that waits for the other, end
# both provided or both asked, by the order they were composed in), which no runtime can make order-independent.
CYCLES = os.environ.get("MESH_DIFF_CYCLES", "") == "1"


def some_rules(view: MemoryView, rng: random.Random) -> None:
    """What a seat may have done by now: everything, a few compositions and judgements, or nothing."""
    roll = rng.random()
    if roll < 0.4:
        settle(view, NOW)
        return
    if roll < 0.8:
        for _ in range(rng.randint(1, 4)):
            nodes, keys = sorted(known_nodes(view)), sorted(view.keys(PROVISIONS))
            if nodes and (not keys or rng.random() < 0.6):
                apply(view, compose_node(view, rng.choice(nodes), NOW).writes)
            elif keys:
                apply(view, rejudge(view, rng.choice(keys), NOW).writes)


def run_history(seed: int) -> list[str]:
    """One mesh's history fed to the rules alone, then settled: every difference from `settle()` of its inputs."""
    mesh = generate(seed, cycles=CYCLES)
    rng = random.Random(seed * 7919 + 1)
    view = MemoryView(BOUND_READS)
    revision = 0
    for op in mesh.ops:
        if op.kind == "put":
            assert op.value is not None
            revision += 1
            view.put(op.state, op.key, op.value, revision)
        elif op.kind == "delete":
            view.delete(op.state, op.key)
        else:
            continue
        some_rules(view, rng)
    assert settle(view, NOW).settled, f"seed {seed}: the history's view did not settle"
    assert inputs_of(view) == mesh.inputs, f"seed {seed}: the history did not end at the mesh's inputs"
    return compare(expected(mesh.inputs, NOW), view) + off_fixed_point(view, NOW)


@pytest.mark.differential
def test_settle_ends_where_the_final_inputs_say_whatever_the_order() -> None:
    failed: dict[int, list[str]] = {}
    for seed in range(FIRST, FIRST + MESHES):
        problems = run_history(seed)
        if problems:
            failed[seed] = problems
    said = [f"seed {seed} (replay: MESH_DIFF_FIRST={seed} MESH_DIFF_MESHES=1):\n    " + "\n    ".join(ps[:8])
            for seed, ps in list(failed.items())[:10]]
    assert not failed, (f"{len(failed)} of {MESHES} histories end elsewhere than settle() of their final inputs:\n"
                        + "\n".join(said))
