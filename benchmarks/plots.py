"""`python -m benchmarks.plots --converge FILE --scaling FILE --out DIR`: the PNG plots of docs/BENCHMARKS.md.

`scaling.png`: cold convergence time against nodes (log-log, with the linear line through the first point);
`latency.png`: the distributions of change-to-write latency of the steady-state and head-of-line runs.
Needs matplotlib (the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def scaling(data: dict[str, Any], out: Path) -> None:
    runs = data["runs"]
    nodes = [r["nodes"] for r in runs]
    seconds = [r["seconds"] for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(nodes, seconds, "o-", label="seat, cold start to settled")
    ax.loglog(nodes, [seconds[0] * n / nodes[0] for n in nodes], "--", color="grey", label="linear")
    for n, s in zip(nodes, seconds, strict=True):
        ax.annotate(f"{s:.1f} s", (n, s), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.set_xlabel("nodes (about 20 modules each)")
    ax.set_ylabel("seconds")
    ax.set_title(f"Cold convergence; time ratio per doubling {data['time_ratio_per_doubling']:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def latency(data: dict[str, Any], out: Path) -> None:
    series = [("steady state", data["steady"])]
    hol = data.get("head_of_line", {})
    if "parallel" in hol:
        series.append((f"heavy node changing, max_parallel={hol['parallel'].get('max_parallel', 0)}", hol["parallel"]))
    if "serial" in hol:
        series.append(("heavy node changing, max_parallel=1", hol["serial"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, run in series:
        samples = sorted(run["samples_ms"])
        if not samples:
            continue
        ys = [(i + 1) / len(samples) for i in range(len(samples))]
        ax.semilogx(samples, ys, label=f"{label} (p99 {run['p99_ms']:.0f} ms, missed {run['missed']})")
    ax.axvline(100, color="grey", linestyle=":", label="100 ms")
    ax.set_xlabel("change to the write it causes, ms (log)")
    ax.set_ylabel("fraction of writes")
    ax.set_title(f"Change-to-write latency, {data['nodes']} nodes, {data['steady']['rate']:.0f} changes/s offered")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__)
    p.add_argument("--converge", type=Path, required=True)
    p.add_argument("--scaling", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("docs"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    scaling(json.loads(args.scaling.read_text()), args.out / "scaling.png")
    latency(json.loads(args.converge.read_text()), args.out / "latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
