"""Random meshes run through a live seat on a real nats-server, each compared with `settle()` of its inputs.

`Runner` keeps one server and one connection of another module (`meshcheck.bus.Bus`) for many meshes. For each mesh it
empties every bucket (a purge of each stream: far quicker than deleting and creating them), plays the mesh's
history (tests/support/meshgen.py) while a seat runs (`Runtime.start`), with the history's kills
(`Runtime.kill`), waits and server restarts, waits until the seat settles, reads every state back from the
server, and compares (tests/support/differential.py): the bus with `settle()` of the final inputs, key by key, and
the bus with its own fixed point.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
import time
from dataclasses import dataclass, field

import nats.js.errors
from nats.js.kv import KeyValue

from mesh_provisioner.bus.cache import watched_states
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.cli.commands import reconcile
from mesh_provisioner.config import Config
from mesh_provisioner.contract import bucket
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.runtime import Runtime
from meshcheck import check
from meshcheck.bus import Bus, seat_config, until
from tests.support.differential import compare, expected, inputs_of, off_fixed_point
from tests.support.meshgen import BOUND_READS, Generated, Op, generate

SETTLE_SECONDS = 30.0
UNSETTLED_MOST = 3
STATES = watched_states(BOUND_READS)


@dataclass
class Outcome:
    """What one mesh's run found: each difference, and what the run did."""

    seed: int
    problems: list[str] = field(default_factory=list)
    kills: int = 0
    restarts: int = 0
    seconds: float = 0.0
    history: str = ""

    def said(self, most: int = 12) -> str:
        """The seed, how to replay it, and its first differences."""
        lines = self.problems[:most] + ([f"... and {len(self.problems) - most} more"] if len(self.problems) > most
                                        else [])
        return (f"seed {self.seed} ({self.kills} kills, {self.restarts} restarts; replay: MESH_DIFF_FIRST={self.seed} "
                f"MESH_DIFF_MESHES=1):\n    " + "\n    ".join(lines))


