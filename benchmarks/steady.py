"""Steady-state load on a settled seat, timed from outside: each change to the write it causes.

The load changes what providers say, at a fixed rate, on loopback, for a bounded time: a `bound` entry (the key
turns failed with a why that names the change, or provided with a generation that names it), a have (a provider
judged by its have fails with a detail that names the change, or runs again), or a want (a provider judged by its
have is wanted at another build, so its keys turn asked, or at its build again, so they turn provided). Each change's
resulting provision state is known beforehand; a watch of `mesh-provisioner.provisions` (an ordered JetStream
consumer of new messages: writes that landed) matches each write to the change that caused it, and each match is
one latency sample, from just before the change was published to the moment the write was seen.

A target (a key, or a provider on a node) has at most one change outstanding: it is changed again only once every
write its last change causes has been seen, or after `expire` seconds (counted as missed).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import nats
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from benchmarks.mesh import Mesh
from mesh_provisioner.actors.base import BATCH
from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.contract import HAVE, PROVISIONS, WANTS, bound, bucket


class _Ref(msgspec.Struct):
    generation: int = 0


class _Written(msgspec.Struct):
    """What the watch reads of a provision write."""

    state: str = ""
    why: str = ""
    reference: _Ref | None = None
    depends_on: list[str] = msgspec.field(name="depends-on", default_factory=list)


_decode = msgspec.json.Decoder(_Written).decode


@dataclass
class Target:
    """Something the load changes: a key's bound entry, or a provider module's have or want on a node."""

    kind: str  # "bound", "have", "want"
    keys: list[str]  # the provision keys its change writes
    module: str = ""
    node: str = ""
    flipped: bool = False  # whether its last change took it away from provided
    heavy: bool = False


# Changes by how many keys each changes: one key, what the seat writes in one batch, more (actors/base.py `BATCH`).
FAN_OUTS: Final = ((1, "1 key"), (BATCH, f"2 to {BATCH} keys"), (None, f"more than {BATCH} keys"))


def fan_out(keys: int) -> str:
    """The `FAN_OUTS` bucket of a change of `keys` keys."""
    return next(name for most, name in FAN_OUTS if most is None or keys <= most)


@dataclass
class Load:
    """What one load run measured."""

    changes: int = 0
    samples: list[float] = field(default_factory=list)  # ms
    missed: int = 0
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    # The samples by how many keys the change that made them changed: one change of a provider with a thousand
    # consumers is a thousand samples, the last of them as late as the seat takes to write a thousand keys.
    by_fan_out: dict[str, list[float]] = field(default_factory=dict)
    # How many keys each change timed was to change.
    fan_outs: list[int] = field(default_factory=list)
    heavy_changes: int = 0
    seconds: float = 0.0

    def percentile(self, q: float) -> float:
        """The q-th percentile of the samples (nearest rank), in ms."""
        if not self.samples:
            return float("nan")
        ordered = sorted(self.samples)
        rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
        return ordered[rank]

    def p99_floor(self, puts_per_s: float) -> float:
        """The lowest p99 a seat writing at `puts_per_s` could give these changes, in ms: the k-th key a change changes
        is written no sooner than k puts after the change (each change alone, nothing else written meanwhile).

        Each write's latency is at least its bound, so the p99 of the writes is at least the p99 of the bounds."""
        return Load(samples=[k / puts_per_s * 1000 for n in self.fan_outs for k in range(1, n + 1)]).percentile(99)


async def provision_states(nc: Client) -> dict[str, _Written]:
    """Every provision key's current state, read once as the seat's cache loads a bucket (a bare watch may say it
    has delivered every value before it has, and the read then finds nothing)."""
    cache = Cache(nc, states=[PROVISIONS])
    await cache.start()
    try:
        await cache.wait_synced(60)
    finally:
        await cache.stop()
    out: dict[str, _Written] = {}
    for key in cache.view.keys(PROVISIONS):
        e = cache.view.get(PROVISIONS, key)
        if e is not None and e.raw:
            out[key] = _decode(e.raw)
    return out


