"""The fault runner run as a user runs it: `python -m faults ...` at the repository's root, its output kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run_faults(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m faults ARGS` from the repository's root, bounded by `timeout` s."""
    return subprocess.run([sys.executable, "-m", "faults", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
