"""A partitioned seat's rules (contract 8.1), pure: which shard a node is in, the fair share, and the fixed point of
processes that each compose only the nodes of their shards, which must be `settle()`'s of one process."""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh_provisioner.contract import MANIFESTS, MODULES, NEEDS, PLANS, PROVISIONS, REFUSED, REGISTRY, SEAT, bound
from mesh_provisioner.messages.records import Manifest, ModuleEntry
from mesh_provisioner.rules.kept import kept, providers
from mesh_provisioner.rules.keys import CREDENTIAL_SUFFIX, node_of
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import Reads, known_nodes
from mesh_provisioner.rules.settle import apply
from mesh_provisioner.rules.shards import (
    fair_share,
    in_shards,
    parse_shard_key,
    rebalance,
    shard_key,
    shard_of,
    shard_of_write,
    wanting,
)
from mesh_provisioner.rules.writing import provision_of
from tests.support.differential import compare, expected, off_fixed_point
from tests.support.meshgen import BOUND_READS, NOW, generate

MESHES = int(os.environ.get("MESH_SHARD_MESHES", "120"))


def test_8_1_a_node_is_in_the_shard_of_the_first_8_bytes_of_its_sha256_big_endian_modulo_s() -> None:
    # Worked by hand from the contract's words for one name: every process of a mesh, in any language, agrees.
    digest = hashlib.sha256(b"ace").hexdigest()
    assert digest.startswith("2a0b6287a0e65cff")
    assert shard_of("ace", 64) == int(digest[:16], 16) % 64 == 63
    assert shard_of("ace", 1) == 0
    assert {shard_of(f"n{i}", 8) for i in range(200)} == set(range(8))


def test_8_1_keys_of_section_4_are_written_by_their_first_tokens_shard_and_the_registry_and_needs_by_shard_0() -> None:
    for state in (PLANS, PROVISIONS, REFUSED):
        assert shard_of_write(state, "ace.gitea.db", 64) == shard_of("ace", 64)
    assert shard_of_write(REGISTRY, "default", 64) == 0
    assert shard_of_write(NEEDS, "anything.at.all", 64) == 0
    assert shard_of_write(SEAT, "holder", 64) is None


def test_8_1_shard_lease_keys_are_shard_dot_i_of_this_count_only() -> None:
    assert shard_key(7) == "shard.7"
    assert parse_shard_key("shard.7", 64) == 7
    for other in ("shard.64", "shard.07", "shard.", "shard.-1", "holder", "member.shard.1"):
        assert parse_shard_key(other, 64) is None


@pytest.mark.parametrize(("shards", "members", "shares"),
                         [(64, 1, [64]), (64, 2, [32, 32]), (64, 3, [22, 21, 21]), (2, 3, [1, 1, 0])])
def test_8_1_a_fair_share_is_the_shards_spread_evenly_adding_up_to_the_count(
    shards: int, members: int, shares: list[int]
) -> None:
    assert [fair_share(shards, members, rank) for rank in range(members)] == shares


def _rebalanced(shards: int, processes: list[str], holders: dict[int, str], order: list[str]) -> dict[int, str]:
    """Each process in turn rebalances as it would at its renewal, over and over, until no one moves."""
    for _ in range(4 * len(processes) + 4):
        moved = False
        for p in order:
            take, give = rebalance(shards, p, holders, processes)
            for s in give:
                del holders[s]
            for s in take:
                assert s not in holders, "a process took a shard that is held"
                holders[s] = p
            moved = moved or bool(take or give)
        if not moved:
            return holders
    raise AssertionError("the processes never stopped moving shards")


def test_8_1_a_process_wants_the_rest_of_its_fair_share_while_another_still_holds_it() -> None:
    holders = dict.fromkeys(range(4), "a")
    assert rebalance(4, "b", holders, ["a", "b"]) == ([], [])
    assert wanting(4, "b", holders, ["a", "b"]) == 2, "a holds b's share until it gives it back"
    assert wanting(4, "a", holders, ["a", "b"]) == 0
    del holders[2], holders[3]  # given back: free
    take, _ = rebalance(4, "b", holders, ["a", "b"])
    assert take == [2, 3] and wanting(4, "b", {**holders, 2: "b", 3: "b"}, ["a", "b"]) == 0


