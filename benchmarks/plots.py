"""`python -m benchmarks.plots --converge FILE --scaling FILE --reliability FILE --out DIR`: the PNG plots of
docs/BENCHMARKS.md and docs/RELIABILITY.md (each input optional; each plot is made from its own).

`scaling.png`: cold convergence time against nodes (log-log, with the linear line through the first point);
`latency.png`: the distributions of change-to-write latency of the steady-state and head-of-line runs;
`reliability.png`: for each fault scenario of the fault runner (`python -m faults`), the time the seat took to settle
after the last fault, every run, and what was lost.
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


def reliability(data: dict[str, Any], out: Path) -> None:
    """Each scenario's settle times after its last fault, one dot a run, on a log scale, with what was lost."""
    names = list(data["scenarios"])
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(names) + 1.5))
    for i, name in enumerate(names):
        runs = data["scenarios"][name]["runs"]
        times = [run["settle_seconds"] for run in runs if run["settle_seconds"] is not None]
        lost = sum(len(run["lost"]) + len(run.get("errors", [])) for run in runs)
        unsettled = sum(run["settle_seconds"] is None for run in runs)
        good = not lost and not unsettled
        if times:
            ax.plot([min(times), max(times)], [i, i], color="lightgrey", linewidth=7, solid_capstyle="round")
            ax.plot(times, [i] * len(times), "o", color="tab:blue")
        words = "nothing lost" if good else f"{lost} lost, {unsettled} did not settle"
        ax.annotate(f"worst {max(times):.2f} s, {words}" if times else words, (max(times) if times else 0.01, i),
                    textcoords="offset points", xytext=(9, -3), fontsize=8, color="black" if good else "red")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(0.01, 200)
    ax.set_xlabel("seconds from the last fault until settled (log scale; one dot a run)")
    ax.set_title(f"After each kind of fault: time to settle again ({data['runs']} runs each)", fontsize=10)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__)
    p.add_argument("--converge", type=Path, help="the JSON of benchmarks.converge: latency.png")
    p.add_argument("--scaling", type=Path, help="the JSON of benchmarks.scaling: scaling.png")
    p.add_argument("--reliability", type=Path, help="the JSON of the fault runner: reliability.png")
    p.add_argument("--out", type=Path, default=Path("docs"))
    args = p.parse_args(argv)
    if not (args.converge or args.scaling or args.reliability):
        p.error("give --converge, --scaling or --reliability (or several)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scaling:
        scaling(json.loads(args.scaling.read_text()), args.out / "scaling.png")
    if args.converge:
        latency(json.loads(args.converge.read_text()), args.out / "latency.png")
    if args.reliability:
        reliability(json.loads(args.reliability.read_text()), args.out / "reliability.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
