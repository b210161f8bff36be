"""`python -m benchmarks.plots --converge FILE --scaling FILE --reliability FILE --out DIR`: the PNG plots of
docs/BENCHMARKS.md and docs/RELIABILITY.md (each input optional; each plot is made from its own).

`scaling.png`: cold convergence time against nodes (log-log, with the linear line through the first point);
`latency.png`: the distributions of change-to-write latency of the steady-state and head-of-line runs;
`reliability.png`: for each fault scenario of the fault runner (`python -m faults`), the time the seat took to settle
after the last fault, every run, and what was lost; `soak.png`, from the same JSON when it has a soak
(`python -m faults --soak MINUTES`): the seat process's memory, file descriptors, threads, asyncio tasks and
change-to-write latency over the soak, each in a panel of its own.
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
from matplotlib import ticker


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


def soak(data: dict[str, Any], out: Path) -> None:
    """The soak's samples over time, one panel each: the warm-up shaded, and each judged resource's limit drawn."""
    samples = data["samples"]
    v = data["verdict"]
    minutes = [x["seconds"] / 60 for x in samples]
    warmup = v["warmup_seconds"] / 60
    panels = [("rss_bytes", "resident memory, MiB", 1 / 2**20), ("fds", "open file descriptors", 1.0),
              ("threads", "threads", 1.0), ("tasks", "asyncio tasks", 1.0)]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(7, 9), sharex=True)
    for ax, (name, label, scale) in zip(axes, panels, strict=False):
        xs = [m for m, x in zip(minutes, samples, strict=True) if x[name] is not None]
        ys = [x[name] * scale for x in samples if x[name] is not None]
        ax.plot(xs, ys, ".-", markersize=3)
        r = v["resources"].get(name, {})
        if r.get("judged"):
            limit = r["start"] * (1 + v["growth_limit"]) * scale
            ax.axhline(limit, color="grey", linestyle=":", linewidth=1,
                       label=f"the limit: the start's value + {v['growth_limit']:.0%}")
            ax.set_title(f"{label}: {r['growth']:+.1%} after the warm-up", fontsize=9,
                         color="black" if r["flat"] else "red")
            if name == panels[0][0]:
                ax.legend(fontsize=7, loc="lower right")
        else:
            ax.set_title(f"{label}: not judged", fontsize=9)
        ax.set_ylabel(label.split(",")[-1].strip() if "," in label else "", fontsize=8)
    ax = axes[-1]
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        xs = [m for m, x in zip(minutes, samples, strict=True) if x[key] is not None]
        ax.plot(xs, [x[key] for x in samples if x[key] is not None], ".-", markersize=3, label=f"{label} of the window")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_ylabel("ms (log)", fontsize=8)
    p = v["p99"]
    title = "change-to-write latency"
    if p.get("judged"):
        title += f": p99 {p['first_ms']:.0f} ms in the first fifth after the warm-up, {p['last_ms']:.0f} ms in the last"
    ax.set_title(title, fontsize=9, color="black" if p.get("flat", True) else "red")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_xlabel("minutes of load")
    for a in axes:
        a.axvspan(0, warmup, color="lightgrey", alpha=0.5, linewidth=0)
        a.grid(True, alpha=0.3)
        a.tick_params(labelsize=8)
    verdict = "flat" if v["flat"] else ("not judged" if not v["judged"] else "NOT flat")
    fig.suptitle(f"Soak: {data['nodes']:,} nodes, {data['rate']:g} changes/s for {data['minutes']:g} min: {verdict} "
                 f"(warm-up shaded)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__)
    p.add_argument("--converge", type=Path, help="the JSON of benchmarks.converge: latency.png")
    p.add_argument("--scaling", type=Path, help="the JSON of benchmarks.scaling: scaling.png")
    p.add_argument("--reliability", type=Path,
                   help="the JSON of the fault runner: reliability.png, and soak.png when it has a soak")
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
        data = json.loads(args.reliability.read_text())
        if "scenarios" in data:
            reliability(data, args.out / "reliability.png")
        if "soak" in data:
            soak(data["soak"], args.out / "soak.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
