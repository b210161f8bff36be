"""The benchmarks' code runs: `benchmarks.converge --quick` on a tiny mesh writes every figure (not a speed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("kv_put_limit", "writes", "seconds", "writes_per_s", "ratio_vs_limit", "ratio_vs_seed_design",
           "latency_p50_ms", "latency_p99_ms", "light_p99_ms", "ratio_vs_serial_p99", "peak_rss_bytes_per_key",
           "floor_writes_per_s", "floor_ratio_vs_limit")


@pytest.mark.slow
def test_converge_quick_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.converge", "--nodes", "10", "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    for key in FIGURES:
        assert isinstance(figures[key], int | float), key
    assert figures["writes"] > 0 and figures["seconds"] > 0
    assert figures["steady"]["matched"] > 0
    assert set(figures["head_of_line"]) == {"parallel", "serial"}
    assert figures["bus_floor"]["writes"] == 2000  # the quick limit's puts
