"""`python -m benchmarks.scaling --json FILE`: the seat's cold convergence as the mesh doubles.

For N = 250, 500, 1000 and 2000 nodes (`--quick`: 10, 20, 40), each on a fresh nats-server on loopback: the seeded
mesh of `benchmarks.mesh` loaded, the seat started in a process of its own and timed from `Runtime.start` to
`wait_settled`. `time_ratio_per_doubling` is the geometric mean of t(2N) / t(N) over the doublings: 2 is linear.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.converge import SEED, machine
from benchmarks.harness import SeatProcess, log, stop_cleanly_on_sigterm
from benchmarks.mesh import generate, load
from mesh_provisioner.bus.embedded import EmbeddedServer


def one(nodes: int, seed: int) -> dict[str, Any]:
    """The cold convergence of a mesh of `nodes` nodes on a server of its own."""
    with EmbeddedServer() as server:
        loaded = asyncio.run(load(server.url, generate(nodes, seed)))
        seat = SeatProcess(server.url)
        figures = {"nodes": nodes, "loaded_keys": loaded, **seat.started}
        seat.stop()
    log(f"{nodes} nodes: {figures['seconds']:.2f} s, {figures['writes']} writes")
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--quick", action="store_true", help="small: a smoke run, not a measurement")
    p.add_argument("--nodes", type=int, nargs="*", default=None, help="the sizes (default 250 500 1000 2000)")
    args = p.parse_args(argv)
    stop_cleanly_on_sigterm()
    sizes = args.nodes or ([10, 20, 40] if args.quick else [250, 500, 1000, 2000])
    runs = [one(n, args.seed) for n in sizes]
    ratios = [b["seconds"] / a["seconds"] for a, b in itertools.pairwise(runs) if b["nodes"] == 2 * a["nodes"]]
    out = {
        "seed": args.seed,
        "machine": machine(),
        "command": " ".join(["python -m benchmarks.scaling", *sys.argv[1:]]),
        "runs": runs,
        "ratios": ratios,
        "time_ratio_per_doubling": math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else math.nan,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    for run in runs:
        print(f"{run['nodes']:6d} nodes {run['seconds']:8.2f} s {run['writes']:8d} writes")
    print(f"time_ratio_per_doubling {out['time_ratio_per_doubling']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