def targets(mesh: Mesh, states: dict[str, _Written], seed: int) -> dict[str, list[Target]]:
    """The targets of each kind: keys whose bound entry exists and is provided, and providers judged by their have
    on a node every key of which is provided (so a change of their word changes every one of those keys)."""
    rnd = random.Random(seed)
    entries = {key for state, kv in mesh.states.items() if state.endswith(".bound") for key in kv}
    bound_keys = sorted(
        key for key, k in mesh.keys.items()
        if k.bound and key in entries and (s := states.get(key)) is not None and s.state == "provided"
    )
    by_provider: dict[tuple[str, str], list[str]] = {}
    for key, k in mesh.keys.items():
        if not k.bound and k.provider not in mesh.bound_providers:
            by_provider.setdefault((k.provider, k.provider_node), []).append(key)
    judged = sorted(
        (pm, keys) for pm, keys in by_provider.items()
        if all((s := states.get(key)) is not None and s.state == "provided" for key in keys)
    )
    # A key a have-judged target's key depends on (its credential) is left alone: changing it would change that
    # key's state too, and the two changes' expected writes would cross.
    needed = {dep for _, keys in judged for key in keys for dep in states[key].depends_on}
    bound_keys = [key for key in bound_keys if key not in needed]
    rnd.shuffle(bound_keys)
    rnd.shuffle(judged)
    out: dict[str, list[Target]] = {"bound": [Target("bound", [key]) for key in bound_keys], "have": [], "want": []}
    for i, ((module, node), keys) in enumerate(judged):
        kind = "have" if i % 2 == 0 else "want"
        out[kind].append(Target(kind, sorted(keys), module, node))
    return out


