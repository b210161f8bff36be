"""The oldest nats-server the seat works with (connection.MIN_SERVER_VERSION): checked at start, refused with both
versions named, and the seat run on that very version when its binary is on this machine."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import NatsServer

from mesh_provisioner.bus import connection
from mesh_provisioner.bus.connection import MIN_SERVER_VERSION, NotConnected, open_bus, version_problem
from mesh_provisioner.bus.embedded import SERVER_ENV, EmbeddedServer
from mesh_provisioner.config import Config
from meshcheck.bus import load_sample

ROOT = Path(__file__).resolve().parents[2]
LOWEST = ".".join(map(str, MIN_SERVER_VERSION))


@pytest.mark.parametrize("version", [LOWEST, "2.9.11", "2.10.0", "2.10.25", "2.15.1", "3.0.0", "2.10.0-beta.2",
                                     "v2.9.10", "2.11.0+build.7"])
def test_a_server_as_new_as_the_lowest_or_newer_serves(version: str) -> None:
    assert version_problem(version) == ""


@pytest.mark.parametrize("version", ["2.9.9", "2.9.0", "2.8.4", "1.4.1", "2.9.9-beta.1"])
def test_an_older_server_is_refused_naming_both_versions(version: str) -> None:
    why = version_problem(version, "127.0.0.1:4222")
    assert f"nats-server {version} at 127.0.0.1:4222 is older than {LOWEST}" in why
    assert f"run nats-server {LOWEST} or newer" in why


@pytest.mark.parametrize("version", ["", "unknown", "2.x", "2"])
def test_a_version_that_cannot_be_read_is_not_refused(version: str) -> None:
    assert version_problem(version) == ""


def test_the_bus_refuses_a_server_older_than_the_lowest(nats_server: NatsServer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # No server older than the lowest is at hand: the lowest is raised past the running one instead.
    monkeypatch.setattr(connection, "MIN_SERVER_VERSION", (99, 0, 0))
    with pytest.raises(NotConnected, match=r"nats-server \d+\.\d+\.\d+\S* at 127\.0\.0\.1:\d+ is older than 99\.0\.0"):
        asyncio.run(open_bus(Config(nats=nats_server.url), 10))


def lowest_binary() -> str | None:
    """A nats-server of the lowest version on this machine (Debian's package installs one in /usr/sbin), if any."""
    for candidate in (shutil.which("nats-server"), "/usr/sbin/nats-server", "/usr/bin/nats-server"):
        if candidate and Path(candidate).exists():
            said = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=10, check=False)
            if said.stdout.strip() == f"nats-server: v{LOWEST}":
                return candidate
    return None


LOWEST_BINARY = lowest_binary()


@pytest.mark.skipif(LOWEST_BINARY is None, reason=f"no nats-server {LOWEST} on this machine (Debian: nats-server)")
def test_the_seat_reconciles_on_the_lowest_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert LOWEST_BINARY is not None
    monkeypatch.setenv(SERVER_ENV, LOWEST_BINARY)
    with EmbeddedServer(store=tmp_path) as server:
        load_sample(server.url)
        done = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "reconcile",
                               "--timeout", "60"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "settled in" in done.stdout, done.stdout
