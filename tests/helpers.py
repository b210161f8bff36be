"""Helpers the tests share: deadline-based waiting (the only way a test waits), a nats-server, seeding buckets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import nats
import nats.js.errors

from faults.bus import until
from mesh_provisioner.bus.embedded import EmbeddedServer, free_port
from mesh_provisioner.rules.view import bucket

T = TypeVar("T")
__all__ = ["NatsServer", "free_port", "seed_buckets", "seed_buckets_async", "wait_until"]


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> T:
    """Poll `predicate` until it answers something true and answer that; fail the test past `timeout` seconds."""
    try:
        value: T = until(predicate, timeout, interval, what)
    except TimeoutError as err:
        raise AssertionError(str(err)) from None
    return value


async def seed_buckets_async(url: str, states: Iterable[str], *, history: int = 1) -> list[str]:
    """Create the bucket of each state that has none, as the modules that own them would; answers those made."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        made = []
        for state in states:
            try:
                await js.stream_info(f"KV_{bucket(state)}")
            except nats.js.errors.NotFoundError:
                await js.create_key_value(bucket=bucket(state), history=history)
                made.append(bucket(state))
        return made
    finally:
        await nc.close()


def seed_buckets(url: str, states: Iterable[str], *, history: int = 1) -> list[str]:
    """`seed_buckets_async` from a thread that runs no loop (a test's own)."""
    return asyncio.run(seed_buckets_async(url, states, history=history))


class NatsServer(EmbeddedServer):
    """The package's embedded nats-server as tests use it: one loopback port and one store, kept over restarts."""

    def __init__(self, root: Path) -> None:
        super().__init__(store=root)
        self.store_dir = root / "js"