class Driver:
    """Publishes changes at a rate and matches the seat's writes to them."""

    def __init__(self, url: str, pools: dict[str, list[Target]], seed: int, *, expire: float = 5.0) -> None:
        self.url = url
        self.pools = {kind: deque(pool) for kind, pool in pools.items()}
        self.rnd = random.Random(seed)
        self.expire = expire
        self.seq = 0
        # key -> (predicate, sent at, target, kind)
        self.pending: dict[str, tuple[Callable[[_Written], bool], float, Target, str]] = {}
        self.outstanding: dict[int, tuple[Target, set[str], float]] = {}
        self.busy: set[int] = set()
        self.load = Load()
        self.counting = True

    async def _on_write(self, msg: Any) -> None:
        seen = time.perf_counter()
        key = msg.subject[len(self._prefix):]
        hit = self.pending.get(key)
        if hit is None or not msg.data:
            return
        predicate, sent, target, kind = hit
        try:
            written = _decode(msg.data)
        except msgspec.DecodeError:
            return
        if not predicate(written):
            return
        del self.pending[key]
        ms = (seen - sent) * 1000
        if self.counting:
            self.load.samples.append(ms)
            self.load.by_kind.setdefault(kind, []).append(ms)
            self.load.by_fan_out.setdefault(fan_out(len(target.keys)), []).append(ms)
        _, left, _ = self.outstanding[id(target)]
        left.discard(key)
        if not left:
            del self.outstanding[id(target)]
            self.busy.discard(id(target))

    def _expire(self, now: float) -> None:
        for tid, (_target, left, sent) in list(self.outstanding.items()):
            if now - sent > self.expire:
                if self.counting:
                    self.load.missed += len(left)
                for key in left:
                    self.pending.pop(key, None)
                del self.outstanding[tid]
                self.busy.discard(tid)

    def _pick(self, kind: str) -> Target | None:
        pool = self.pools.get(kind)
        if not pool:
            return None
        for _ in range(len(pool)):
            target = pool[0]
            pool.rotate(-1)
            if id(target) not in self.busy:
                return target
        return None

    def _change(self, target: Target, mesh_bound: dict[str, str]) -> tuple[str, str, bytes, Callable[[_Written], bool]]:
        """The key to put, its value, and what each of the target's keys is to say once the seat has judged it."""
        self.seq += 1
        tag = f"bench-{self.seq}"
        target.flipped = not target.flipped
        if target.kind == "bound":
            key = target.keys[0]
            provider = mesh_bound[key]
            if target.flipped:
                value = {"state": "failed", "why": tag}
                return bound(provider), key, _json(value), lambda w, t=tag: w.state == "failed" and w.why == t
            generation = 1_000_000 + self.seq
            entry = {"state": "provided", "vault-name": f"vault/{key}", "generation": generation}
            return bound(provider), key, _json(entry), (
                lambda w, g=generation: w.state == "provided" and w.reference is not None
                and w.reference.generation == g
            )
        if target.kind == "have":
            have_key = f"{target.node}.{target.module}"
            if target.flipped:
                value = {"fp": "1", "phase": "failed", "health": "failed", "detail": tag}
                return HAVE, have_key, _json(value), lambda w, t=tag: w.state == "failed" and w.why == t
            value = {"fp": "1", "phase": "running", "health": "ok"}
            return HAVE, have_key, _json(value), lambda w: w.state == "provided"
        want_key = f"want.{target.node}.{target.module}"
        if target.flipped:
            return WANTS, want_key, _json({"fp": "2"}), lambda w: w.state == "asked"
        return WANTS, want_key, _json({"fp": "1"}), lambda w: w.state == "provided"

    async def run(
        self,
        rate: float,
        seconds: float,
        mix: dict[str, int],
        mesh_bound: dict[str, str],
        *,
        heavy: Target | None = None,
        heavy_rate: float = 0.0,
        settle: float = 5.0,
    ) -> Load:
        """Change `rate` targets a second for `seconds`, kinds drawn by `mix`'s weights; with `heavy`, also change
        the heavy node `heavy_rate` times a second (its changes cause no write; they keep it composing)."""
        nc = await nats.connect(self.url)
        js = nc.jetstream(timeout=10)
        self._prefix = f"$KV.{bucket(PROVISIONS)}."
        sub = await js.subscribe(
            self._prefix + ">", cb=self._on_write, ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
        )
        kinds = [k for k, w in mix.items() for _ in range(w)]
        tick = 0.01
        per_tick = rate * tick
        heavy_per_tick = heavy_rate * tick
        owed = heavy_owed = 0.0
        start = time.perf_counter()
        next_tick = start
        try:
            while (now := time.perf_counter()) - start < seconds:
                self._expire(now)
                owed += per_tick
                heavy_owed += heavy_per_tick
                while owed >= 1:
                    owed -= 1
                    kind = kinds[self.rnd.randrange(len(kinds))]
                    target = self._pick(kind)
                    if target is None:
                        continue
                    state, key, value, predicate = self._change(target, mesh_bound)
                    sent = time.perf_counter()
                    self.busy.add(id(target))
                    self.outstanding[id(target)] = (target, set(target.keys), sent)
                    for k in target.keys:
                        self.pending[k] = (predicate, sent, target, kind)
                    await nc.publish(f"$KV.{bucket(state)}.{key}", value)
                    self.load.changes += 1
                    if self.counting:
                        self.load.fan_outs.append(len(target.keys))
                while heavy is not None and heavy_owed >= 1:
                    heavy_owed -= 1
                    self.seq += 1
                    module = heavy.keys[self.seq % len(heavy.keys)]
                    tick_have = {"fp": "1", "phase": "running", "health": "ok", "detail": f"tick-{self.seq}"}
                    await nc.publish(f"$KV.{bucket(HAVE)}.{heavy.node}.{module}", _json(tick_have))
                    self.load.heavy_changes += 1
                next_tick += tick
                await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))
            self.load.seconds = time.perf_counter() - start
            # Let the last changes' writes come, then count what never came as missed.
            deadline = time.perf_counter() + settle
            while self.outstanding and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
            self._expire(float("inf"))
        finally:
            await sub.unsubscribe()
            await nc.close()
        return self.load


async def restore(url: str, pools: dict[str, list[Target]], mesh_bound: dict[str, str]) -> int:
    """Put every target a run left away from provided back as it was; answers how many."""
    nc = await nats.connect(url)
    n = 0
    try:
        js = nc.jetstream(timeout=30)
        for pool in pools.values():
            for t in pool:
                if not t.flipped:
                    continue
                t.flipped = False
                n += 1
                if t.kind == "bound":
                    key = t.keys[0]
                    value = {"state": "provided", "vault-name": f"vault/{key}", "generation": 1}
                    await js.publish(f"$KV.{bucket(bound(mesh_bound[key]))}.{key}", _json(value))
                elif t.kind == "have":
                    value = {"fp": "1", "phase": "running", "health": "ok"}
                    await js.publish(f"$KV.{bucket(HAVE)}.{t.node}.{t.module}", _json(value))
                else:
                    await js.publish(f"$KV.{bucket(WANTS)}.want.{t.node}.{t.module}", _json({"fp": "1"}))
    finally:
        await nc.close()
    return n


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
