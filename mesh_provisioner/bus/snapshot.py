"""The bus read once into memory: for `show`, `reconcile --dry-run` and other readers that judge nothing live."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import READ_CONNECTION, connect
from mesh_provisioner.contract import DEFAULT_BOUND_READS
from mesh_provisioner.rules.memory_view import MemoryView


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


async def snapshot_of(servers: list[str], options: dict[str, Any] | None = None, **kwargs: Any) -> MemoryView:
    """`snapshot` over a connection of its own, closed after."""
    nc = await connect(servers, **{"name": READ_CONNECTION, **(options or {})})
    try:
        return await snapshot(nc, **kwargs)
    finally:
        await nc.close()
