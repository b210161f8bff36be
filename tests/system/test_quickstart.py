"""The README's quick start, exactly as written, from a fresh clone: both commands, each in a new virtualenv.

The commands are read from the README (its first two `sh` blocks), so this breaks when they drift from what works.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# A few quick files for the test command's run inside this one: the whole suite would run this test again, and take
# minutes more; these prove the dev extra installs pytest and its plugins, and that the tests find the package and a
# nats-server.
INNER_TESTS = ("tests/rules/test_keys_records.py tests/bus/test_bus_connection.py tests/system/test_docs.py "
               "tests/system/test_deploy.py")


def readme_command(which: int) -> str:
    """The README's first (0: run) or second (1: test) set-up command, exactly as written."""
    text = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in text.split("```sh\n")[1:]]
    return blocks[which]


def test_the_quick_start_is_the_readmes_first_two_commands() -> None:
    assert readme_command(0) == (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[demo]' && .venv/bin/mesh-provisioner demo")
    assert readme_command(1) == (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest")
    text = (ROOT / "README.md").read_text()
    assert text.index("```sh") > text.index("## Quick start") > 0
    assert "```" not in text[: text.index("## Quick start")]  # nothing to run before the quick start


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_command(1) in ci


def fresh_clone(tmp_path: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new ones not ignored), in a git repository of their
    own, with no virtualenv."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    copy = tmp_path / "clone"
    for name in files:
        src = ROOT / name
        if src.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(src.read_bytes())
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run(["git", "add", "-A"], cwd=copy, check=True)
    return copy


def clean_environment(**extra: str) -> dict[str, str]:
    """A shell's environment outside any virtualenv, none of the seat's settings in it."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(("MESH_PROVISIONER_", "NATS_"))}
    venv_bin = str(Path(os.environ["VIRTUAL_ENV"]) / "bin") if "VIRTUAL_ENV" in os.environ else ""
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return {**env, **extra}


@pytest.mark.slow
def test_the_quick_start_from_a_fresh_clone_exactly_as_the_readme_says(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    demo = subprocess.run(["bash", "-c", readme_command(0)], cwd=clone, capture_output=True, text=True,
                          timeout=900, env=clean_environment())
    assert demo.returncode == 0, demo.stderr[-3000:]
    for state in ("provided", "asked", "waits", "failed", "retiring"):
        assert f"  {state}  " in demo.stdout, state
    assert "no placed module provides object-storage" in demo.stdout  # a held module
    assert "published ask retire-bee-oldapp-postgres-database" in demo.stderr  # the retiring key's ask
    assert "this process holds the seat" in demo.stderr and "gave the seat's lease back" in demo.stderr
    assert " WARNING " not in demo.stderr and " ERROR " not in demo.stderr and "conflict" not in demo.stderr

    # The test command in a second fresh clone: its own virtualenv, the dev extra, pytest as written. PYTEST_ADDOPTS
    # narrows what it runs (see INNER_TESTS), the command itself is the README's.
    clone = fresh_clone(tmp_path / "second")
    tests = subprocess.run(["bash", "-c", readme_command(1)], cwd=clone, capture_output=True, text=True,
                           timeout=900, env=clean_environment(PYTEST_ADDOPTS=f"-q -p no:cacheprovider {INNER_TESTS}"))
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-3000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert (clone / ".venv" / "bin" / "pytest").exists()
