"""The bus layer's own ceiling: how fast the seat's writes could land if composing and routing cost nothing.

The seat's cache watches the seat's provisions bucket (each write comes back as its echo, and is put into memory at
its acknowledgement: read your writes), and its store writes batches of compare-and-sets, about a composition's
size each, `max_parallel` batches at once, on one connection and one event loop, as the cold start does. No rule, no
actor, no thread: what is left is nats-py and the bus layer (`bus/cache.py`, `bus/store.py`) alone. Its writes a
second over the put limit is the most `ratio_vs_limit` the seat can reach on this machine; whatever the rules and
the actors cost comes on top.

The cold start's ceiling adds what any seat on one interpreter must do besides its writes: load its cache (every
bucket it reads, once: `cache_load`) and run its rules (every node composed once and every key judged once, in
memory: `rules_alone`). Those three, one after the other on one interpreter's CPU with nothing between them, are
the least time a cold start can take here; the fixed point's writes over that time, over the put limit, is the most
`ratio_vs_limit` any such seat could reach (`ceiling`).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import nats

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import ensure_buckets
from mesh_provisioner.bus.store import Store
from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.settle import apply, settle


async def _floor(url: str, writes: int, batch: int, parallel: int, value: bytes) -> dict[str, Any]:
    nc = await nats.connect(url)
    cache = Cache(nc, states=[PROVISIONS])
    store = Store(nc, cache, timeout=60)
    batches = [[Put(PROVISIONS, f"n{b:05d}.app-{i:03d}.postgres-database.main", value, 0)
                for i in range(min(batch, writes - b * batch))] for b in range((writes + batch - 1) // batch)]
    todo = iter(batches)

    async def worker() -> None:
        for writes_of_one in todo:
            applied = await store.apply(writes_of_one)
            if not applied.ok:
                raise RuntimeError(f"a write of the floor did not land: {applied.error}")

    try:
        await ensure_buckets(nc.jetstream(timeout=60), [PROVISIONS])
        await cache.start()
        await cache.wait_synced(60)
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(parallel)))
        while not await cache.caught_up():  # every echo applied, as the seat's settled state needs
            await asyncio.sleep(0.01)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        await cache.stop()
        await nc.close()
    return {"writes": store.writes, "seconds": seconds, "writes_per_s": store.writes / seconds,
            "cpu_us_per_write": cpu / max(store.writes, 1) * 1e6, "batch": batch, "parallel": parallel}


def bus_floor(url: str, writes: int, batch: int, parallel: int, value: bytes) -> dict[str, Any]:
    """`writes` compare-and-sets through the bus layer alone, in batches of `batch`, `parallel` at once, on an empty
    provisions bucket of the server at `url`: writes a second and this process's CPU a write."""
    return asyncio.run(_floor(url, writes, batch, parallel, value))


async def _cache_load(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    cache = Cache(nc, load_timeout=60, request_timeout=60)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        await cache.start()
        await cache.wait_synced(600)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        keys = sum(1 for state in cache.states for _ in cache.view.keys(state))
    finally:
        await cache.stop()
        await nc.close()
    return {"keys": keys, "seconds": seconds, "cpu_seconds": cpu}


def cache_load(url: str) -> dict[str, Any]:
    """The seat's cache loading every bucket it reads from the server at `url`, once: keys, seconds, CPU seconds."""
    return asyncio.run(_cache_load(url))


def _view(states: dict[str, dict[str, bytes]]) -> MemoryView:
    view = MemoryView()
    revision = 0
    for state, values in states.items():
        for key, value in values.items():
            revision += 1
            view.put(state, key, value, revision)
    return view


def rules_alone(states: dict[str, dict[str, bytes]]) -> dict[str, Any]:
    """The seat's rules alone on a mesh's states, in memory: the writes of its fixed point and the rounds settling
    takes, and the CPU seconds of the least composing any seat does (every node composed once, every key judged
    once: settling's first round).

    The round applies each of its writes to memory, as the floor's cache applies each write's echo: that part is
    measured alone (the same writes applied again to the same view) and taken out, so that it is counted once.
    """
    now = datetime.now(UTC)
    mesh = _view(states)
    settled = settle(mesh.copy(), now)
    view = mesh.copy()
    cpu = time.process_time()
    first = settle(view, now, max_rounds=1)
    cpu = time.process_time() - cpu
    view = mesh.copy()
    applying = time.process_time()
    apply(view, first.writes)
    applying = time.process_time() - applying
    return {"writes": len(settled.writes), "rounds": settled.rounds, "settled": settled.settled,
            "first_round_writes": len(first.writes), "first_round_applying_cpu_seconds": applying,
            "first_round_cpu_seconds": cpu - applying}


def ceiling(load: dict[str, Any], rules: dict[str, Any], floor: dict[str, Any], put_limit: float) -> dict[str, Any]:
    """The cold start's least time on one interpreter (its cache loaded, its rules run, the fixed point's writes at
    the floor's CPU a write, one after the other), and the most `ratio_vs_limit` that allows."""
    seconds = load["cpu_seconds"] + rules["first_round_cpu_seconds"] + rules["writes"] * floor["cpu_us_per_write"] / 1e6
    return {"seconds": seconds, "writes": rules["writes"], "writes_per_s": rules["writes"] / seconds,
            "ratio_vs_limit": rules["writes"] / seconds / put_limit}
