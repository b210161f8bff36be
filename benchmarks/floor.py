"""The bus layer's own ceiling: how fast the seat's writes could land if composing and routing cost nothing.

The seat's cache watches the seat's provisions bucket (each write comes back as its echo, and is put into memory at
its acknowledgement: read your writes), and its store writes batches of compare-and-sets, about a composition's
size each, `max_parallel` batches at once, on one connection and one event loop, as the cold start does. No rule, no
actor, no thread: what is left is nats-py and the bus layer (`bus/cache.py`, `bus/store.py`) alone. Its writes a
second over the put limit is the most `ratio_vs_limit` the seat can reach on this machine; whatever the rules and
the actors cost comes on top.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import ensure_buckets
from mesh_provisioner.bus.store import Store
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.view import PROVISIONS


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
