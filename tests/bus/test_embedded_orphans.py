"""A nats-server started the package's way dies with the process that started it, however that process ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import wait_until

from mesh_provisioner.bus import embedded
from mesh_provisioner.bus.embedded import TemporaryStore

ROOT = Path(__file__).resolve().parents[2]

# The owner: starts a server (from its main thread, or from a thread that ends before the owner does), writes the
# server's pid and whether it still takes clients once the starting thread is over, then waits to be killed.
OWNER = """
import sys, threading
from pathlib import Path
from mesh_provisioner.bus.embedded import EmbeddedServer

server = EmbeddedServer(store=Path(sys.argv[1]) / "store")
if sys.argv[3] == "thread":
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
else:
    server.start()
assert server.process is not None
Path(sys.argv[2]).write_text(f"{server.process.pid} {server.ready()}")
sys.stdin.read()
"""


def alive(pid: int) -> bool:
    """Whether a process runs (Linux: a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
@pytest.mark.parametrize("starter", ["main", "thread"])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_server_dies_with_its_owner(tmp_path: Path, how: signal.Signals, starter: str) -> None:
    said = tmp_path / "pid"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path), str(said), starter], cwd=ROOT, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pid = 0
    try:
        words = wait_until(lambda: said.exists() and said.read_text().split(), timeout=30,
                           what="the owner to start its server")
        pid = int(words[0])
        assert words[1] == "True", "the server died with the thread that started it"
        assert alive(pid)
        owner.send_signal(how)
        assert owner.wait(30) == -how
        wait_until(lambda: not alive(pid), timeout=15, what=f"the server (pid {pid}) gone after its owner's {how.name}")
    finally:
        owner.kill()
        owner.wait()
        if pid and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# A store's owner: makes a temporary store, says where, then exits as told (after a line on stdin).
STORE_OWNER = """
import os, signal, sys
from mesh_provisioner.bus.embedded import TemporaryStore

store = TemporaryStore()
print(store.path, flush=True)
sys.stdin.readline()
if sys.argv[1] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_store_left_by_a_killed_owner_is_removed_by_the_next_one_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}

    def owner(how: str) -> tuple[subprocess.Popen[str], Path]:
        proc = subprocess.Popen([sys.executable, "-c", STORE_OWNER, how], cwd=ROOT, env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        return proc, Path(proc.stdout.readline().strip())

    killed, left = owner("killed")
    exits, removed_at_exit = owner("exits")
    try:
        assert left.parent == tmp_path and (left / embedded.OWNER).is_file()
        mine = TemporaryStore()
        TemporaryStore().close()  # this process's other store lives too (a fault run starts several servers)
        assert left.is_dir() and removed_at_exit.is_dir() and mine.path.is_dir(), "a live owner's store was removed"
        mine.close()
        killed.communicate("\n", timeout=30)
        exits.communicate("\n", timeout=30)
        assert killed.returncode == -signal.SIGKILL and exits.returncode == 0
        assert left.is_dir() and not removed_at_exit.exists()  # an exit without close removes it, as before
        made = TemporaryStore()
        assert not left.exists(), "the store of a killed owner was left"
        assert made.path.is_dir()
        made.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        for proc in (killed, exits):
            proc.kill()
            proc.wait()


def test_a_store_no_process_owns_is_removed_once_a_minute_untouched(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A server started as its owner's start was cut short (a SIGTERM as it forked) makes its store again after the
    # owner removed it at exit, then dies with the owner: a store with no owner and no log. So does an owner killed
    # between making the directory and taking its lock.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = time.time() - embedded.ABANDONED_AFTER - 5

    def store(name: str, *files: str, mtime: float = old) -> Path:
        path = tmp_path / (embedded.STORE_PREFIX + name)
        (path / "js" / "jetstream").mkdir(parents=True)
        for f in files:
            (path / f).write_text("")
        os.utime(path, (mtime, mtime))
        return path

    remade = store("remade")
    half_made = store("half-made", embedded.OWNER + ".new")
    live_without_owner = store("logging", embedded.LOG)  # a server's store made before stores had owners
    being_made = store("being-made", mtime=time.time())
    made = TemporaryStore()
    try:
        assert not remade.exists() and not half_made.exists()
        assert live_without_owner.is_dir() and being_made.is_dir()
    finally:
        made.close()