class Runner:
    """One server, its buckets made once, and meshes run on it one after another."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.bus = Bus(server.url)
        self.config: Config = seat_config(server.url, bound_reads=BOUND_READS, request_timeout=5.0)
        self.made: set[str] = set()
        self._kvs: dict[str, KeyValue] = {}
        for state in STATES:
            self.bucket(state)
        self.bus.create_asks_stream()

    def bucket(self, state: str) -> None:
        """A state's bucket, made the first time a mesh writes it (a provider whose entries the seat does not
        read has one too)."""
        if state not in self.made:
            self.bus.create_bucket(state)
            self.made.add(state)

    def close(self) -> None:
        """Close the connection (the server is the caller's)."""
        self.bus.close()

    def wipe(self) -> None:
        """Every stream on the server emptied: each state's bucket, the seat's lease, the router's asks."""

        async def purge_all() -> None:
            streams = await self.bus.js.streams_info()
            await asyncio.gather(*(self.bus.js.purge_stream(info.config.name) for info in streams
                                   if info.state.messages and info.config.name))

        self.bus.run(purge_all)

    def snapshot(self) -> MemoryView:
        """Every state a mesh wrote or the seat watches, as the server holds it now.

        The keys come from each stream's subjects, not from a key-value watch (`meshcheck.bus.Bus.entries` says why);
        every state and key is asked for at once.
        """

        async def entries(state: str) -> list[tuple[str, bytes]]:
            prefix = f"$KV.{bucket(state)}."
            info = await self.bus.js.stream_info(f"KV_{bucket(state)}", subjects_filter=prefix + ">")
            kv = await self._kv(state)
            keys = [subject.removeprefix(prefix) for subject in sorted(info.state.subjects or {})]
            got = await asyncio.gather(*(kv.get(key) for key in keys), return_exceptions=True)
            out = []
            for key, entry in zip(keys, got, strict=True):
                if isinstance(entry, nats.js.errors.KeyNotFoundError):
                    continue  # deleted: its marker is all that is left
                if isinstance(entry, BaseException):
                    raise entry
                out.append((key, entry.value or b""))
            return out

        async def read() -> list[list[tuple[str, bytes]]]:
            return await asyncio.gather(*(entries(state) for state in states))

        states = sorted(self.made)
        view = MemoryView(BOUND_READS)
        revision = 0
        for state, found in zip(states, self.bus.run(read), strict=True):
            for key, value in found:
                revision += 1
                view.put(state, key, value, revision)
        return view

    async def _kv(self, state: str) -> KeyValue:
        kv = self._kvs.get(state)
        if kv is None:
            kv = self._kvs[state] = await self.bus.js.key_value(bucket(state))
        return kv

    def write(self, ops: list[Op]) -> None:
        """Put and delete keys: sent one after another without waiting in between, the acknowledgements awaited
        together; a key's later step goes only once its earlier one is acknowledged. All again should the server
        be away (the same steps in the same order end at the same values)."""

        async def step(op: Op) -> None:
            kv = await self._kv(op.state)
            if op.value is None:
                await kv.delete(op.key)
            else:
                await kv.put(op.key, op.value)

        async def go() -> None:
            for state in {op.state for op in ops}:
                await self._kv(state)
            sent: list[asyncio.Task[None]] = []
            keys: set[tuple[str, str]] = set()
            for op in ops:
                if (op.state, op.key) in keys:
                    await asyncio.gather(*sent)
                    sent, keys = [], set()
                keys.add((op.state, op.key))
                # A task runs to its publish before the next task starts: they go out in this order.
                sent.append(asyncio.create_task(step(op)))
                await asyncio.sleep(0)
            await asyncio.gather(*sent)

        for op in ops:
            self.bucket(op.state)
        self.bus.run(go)

    def run(self, mesh: Generated) -> Outcome:
        """Play one mesh's history while a seat runs; compare the settled bus with `settle()` of its inputs."""
        started = time.monotonic()
        out = Outcome(mesh.seed, history=mesh.history())
        self.wipe()
        sup: Runtime | None = None
        try:
            batch: list[Op] = []
            for op in mesh.ops:
                if op.kind in ("put", "delete"):
                    batch.append(op)
                    continue
                self.write(batch)
                batch = []
                if op.kind == "start":
                    sup = Runtime.start(self.config)
                elif op.kind == "kill" and sup is not None:
                    children = sorted(sup.children())
                    sup.kill(children[op.pick % len(children)])
                    out.kills += 1
                elif op.kind == "quiet" and sup is not None:
                    sup.wait_settled(SETTLE_SECONDS)
                elif op.kind == "restart":
                    self.server.restart()
                    until(lambda: self.bus.nc.is_connected, SETTLE_SECONDS, what="the writer to reconnect")
                    out.restarts += 1
            self.write(batch)
            assert sup is not None, "the history never starts the seat"
            if not sup.wait_settled(SETTLE_SECONDS):
                out.problems.append(f"the seat did not settle within {SETTLE_SECONDS:g} s: {sup.status()}")
            live = self.snapshot()
        finally:
            if sup is not None:
                sup.stop()
        held = inputs_of(live)
        for state, key in sorted(held.keys() ^ mesh.inputs.keys() | {k for k in held if held[k] != mesh.inputs.get(k)}):
            out.problems.append(f"the bus holds {held.get((state, key))!r} at {state} {key}, not the mesh's final "
                                f"input {mesh.inputs.get((state, key))!r}")
        out.problems += compare(expected(mesh.inputs), live) + off_fixed_point(live)
        out.seconds = time.monotonic() - started
        return out


    def load(self, view: MemoryView) -> None:
        """The bus emptied, then holding exactly what a view holds (the inputs and the seat's own states)."""
        self.wipe()
        self.write([Op("put", state, key, e.raw) for state in sorted(view.states()) for key in sorted(view.keys(state))
                    if (e := view.get(state, key)) is not None])

    def started_again(self, where: str, *, settled: bool) -> list[str]:
        """A fresh seat, then a `reconcile`, on a bus: each writes nothing when the bus is `settled`, and either way
        they leave it at the fixed point (contract section 6), which `settle()` of the bus then says."""
        fresh = check.fixed_point(self.bus, self.config, SETTLE_SECONDS)
        problems = [f"{where}: {p}" for p in fresh if settled or "did not settle" in p]
        before = self.bus.last_seqs()
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            code = reconcile(self.config, SETTLE_SECONDS, False, threading.Event())
        if code != 0 or (settled and ("nothing changed" not in said.getvalue() or self.bus.last_seqs() != before)):
            problems.append(f"{where}: a reconcile exited {code}, said {said.getvalue().strip()!r}, and the seat's "
                            f"states moved from {before} to {self.bus.last_seqs()}")
        problems += [f"{where}, after a fresh seat and a reconcile: {p}" for p in off_fixed_point(self.snapshot())]
        return problems


def run_meshes(runner: Runner, seeds: range, *, restart_every: int = 0, repeat: int = 1) -> list[Outcome]:
    """Run the meshes of a seed range, each `repeat` times (a race may show once in a few runs); with
    `restart_every` n, every n-th seed's history restarts the server. Stops after `UNSETTLED_MOST` meshes whose
    seat did not settle: each waited `SETTLE_SECONDS` already."""
    out: list[Outcome] = []
    for seed in seeds:
        for _ in range(repeat):
            out.append(runner.run(generate(seed, restart=bool(restart_every) and seed % restart_every == 0)))
            if sum(any("did not settle" in p for p in o.problems) for o in out) >= UNSETTLED_MOST:
                out[-1].problems.append(f"stopped after {UNSETTLED_MOST} meshes whose seat did not settle")
                return out
    return out
