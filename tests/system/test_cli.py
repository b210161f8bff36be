"""The seat process: `reconcile` and `serve` run as `python -m mesh_provisioner` against a real nats-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until
from seatbus import Bus, assert_fixed_point

from mesh_provisioner.cli.options import invoked
from mesh_provisioner.contract import WANTS
from mesh_provisioner.messages import records as r

TIMEOUT = 60.0


def seat_command(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "mesh_provisioner", "--nats", url, *args]


def environment() -> dict[str, str]:
    """The process's environment, none of the seat's settings leaking in from the test's."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MESH_PROVISIONER_", "NATS_"))}


def test_reconcile_composes_once_and_exits_0_with_a_summary(mesh: Bus) -> None:
    done = subprocess.run(
        seat_command(mesh.url, "reconcile", "--timeout", str(TIMEOUT)),
        capture_output=True, text=True, timeout=TIMEOUT + 30, env=environment(), check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("settled in ") and "writes" in done.stdout, done.stdout
    assert mesh.plan("ace.gitea") is not None
    p = mesh.provision("bee.oldapp.postgres-database")
    assert p is not None and p.state == r.RETIRING and p.ask
    # Run again over what it wrote: a fixed point, so nothing changes.
    again = subprocess.run(
        seat_command(mesh.url, "reconcile", "--timeout", str(TIMEOUT)),
        capture_output=True, text=True, timeout=TIMEOUT + 30, env=environment(), check=False,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().endswith("nothing changed"), again.stdout


def test_serve_reacts_to_changes_and_exits_0_on_sigterm(mesh: Bus, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(seat_command(mesh.url, "serve"), stdout=out, stderr=subprocess.STDOUT,
                                env=environment())
    try:
        wait_until(lambda: mesh.plan("ace.gitea") is not None, TIMEOUT, interval=0.05, what="serve composed the mesh")
        mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})
        held = wait_until(lambda: mesh.refusal("bee.mailer"), TIMEOUT, interval=0.05, what="serve woken by a want")
        assert "ml9" in held.why
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert_fixed_point(mesh)


def test_a_command_line_to_copy_names_the_program_as_it_was_started(monkeypatch: pytest.MonkeyPatch) -> None:
    # "mesh-provisioner ..." is not found when the virtualenv's bin is not on PATH, as the README's commands run it.
    monkeypatch.setattr(sys, "argv", [".venv/bin/mesh-provisioner", "demo", "--serve"])
    assert invoked() == ".venv/bin/mesh-provisioner"
    monkeypatch.setattr(sys, "argv", ["/x/mesh_provisioner/__main__.py", "load"])
    assert invoked() == f"{sys.executable} -m mesh_provisioner"
