"""`mesh-provisioner show` as a process, against a real nats-server holding the sample mesh after a reconcile."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import NatsServer, free_port

from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.samples import sample_mesh


def run(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The command line as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", url, *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def reconciled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with the sample mesh loaded and reconciled once by the seat; answers its URL."""
    server = NatsServer(tmp_path_factory.mktemp("show"))
    server.start()
    try:
        asyncio.run(load_states(server.url, sample_mesh()))
        done = run(server.url, "reconcile", "--timeout", "60")
        assert done.returncode == 0, done.stderr
        yield server.url
    finally:
        server.stop()


def test_show_provided_provisions_as_json(reconciled: str) -> None:
    out = run(reconciled, "show", "provisions", "--state", "provided", "--json")
    assert out.returncode == 0, out.stderr
    entries = json.loads(out.stdout)["entries"]
    assert [e["key"] for e in entries] == [
        "ace.gitea.postgres-database-credential.main",
        "ace.gitea.postgres-database.main",
        "ace.postgres.postgres-database-credential",
        "bee.webapp.oidc-client",
    ]
    assert all(e["value"]["state"] == "provided" for e in entries)
    pg = entries[1]["value"]
    assert pg["provider"] == {"module": "postgres", "node": "ace"}
    assert pg["reference"] == {"id": "vault/ace/gitea/pg", "generation": 3}


def test_show_filters_by_node_and_module(reconciled: str) -> None:
    out = run(reconciled, "show", "provisions", "--node", "bee", "--module", "webapp", "--json")
    assert out.returncode == 0, out.stderr
    states = {e["key"]: e["value"]["state"] for e in json.loads(out.stdout)["entries"]}
    assert states == {"bee.webapp.forge-account": "waits", "bee.webapp.oidc-client": "provided",
                      "bee.webapp.postgres-database": "failed"}
    out = run(reconciled, "show", "plans", "--node", "ace", "--json")
    assert [e["key"] for e in json.loads(out.stdout)["entries"]] == ["ace.gitea", "ace.keycloak", "ace.mesh-vault",
                                                                     "ace.postgres"]


def test_show_tables(reconciled: str) -> None:
    out = run(reconciled, "show", "refused")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["module", "since", "why"]
    assert lines[1].startswith("bee.reports ")
    assert lines[1].endswith("no placed module provides object-storage")
    out = run(reconciled, "show", "provisions", "--state", "retiring")
    assert [line.split()[:2] for line in out.stdout.splitlines()[1:]] == [["bee.oldapp.postgres-database", "retiring"]]


def test_show_graph(reconciled: str, tmp_path: Path) -> None:
    out = run(reconciled, "show", "graph")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('digraph "mesh-provisioner" {')
    assert '"bee.webapp" -> "ace.postgres" [label="postgres-database", color="red"' in out.stdout
    assert '"bee.oldapp" -> "ace.postgres" [label="postgres-database", color="purple"' in out.stdout
    if shutil.which("dot"):
        svg = subprocess.run(["dot", "-Tsvg"], input=out.stdout, capture_output=True, text=True, check=True)
        assert "<svg" in svg.stdout


def test_show_refuses_what_it_cannot_show_before_reading_the_bus(reconciled: str) -> None:
    out = run(reconciled, "show", "plans", "--state", "provided")
    assert out.returncode == 2
    assert "--state narrows provisions only, not plans" in out.stderr
    assert out.stdout == ""


def test_show_without_a_server_fails_rather_than_waiting() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    out = run(url, "show", "provisions", "--timeout", "2", timeout=60)
    assert out.returncode == 1
    assert out.stdout == ""
    assert f"nothing listens at {url}" in out.stderr.splitlines()[-1]
