"""The range of nats-py the package is pinned to (pyproject.toml) is the range tested.

The suite's own environment has the highest version the range allows (`pip install -e '.[dev]'` takes it); the
slow test here builds a throwaway virtualenv with the lowest and runs the bus layer's tests in it, the tests of
nats-py's defects (tests/bus/test_natsfix.py) among them.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pinned() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The lowest version of nats-py the package takes, and the first it does not."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in dependencies if d.startswith("nats-py"))
    low, high = re.search(r">=\s*([\d.]+)", spec), re.search(r"<\s*([\d.]+)", spec)
    assert low and high, f"nats-py is pinned to a range with a lowest and a first excluded version: {spec}"
    return _version(low.group(1)), _version(high.group(1))


def _version(text: str) -> tuple[int, ...]:
    parts = [int(part) for part in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def test_the_suite_runs_on_a_nats_py_in_the_pinned_range() -> None:
    low, high = pinned()
    assert low <= _version(importlib.metadata.version("nats-py")) < high


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_bus_layer_passes_on_the_lowest_nats_py_pinned(tmp_path: Path) -> None:
    low = ".".join(map(str, pinned()[0]))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # nats-py at the lowest version, in the virtualenv's own site-packages, ahead of everything else ...
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", site, f"nats-py=={low}"], check=True, timeout=600)
    # ... and every other dependency (pytest too) from the suite's own environment, behind it on the path.
    (Path(site) / "suite.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    found = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, nats; print(m.version('nats-py'), nats.__file__)"],
        check=True, capture_output=True, text=True, timeout=60, env=env,
    ).stdout.split()
    assert _version(found[0]) == pinned()[0] and found[1].startswith(site), found
    run = subprocess.run([str(python), "-m", "pytest", "tests/bus", "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                         capture_output=True, text=True, timeout=1100, env=env)
    assert run.returncode == 0, f"the bus layer's tests on nats-py {low}:\n{run.stdout[-6000:]}{run.stderr[-2000:]}"
