"""A partitioned seat (contract 8.1) as an operator runs it: two `serve --shards` processes share one mesh on a real
nats-server, split its shards, and one SIGKILLed leaves the other to take its shards and settle the bus where one
process would have: `settle()` of the final inputs, key by key."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from helpers import NatsServer, stop, wait_until

from mesh_provisioner.contract import SEAT
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.shards import parse_shard_key
from meshcheck import check
from tests.support.differential import compare, expected, off_fixed_point
from tests.support.meshgen import BOUND_READS, Inputs, Op, generate
from tests.support.seatrun import Runner

LEASE = 2.0
SHARDS = 8
# Meshes of six nodes, in shards 2 to 7 of 8: both processes hold some.
SEEDS = [int(s) for s in os.environ.get("MESH_SHARD_SEEDS", "6,29").split(",")]


@pytest.fixture
def runner(nats_server: NatsServer) -> Iterator[Runner]:
    run = Runner(nats_server)
    try:
        yield run
    finally:
        run.close()


def serve(url: str) -> subprocess.Popen[bytes]:
    """A seat process of the partitioned mesh."""
    cmd = [sys.executable, "-m", "mesh_provisioner", "--nats", url, "--lease-seconds", str(LEASE),
           "--shards", str(SHARDS), "--bound-reads", ",".join(BOUND_READS), "serve"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def holders(runner: Runner) -> dict[int, int]:
    """The pid holding each shard now."""
    out: dict[int, int] = {}
    for key, value in runner.bus.entries(SEAT).items():
        shard = parse_shard_key(key, SHARDS)
        lease = r.decode(r.Lease, value)
        if shard is not None and lease is not None:
            out[shard] = lease.pid
    return out


def inputs_after(ops: list[Op]) -> Inputs:
    """The inputs a history's first steps leave on the bus."""
    out: Inputs = {}
    for op in ops:
        if op.value is None:
            out.pop((op.state, op.key), None)
        else:
            out[(op.state, op.key)] = op.value
    return out


def differences(runner: Runner, inputs: Inputs) -> list[str]:
    """How the bus differs from `settle()` of the inputs, and from its own fixed point."""
    live: MemoryView = runner.snapshot()
    return compare(expected(inputs), live) + off_fixed_point(live)


@pytest.mark.parametrize("seed", SEEDS)
def test_8_1_two_processes_share_a_mesh_and_one_killed_leaves_the_other_its_shards(runner: Runner, seed: int) -> None:
    mesh = generate(seed)
    assert len(mesh.nodes) >= 4
    ops = [op for op in mesh.ops if op.kind in ("put", "delete")]
    third = len(ops) // 3
    runner.write(ops[:third])
    a = serve(runner.server.url)
    b: subprocess.Popen[bytes] | None = None
    try:
        # Alone, a process takes every shard, and composes every node: what it keeps is read before b joins (a
        # share given back while a still loads is not kept at all, and nothing of it is let go of after).
        wait_until(lambda: Counter(holders(runner).values()) == {a.pid: SHARDS}, 30, 0.05, "a holds every shard")
        alone = inputs_after(ops[:third])
        wait_until(lambda: not differences(runner, alone), 30, 0.2, "a alone settles at settle()'s fixed point")
        b = serve(runner.server.url)
        # One that joins gets its fair share, given back by the other: 4 and 4.
        wait_until(lambda: Counter(holders(runner).values()) == {a.pid: SHARDS // 2, b.pid: SHARDS // 2}, 30, 0.05,
                   "a and b hold 4 shards each")
        runner.write(ops[third:2 * third])
        last: list[str] = []
        inputs = inputs_after(ops[:2 * third])

        def settled() -> bool:
            last[:] = differences(runner, inputs)
            return not last

        try:
            wait_until(settled, 30, 0.2, "the two processes settle at settle()'s fixed point")
        except AssertionError:
            raise AssertionError("\n".join(last[:10])) from None

        a.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: Counter(holders(runner).values()) == {b.pid: SHARDS}, 4 * LEASE, 0.02,
                   "b takes a's shards")
        took = time.monotonic() - killed
        said = (a.stderr.read() if a.stderr else b"").decode()
        assert re.search(r"memory let go of [1-9]\d* key", said), \
            "a, giving b its share, lets go of what only their nodes' judgments read"
        # Within the lease time and a fifth, and the look-at interval (a fifth, at most a second) of b.
        assert took <= LEASE * 1.2 + min(LEASE / 5, 1.0) + 0.5, f"b took a's shards {took:.2f} s after the kill"
        # The rest of the history while a is gone: every node is b's to compose now, a's included.
        runner.write(ops[2 * third:])
        inputs = mesh.inputs
        try:
            wait_until(settled, 30, 0.2, "b alone settles at settle()'s fixed point")
        except AssertionError:
            raise AssertionError("\n".join(last[:10])) from None
        _, asked_twice = check.asked_once(runner.bus)
        assert asked_twice == []
        assert stop(b) == 0, (b.stderr.read() if b.stderr else b"").decode()[-2000:]
        # A clean exit gives every shard back.
        assert holders(runner) == {}
    finally:
        for p in (a, b):
            if p is not None:
                stop(p)
