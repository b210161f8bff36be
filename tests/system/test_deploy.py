"""deploy/: the container image's build file copies what the repository has and runs a command line the seat takes;
the systemd unit's command line runs the seat, which stops cleanly on the unit's stop signal."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import NatsServer, free_port, wait_until

from mesh_provisioner.cli import options

ROOT = Path(__file__).parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
UNIT = ROOT / "deploy" / "mesh-provisioner.service"


def instructions(text: str) -> list[tuple[str, str]]:
    """A Containerfile's instructions (continuation lines joined, comments left out)."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for raw in joined.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def unit_settings(text: str) -> dict[str, list[str]]:
    """A unit file's settings, each name with its values in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            name, _, value = line.partition("=")
            out.setdefault(name.strip(), []).append(value.strip())
    return out


def settings_of(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> options.Settings:
    """What the seat makes of a command line and an environment, as the process would (in-process)."""
    for name in [n for n in os.environ if n.startswith(("MESH_PROVISIONER_", "NATS_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return options.settings(options.parser().parse_args(argv))


def test_the_image_copies_only_what_the_repository_has() -> None:
    copies = [rest for word, rest in instructions(CONTAINERFILE.read_text()) if word == "COPY"]
    assert copies
    for rest in copies:
        *sources, _target = shlex.split(rest)
        assert sources
        for source in sources:
            assert not source.startswith("--"), "no COPY --from: one stage, built from the repository's root"
            assert (ROOT / source).exists(), f"the Containerfile copies {source}, which the repository has not"
    installed = (ROOT / "pyproject.toml").read_text()
    assert 'readme = "README.md"' in installed  # the package's build reads it: the image must copy it


def test_the_images_command_line_is_one_the_seat_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = instructions(CONTAINERFILE.read_text())
    entry = next(json.loads(rest) for word, rest in steps if word == "ENTRYPOINT")  # exec form: JSON arrays
    command = next(json.loads(rest) for word, rest in steps if word == "CMD")
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(rest for word, rest in steps if word == "ENV")))
    assert entry == ["mesh-provisioner"] and command == ["serve"]
    assert "mesh-provisioner = \"mesh_provisioner.cli:main\"" in (ROOT / "pyproject.toml").read_text()
    got = settings_of(command, env, monkeypatch)
    assert got.config.metrics_addr == "0.0.0.0:9464" and got.log_format == "json"
    exposed = next(rest for word, rest in steps if word == "EXPOSE")
    assert got.config.metrics_addr.endswith(":" + exposed)


def test_the_units_command_line_runs_the_seat_and_stops_on_its_kill_signal(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = unit_settings(UNIT.read_text())
    program, *args = shlex.split(unit["ExecStart"][0])
    assert Path(program).name == "mesh-provisioner"
    env = dict(value.split("=", 1) for value in unit["Environment"])
    assert settings_of(args, env, monkeypatch).config.servers() == ["nats://127.0.0.1:4222"]
    # The unit's command line, with the test's server and a free port for its metrics.
    port = free_port()
    env.update(NATS_URL=nats_server.url, MESH_PROVISIONER_METRICS_ADDR=f"127.0.0.1:{port}")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MESH_PROVISIONER_", "NATS_"))}
    log = tmp_path / "unit.log"
    with log.open("wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "mesh_provisioner", *args], env={**clean, **env}, stdout=out,
                             stderr=subprocess.STDOUT)
    try:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(ready, 30, 0.05, "the unit's seat is ready")
        p.send_signal(getattr(signal, unit["KillSignal"][0]))
        assert p.wait(float(unit["TimeoutStopSec"][0])) == 0, log.read_text()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert "gave the seat's lease back" in log.read_text()
    # A setting refused exits 2, which the unit does not restart: a restart would only refuse it again.
    assert unit["RestartPreventExitStatus"] == ["2"] and unit["Restart"] == ["on-failure"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_takes_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: the unit is checked as installed with this virtualenv's.
    program = shlex.split(unit_settings(UNIT.read_text())["ExecStart"][0])[0]
    here = Path(sys.executable).parent / "mesh-provisioner"
    if not here.exists():
        pytest.skip("the mesh-provisioner script is not beside this interpreter")
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(program, str(here)))
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert UNIT.name not in done.stderr, done.stderr  # no warning about the unit itself
