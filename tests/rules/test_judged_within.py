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

from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put
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


def test_6_a_partitioned_composition_keeps_the_read_sets_of_its_keys_of_a_shared_credentials_form_too() -> None:
    # Contract 8.1: a partitioned seat's own judgment of such a key first reads the keys depending on it
    # (`shared_credential`); the composition reads them too, so the key is not judged again only to learn them.
    def writes_on(node: str) -> bool:
        return shard_of(node, 2) == 0

    kept, missing = 0, []
    for seed in range(1, MESHES + 1):
        view = view_of(generate(seed).inputs.items())
        for node in sorted(n for n in known_nodes(view) if writes_on(n)):
            reads = Reads(view)
            done = compose_node(reads, node, NOW, writes_on)
            for w in done.writes:
                p = r.decode(r.Provision, w.value) if isinstance(w, Put) and w.state == PROVISIONS else None
                shaped = w.key.count(".") == 2 and w.key.endswith("-credential")
                if p is None or p.state == r.RETIRING or not shaped or not w.key.startswith(f"{node}."):
                    continue  # one of another node is judged apart (`_judge_elsewhere`), by a whole seat too
                kept += 1
                if w.key not in reads.judged:
                    missing.append(f"seed {seed}, composing {node}: {w.key}")
            apply(view, done.writes)
    assert kept > MESHES // 4, f"only {kept} keys of a shared credential's form were written"
    assert not missing, "\n".join(missing[:20])
