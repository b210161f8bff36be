"""examples/: each runs as the README says, and does what it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_embedding_example_composes_restarts_an_actor_settles_and_stops() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "embed.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "composed ace: ace, 4 plan(s) written"
    assert lines[1].startswith("children: asker, bound:gitea,") and "node:ace, node:bee" in lines[1]
    assert lines[2] == "settled: True | restarts: {'node:ace': 1}"
    assert done.stderr == ""  # a host's logging is its own: the seat configures none, and warned of nothing
