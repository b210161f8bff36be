"""The bus read once into memory: for `show`, `reconcile --dry-run` and other readers that judge nothing live."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import READ_CONNECTION, connect, open_bucket, subject_of
from mesh_provisioner.bus.memory import Memory
from mesh_provisioner.contract import DEFAULT_BOUND_READS
from mesh_provisioner.rules.memory_view import MemoryView

# Keys of a node read at once, at most (`node_snapshot`).
READING: Final = 64


async def snapshot(
    nc: Client | str,
    *,
    bound_reads: Iterable[str] = DEFAULT_BOUND_READS,
    states: Iterable[str] | None = None,
    timeout: float = 60.0,
) -> MemoryView:
    """Every key of the states (default: all the seat watches) as they are now, in a view of their own.

    `nc` is a connection, or server URLs (comma-separated) for a connection of its own, tried once and closed after.
    A bucket that does not exist is read as empty.
    """
    if isinstance(nc, str):
        servers = [u.strip() for u in nc.split(",") if u.strip()]
        return await snapshot_of(servers, {"max_reconnect_attempts": 1}, bound_reads=bound_reads, states=states,
                                 timeout=timeout)
    cache = Cache(nc, bound_reads=bound_reads, states=states)
    await cache.start()
    try:
        await cache.wait_synced(timeout)
    finally:
        await cache.stop()
    return cache.view


async def node_snapshot(
    nc: Client, state: str, node: str, *, bound_reads: Iterable[str] = DEFAULT_BOUND_READS, timeout: float = 60.0,
) -> MemoryView:
    """One node's keys of a state (`<node>.…`) as they are now, in a view of their own; TimeoutError past `timeout`.

    The stream names the subjects it holds under the node, and each key is read: a request a key, not every message
    of the bucket (the verb asked of a node a partitioned process does not compose). Of 44,000 provisions of 1,000
    nodes, a node's 44 took 4 to 5 ms of the loop, and all of them 0.8 s. A bucket that does not exist is read as
    empty; so is a key deleted or purged meanwhile.
    """
    memory = Memory(MemoryView(bound_reads))
    async with asyncio.timeout(timeout):
        try:
            kv, info = await open_bucket(nc.jetstream(timeout=timeout), state, f"{node}.>")
        except nats.js.errors.BucketNotFoundError:
            return memory.view
        prefix = len(subject_of(state, ""))
        # The node's keys, and a key that is the node alone (no key of the contract's, but one a writer may have put).
        keys = [node, *(subject[prefix:] for subject in info.state.subjects or {})]
        room = asyncio.Semaphore(READING)
        reads = [asyncio.ensure_future(_read(kv, key, room)) for key in keys]
        try:
            values = await asyncio.gather(*reads)
        finally:
            for read in reads:  # one failed, or the time is up: the others are not read on
                read.cancel()
    for key, found in zip(keys, values, strict=True):
        if found is not None:
            memory.set(state, key, found.value or b"", found.revision or 0)
    return memory.view


async def _read(kv: KeyValue, key: str, room: asyncio.Semaphore) -> KeyValue.Entry | None:
    """A key's value now, None when it has none (deleted or purged). The key is read as the bus names it, whether or
    not nats-py would take it as a key (memory says why a bad one is bad)."""
    async with room:
        try:
            return await kv.get(key, validate_keys=False)
        except nats.js.errors.KeyNotFoundError:
            return None


async def snapshot_of(servers: list[str], options: dict[str, Any] | None = None, **kwargs: Any) -> MemoryView:
    """`snapshot` over a connection of its own, closed after."""
    nc = await connect(servers, **{"name": READ_CONNECTION, **(options or {})})
    try:
        return await snapshot(nc, **kwargs)
    finally:
        await nc.close()
