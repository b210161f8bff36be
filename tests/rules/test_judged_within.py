"""Contract section 6, by construction: a key judged within its node's composition keeps the read set of its own
judgment (rules/reads.py `judging`), so the seat does not judge every key it makes again only to learn what it reads.

The dispatcher takes that read set as the key's (actors/dispatch.py), and takes the key's judgment out of its queue
when nothing it read changed but by the composition's own writes. Both stand on what is checked here, over the random
meshes of the differential test: once the composition's writes are applied, `rejudge` of each such key reads nothing
the recorded set lacks (else a change of it would wake nothing), and writes nothing (the composition wrote what the
key's judgment writes). A partitioned seat's compositions are checked too (contract 8.1).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import Reads, known_nodes
from mesh_provisioner.rules.settle import apply
from mesh_provisioner.rules.shards import shard_of
from tests.support.meshgen import NOW, generate, view_of

MESHES = int(os.environ.get("MESH_SHARD_MESHES", "120"))


def _compose_all(
    view: MemoryView, rng: random.Random, writes_on: Callable[[str], bool] | None
) -> tuple[int, list[str]]:
    """Compose the nodes (those `writes_on` says) in a random order, twice over, checking each key each composition
    judged; answers how many were checked and what failed."""
    checked, failed = 0, []
    for _ in range(2):
        nodes = sorted(n for n in known_nodes(view) if writes_on is None or writes_on(n))
        rng.shuffle(nodes)
        for node in nodes:
            reads = Reads(view)
            apply(view, compose_node(reads, node, NOW, writes_on).writes)
            for key, within in reads.judged.items():
                checked += 1
                alone = Reads(view)
                again = rejudge(alone, key, NOW, writes_on)
                missing = alone.tokens - within.tokens
                if missing:
                    failed.append(f"{key} (composing {node}): its own judgment reads {sorted(missing)} besides")
                if again.writes:
                    failed.append(f"{key} (composing {node}): judged again, it writes {again.writes}")
    return checked, failed


def test_6_a_key_judged_in_its_nodes_composition_keeps_what_its_own_judgment_reads_and_writes_nothing_more() -> None:
    checked, failed = 0, []
    for seed in range(1, MESHES + 1):
        inputs = generate(seed).inputs
        for partitioned in (False, True):
            view = view_of(inputs.items())
            rng = random.Random(seed)
            writes_on = (lambda node: shard_of(node, 2) == 0) if partitioned else None
            n, said = _compose_all(view, rng, writes_on)
            checked += n
            failed += [f"seed {seed}{' partitioned' if partitioned else ''}: {s}" for s in said]
    assert checked > MESHES, f"only {checked} keys were judged within compositions"
    assert not failed, f"{len(failed)} key(s):\n" + "\n".join(failed[:20])