@settings(max_examples=200, deadline=None)
@given(shards=st.integers(1, 80), n=st.integers(1, 6), joiners=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_8_1_processes_take_free_shards_up_to_their_fair_share_and_give_back_when_others_join(
    shards: int, n: int, joiners: int, seed: int
) -> None:
    rng = random.Random(seed)
    first = [f"p{i}" for i in range(n)]
    holders = _rebalanced(shards, first, {}, rng.sample(first, n))
    assert set(holders) == set(range(shards)), "a shard has no holder"
    assert max(Counter(holders.values()).values()) <= fair_share(shards, n)  # the first rank's share is the most
    everyone = first + [f"q{i}" for i in range(joiners)]
    holders = _rebalanced(shards, everyone, holders, rng.sample(everyone, len(everyone)))
    counts = Counter(holders.values())
    assert set(holders) == set(range(shards)), "a shard lost its holder when others joined"
    assert max(counts.values()) <= fair_share(shards, len(everyone))
    if shards >= len(everyone):
        assert set(counts) == set(everyone), "a process that joined holds nothing"


def _kept_view(view: MemoryView, holds: Callable[[str], bool], extra: frozenset[str] = frozenset()) -> MemoryView:
    """What a process holding the nodes `holds` says keeps of the bus (rules/kept.py), the providers' modules and
    `extra` (a superset does as well) kept with their keys."""
    provider = providers(view, holds) | extra
    bound_states = {bound(p) for p in view.bound_reads}
    local = MemoryView(view.bound_reads)
    for state in list(view.states()):
        for key in view.keys(state):
            e = view.get(state, key)
            if e is not None and kept(state, key, e.raw, holds, provider, bound_states):
                local.put(state, key, e.raw, e.revision)
    return local


def _settle_partitioned(view: MemoryView, shards: int, owner: dict[int, str], rng: random.Random,
                        keeping: bool = False) -> list[str]:
    """The processes of a partitioned seat, each composing only its shards' nodes and judging their keys (and the
    shared credentials of its nodes that keys of others' nodes depend on), in a random order, to their fixed point;
    with `keeping`, each reads only what it keeps of the bus (rules/kept.py), now and then with some other modules'
    keys too. Answers every write made by a process that does not hold its key's shard."""
    processes = sorted(set(owner.values()))
    modules = sorted(view.keys(MODULES))
    wrong: list[str] = []
    for _ in range(60):
        wrote = 0
        for p in rng.sample(processes, len(processes)):
            mine = in_shards({s for s, h in owner.items() if h == p}, shards)
            extra = frozenset(m for m in modules if rng.random() < 0.2)

            def seen(mine: Callable[[str], bool] = mine, extra: frozenset[str] = extra) -> MemoryView:
                return _kept_view(view, mine, extra) if keeping else view

            writes = []
            for node in sorted(n for n in known_nodes(view) if mine(n)):
                result = compose_node(seen(), node, NOW, mine)
                apply(view, result.writes)
                writes += result.writes
            local = seen()
            keys = {key for key in local.keys(PROVISIONS) if mine(node_of(key))}
            for key in local.keys(PROVISIONS):
                p_, _ = provision_of(local, key)
                if not mine(node_of(key)) and p_ is not None:
                    keys |= {d for d in p_.depends_on[:2] if mine(node_of(d))}
            for key in sorted(keys):
                judged = rejudge(seen(), key, NOW, mine)
                apply(view, judged.writes)
                writes += judged.writes
            wrong += [f"{p} wrote {w.state} {w.key}" for w in writes if not mine(node_of(w.key))]
            wrote += len(writes)
        if not wrote:
            return wrong
    raise AssertionError("the partitioned processes never reached a fixed point")


def _partitioned_meshes(keeping: bool) -> None:
    """Every mesh settled by the processes of a partitioned seat in a random order ends at `settle()`'s fixed point,
    each process writing only its shards' keys."""
    failed: dict[int, list[str]] = {}
    for seed in range(1, MESHES + 1):
        mesh = generate(seed)
        rng = random.Random(seed)
        view = MemoryView(BOUND_READS)
        for i, ((state, key), value) in enumerate(sorted(mesh.inputs.items()), 1):
            view.put(state, key, value, i)
        shards = rng.choice([2, 3, 8])
        processes = rng.randint(2, 3)
        owner = {s: f"p{rng.randrange(processes)}" for s in range(shards)}
        problems = _settle_partitioned(view, shards, owner, rng, keeping)
        problems += compare(expected(mesh.inputs, NOW), view) + off_fixed_point(view, NOW)
        if problems:
            failed[seed] = problems
    said = [f"seed {seed}:\n    " + "\n    ".join(ps[:6]) for seed, ps in list(failed.items())[:6]]
    assert not failed, f"{len(failed)} of {MESHES} meshes end elsewhere when partitioned:\n" + "\n".join(said)


def test_8_1_processes_sharing_a_mesh_end_at_settles_fixed_point_and_write_only_their_shards_keys() -> None:
    _partitioned_meshes(keeping=False)


def test_8_1_processes_keeping_only_what_their_judgments_read_end_at_settles_fixed_point_too() -> None:
    # Contract 8.1: a process keeps of another node only its providers' modules' keys and who depends on its own.
    _partitioned_meshes(keeping=True)


def test_8_1_a_shared_credential_of_a_node_another_process_depends_on_is_made_by_its_own_nodes_writer() -> None:
    # Without `shared_credential`, the credential's node never makes it, and the consumer's process may not.
    found = 0
    for seed in range(1, MESHES + 1):
        mesh = generate(seed)
        view = MemoryView(BOUND_READS)
        for i, ((state, key), value) in enumerate(sorted(mesh.inputs.items()), 1):
            view.put(state, key, value, i)
        settled = expected(mesh.inputs, NOW)
        for key in settled.keys(PROVISIONS):
            p, _ = provision_of(settled, key)
            if p is None or p.provider.module != "mesh-vault":
                continue
            users = {node_of(u) for u in settled.dependents(key)} - {node_of(key)}
            if users:
                found += 1
                node = node_of(key)
                again = MemoryView(BOUND_READS)
                for i, ((state, k), value) in enumerate(sorted(mesh.inputs.items()), 1):
                    again.put(state, k, value, i)
                # Only the credential's node's process runs the rules after the consumers' nodes were composed by
                # another process.
                for n in sorted(users):
                    apply(again, compose_node(again, n, NOW, lambda x, n=n: x == n).writes)
                assert again.get(PROVISIONS, key) is None, "the consumers' process wrote another node's key"
                apply(again, rejudge(again, key, NOW, lambda x, node=node: x == node).writes)
                made, _ = provision_of(again, key)
                assert made is not None, f"seed {seed}: {key} was not made by its node's writer"
                break
    assert found, "no mesh had a shared credential other nodes depend on: the test checks nothing"


def test_8_1_a_shard_held_by_a_process_not_counted_is_neither_free_nor_a_live_process() -> None:
    # A process of another shard count holds shards 0 and 1 (its holder not counted: ""): this one, alone, takes the
    # rest, and counts only itself.
    take, give = rebalance(4, "a", {0: "", 1: ""}, ["a"])
    assert (take, give) == ([2, 3], [])


def test_8_1_a_partitioned_key_judgment_reads_who_depends_on_it_only_for_a_shared_credential() -> None:
    # Each judgment of a key thousands of consumers depend on read all of them; and what it reads wakes it (section 6):
    # every new consumer of a provider's own needs woke those keys' judgments for nothing.
    checked = {"credential": 0, "other": 0}
    for seed in range(1, MESHES + 1):
        view = expected(generate(seed).inputs, NOW)
        for key in view.keys(PROVISIONS):
            if not view.dependents(key):
                continue
            reads = Reads(view)
            rejudge(reads, key, NOW, lambda node: False)
            shared = key.count(".") == 2 and key.endswith(CREDENTIAL_SUFFIX)
            assert (("dependents", key) in reads.tokens) == shared, key
            checked["credential" if shared else "other"] += 1
    assert all(checked.values()), f"no key of some kind had dependents: {checked}"


def test_8_1_settles_fixed_point_is_one_of_every_split_of_the_nodes_too() -> None:
    # Contract 8.1: the fixed point is the one S = 1 reaches. There, a process writing any part of the nodes composes
    # and judges (every key, and every key one depends on: a missing shared credential too) without writing anything.
    checked, wrote = 0, []
    for seed in range(1, MESHES + 1):
        view = expected(generate(seed).inputs)
        keys = set(view.keys(PROVISIONS))
        keys |= {d for key in list(keys) if (p := provision_of(view, key)[0]) is not None for d in p.depends_on}
        for shards in (1, 2, 3):
            for part in range(shards):
                def writes_on(node: str, shards: int = shards, part: int = part) -> bool:
                    return shard_of(node, shards) == part

                # Reading the whole bus, and what the part's process keeps of it (rules/kept.py).
                for seen, how in ((view, "the bus"), (_kept_view(view, writes_on), "what it keeps")):
                    for key in sorted(k for k in keys if writes_on(node_of(k))):
                        checked += 1
                        if rejudge(seen, key, NOW, writes_on).writes:
                            wrote.append(f"seed {seed}, part {part} of {shards}, reading {how}: judging {key}")
                    for node in sorted(n for n in known_nodes(view) if writes_on(n)):
                        if compose_node(seen, node, NOW, writes_on).writes:
                            wrote.append(f"seed {seed}, part {part} of {shards}, reading {how}: composing {node}")
    assert checked > MESHES, f"only {checked} keys judged"
    assert not wrote, f"{len(wrote)} judgment(s) wrote at the fixed point:\n" + "\n".join(wrote[:20])


def test_8_1_a_key_whose_provider_no_longer_offers_is_judged_from_what_its_process_keeps_as_from_the_bus() -> None:
    # A provider's trunk manifest that stops offering leaves its consumers' keys as they are, judged by its have: a
    # process started after that keeps the provider's keys because a key of its own names it (rules/kept.py).
    checked = 0
    for seed in range(1, MESHES + 1):
        settled = expected(generate(seed).inputs)
        for module in sorted({p.provider.module for key in settled.keys(PROVISIONS)
                              if (p := provision_of(settled, key)[0]) is not None}):
            me = settled.get(MODULES, module)
            trunk = me.get(ModuleEntry) if me is not None else None
            found = settled.get(MANIFESTS, trunk.manifest) if trunk is not None else None
            if trunk is None or found is None or found.get(Manifest) is None:
                continue
            view = settled.copy()
            offering_nothing = {**json.loads(found.raw), "provides": []}
            view.put(MANIFESTS, trunk.manifest, json.dumps(offering_nothing).encode(), view.last_revision + 1)
            for part in range(2):
                def mine(node: str, part: int = part) -> bool:
                    return shard_of(node, 2) == part

                local = _kept_view(view, mine)
                for key in sorted(k for k in view.keys(PROVISIONS) if mine(node_of(k))):
                    p = provision_of(view, key)[0]
                    if p is None or p.provider.module != module or mine(p.provider.node):
                        continue
                    checked += 1
                    whole, kept_only = rejudge(view, key, NOW, mine).writes, rejudge(local, key, NOW, mine).writes
                    assert whole == kept_only, f"seed {seed}: {key} judged otherwise from what is kept"
    assert checked > MESHES / 4, f"only {checked} keys of a provider on another node judged"
