"""Helpers the tests share: deadline-based waiting (the only way a test waits), a nats-server, seeding buckets."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import nats
import nats.js.errors

from mesh_provisioner.bus.embedded import EmbeddedServer, free_port
from mesh_provisioner.contract import bucket
from meshcheck.bus import until

T = TypeVar("T")
__all__ = ["NatsServer", "free_port", "raw_publish", "seed_buckets", "seed_buckets_async", "wait_until"]


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


def raw_publish(url: str, subject: bytes, payload: bytes, timeout: float = 10.0) -> None:
    """Publish with the subject's bytes as they are, as a client in any language may (nats-py sends a str's UTF-8);
    answers once the server has read it (its PONG to the PING after it)."""
    where = urlparse(url)
    with socket.create_connection((where.hostname or "127.0.0.1", where.port or 4222), timeout=timeout) as s:
        s.recv(4096)  # the server's INFO
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPUB ' + subject + b" %d\r\n" % len(payload)
                  + payload + b"\r\nPING\r\n")
        answer = b""
        while b"PONG" not in answer and b"-ERR" not in answer:
            more = s.recv(4096)
            if not more:
                break
            answer += more
    assert b"PONG" in answer, f"the server did not take the publish: {answer!r}"


class NatsServer(EmbeddedServer):
    """The package's embedded nats-server as tests use it: one loopback port and one store, kept over restarts."""

    def __init__(self, root: Path) -> None:
        super().__init__(store=root)
        self.store_dir = root / "js"


def stop(p: subprocess.Popen[bytes]) -> int:
    """SIGTERM a process and answer its exit code (SIGKILL should it not exit within 30 s)."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        return p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
