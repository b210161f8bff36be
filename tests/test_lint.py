"""The code's own checks, run with the tests so that CI holds every change to them: `ruff check .` clean, and
`mypy --strict` clean on the package, which ships `py.typed`, and on the fault runner and its checks
(CONTRIBUTING.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_repository(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--cache-dir", str(tmp_path), "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_ships_py_typed() -> None:
    assert (ROOT / "mesh_provisioner" / "py.typed").is_file()


def test_mypy_strict_finds_nothing_in_the_package_and_the_fault_runner(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path), "mesh_provisioner", "faults",
               "meshcheck"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Success" in done.stdout, done.stdout + done.stderr
