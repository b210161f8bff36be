"""`python -m benchmarks.converge --nodes N --json FILE`: every figure of the seat's performance, in one run, on one
nats-server on loopback.

- `kv_put_limit`: pipelined puts a second of one nats-py connection to that server (many published, then their
  acknowledgements gathered), the best of a few window sizes.
- cold convergence of a seeded mesh of N nodes (`benchmarks.mesh`), from `Runtime.start` to `wait_settled`, the
  seat in a process of its own: `writes`, `seconds`, `writes_per_s`, `ratio_vs_limit`, `peak_rss_bytes_per_key`.
- `ratio_vs_seed_design`: on a mesh of 100 nodes, the time of the seeds' way (`benchmarks.seed_design`) over the
  seat's time on the same mesh.
- steady state: changes of providers' words at a rate for a while (`benchmarks.steady`), each timed from outside
  to the write it causes: `latency_p50_ms`, `latency_p99_ms`.
- head-of-line blocking: the same load while one heavy node (500 modules) changes all the time: `light_p99_ms`,
  and `ratio_vs_serial_p99`, the light p99 of a seat with `max_parallel=1` over that of the seat as configured.
- the bus layer's ceiling (`benchmarks.floor`), measured right after the limit: as many compare-and-sets, in batches
  of a node's writes, through the seat's cache and store alone, no rules and no actors: `floor_writes_per_s` and
  `floor_ratio_vs_limit`, the most `ratio_vs_limit` the seat could reach here.
- the cold start's ceiling on one interpreter (`benchmarks.floor.ceiling`): the N-node mesh's cache loaded once
  before the seat starts, its rules run alone in memory, and the fixed point's writes at the floor's CPU a write:
  `ceiling_seconds`, the least CPU a cold start needs, and `ceiling_ratio_vs_limit`; `ratio_vs_ceiling`, the cold
  start's seconds over it.
- scale-out (`benchmarks.partitioned`): one process and two sharing the mesh (contract 8.1), each cold started,
  driven to its saturation rate (`saturation_changes_per_s`) and measured at half of it: `scale_out_cold_start`,
  `scale_out_saturation`, `p99_over_p50_half_saturation`, `ratio_vs_serial_p99_half_saturation`,
  `rss_two_over_one` (the two processes' peak RSS summed, over one process's), `cpu_two_over_one` (the CPU of their
  cold start summed, over one process's) and `scale_out_cold_start_cpu_bound` (the most `scale_out_cold_start` this
  machine's cores allow for that CPU and the server's); `p99_floor_over_p50_half_saturation`, the least
  `p99_over_p50_half_saturation` the changes made allow at the server's `kv_put_limit` (`steady.Load.p99_floor`: the
  k-th key a change changes is written no sooner than k puts after it), over the p50 measured.

`--quick` makes everything small (a smoke run for the tests, not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import nats
import nats.js.errors

from benchmarks import partitioned, seed_design, steady
from benchmarks.floor import bus_floor, cache_load, ceiling, rules_alone
from benchmarks.harness import (
    SeatProcess,
    difference,
    log,
    provision_states_of,
    put_states,
    reset,
    stop_cleanly_on_sigterm,
    summary,
)
from benchmarks.mesh import generate, load
from mesh_provisioner.bus.embedded import EmbeddedServer, server_binary
from mesh_provisioner.config import Config

SEED = 20261203


# ---- the bus ------------------------------------------------------------------------------------------------------


async def _put_limit(url: str, n: int, window: int, value: bytes) -> float:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=60)
        name = f"bench_limit_{window}"
        await js.create_key_value(bucket=name, history=1)
        start = time.perf_counter()
        for i in range(0, n, window):
            batch = range(i, min(n, i + window))
            acks = await asyncio.gather(*(js.publish(f"$KV.{name}.k{j}", value) for j in batch))
            assert all(a.seq for a in acks)
        rate = n / (time.perf_counter() - start)
        await js.delete_key_value(name)
        return rate
    finally:
        await nc.close()


# About a node's writes in the cold start of the benchmark's mesh (64,000 to 72,000 for 1,000 nodes).
FLOOR_BATCH = 64
# A value the size of a typical provision record: what the limit and the floor write.
RECORD = json.dumps({
    "provision": "postgres-database", "local": "main",
    "consumer": {"module": "app-017", "node": "n00042"}, "provider": {"module": "postgres", "node": "n00007"},
    "depends-on": ["n00042.app-017.postgres-database-credential.main"], "state": "provided",
    "reference": {"id": "vault/n00042.app-017.postgres-database.main", "generation": 1},
    "at": "2026-12-03T05:00:00.123456Z", "v": 1,
}, separators=(",", ":")).encode()


def put_limit(url: str, n: int, windows: tuple[int, ...] = (100, 250, 500, 1000, 4000)) -> dict[str, Any]:
    """Pipelined puts a second of one nats-py connection, by window; the best of them is the limit."""
    by_window = {w: asyncio.run(_put_limit(url, n, w, RECORD)) for w in windows}
    return {"kv_put_limit": max(by_window.values()), "kv_put_limit_by_window": by_window, "value_bytes": len(RECORD)}


# ---- the seat, in a process of its own ----------------------------------------------------------------------------


# ---- the run ------------------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine the figures are of."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run([server_binary(), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "nats_server": version, "platform": platform.platform(), "loadavg_at_start": os.getloadavg()}


def cold(
    url: str, mesh_nodes: int, seed: int, max_parallel: int | None = None, *, time_load: bool = False
) -> tuple[SeatProcess, dict[str, Any]]:
    """Load a mesh and start a seat on it; the seat process, still running, and its cold start's figures. With
    `time_load`, a cache alone first loads what the seat will (`cache_load`)."""
    mesh = generate(mesh_nodes, seed)
    loaded = asyncio.run(load(url, mesh))
    timed = {"cache_load": cache_load(url)} if time_load else {}
    log(f"loaded {loaded} keys of a mesh of {mesh_nodes} nodes; starting the seat")
    seat = SeatProcess(url, max_parallel)
    return seat, {**seat.started, "loaded_keys": loaded, **timed}


def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    rate = args.rate or (100.0 if quick else 500.0)
    seconds = args.seconds or (1.0 if quick else 30.0)
    heavy_modules = args.heavy or (30 if quick else 500)
    baseline_nodes = args.baseline_nodes or (2 if quick else 100)
    out: dict[str, Any] = {"nodes": args.nodes, "seed": args.seed, "quick": quick, "machine": machine(),
                           "command": " ".join(["python -m benchmarks.converge", *sys.argv[1:]])}
    with EmbeddedServer() as server:
        url = server.url
        log("nats-server on", url)
        puts = 2000 if quick else 40000
        limit = put_limit(url, puts)
        out.update(limit)
        log(f"kv_put_limit {limit['kv_put_limit']:.0f}/s")
        # The bus layer's ceiling, at once after the limit (this machine's speed drifts over a run): as many
        # compare-and-sets, in batches of about a node's writes in the cold start, through the seat's bus layer alone.
        floor = bus_floor(url, puts, FLOOR_BATCH, Config().max_parallel, RECORD)
        reset(url)
        out["bus_floor"] = floor
        out["floor_writes_per_s"] = floor["writes_per_s"]
        out["floor_ratio_vs_limit"] = floor["writes_per_s"] / out["kv_put_limit"]
        log(f"bus floor: {floor['writes']} writes in {floor['seconds']:.2f} s = {floor['writes_per_s']:.0f}/s "
            f"(ratio {out['floor_ratio_vs_limit']:.2f}), {floor['cpu_us_per_write']:.1f} µs of CPU a write")

        # The seeds' way against the seat's, on the same mesh.
        small_nodes = 2 if args.cold_only else baseline_nodes
        seat, small = cold(url, small_nodes, args.seed)
        seat.stop()
        log(f"seat on {small_nodes} nodes: {small['seconds']:.2f} s, {small['writes']} writes")
        reset(url)
        if not args.cold_only and not args.no_seed_design:
            asyncio.run(load(url, generate(baseline_nodes, args.seed)))
            log(f"the seeds' way on {baseline_nodes} nodes ...")
            base = seed_design.run(url, max_passes=args.baseline_passes)
            log(f"the seeds' way: {base.seconds:.1f} s ({base.passes} passes, {base.reads} reads, "
                f"{base.writes} writes)")
            reset(url)
            out["seed_design"] = {"nodes": baseline_nodes, "seat_seconds": small["seconds"],
                                  "seat_writes": small["writes"], **asdict(base)}
            out["ratio_vs_seed_design"] = base.seconds / small["seconds"]

        # Cold convergence of N nodes.
        mesh = generate(args.nodes, args.seed)
        seat, c = cold(url, args.nodes, args.seed, time_load=True)
        out["cold"] = c
        out["writes"] = c["writes"]
        out["seconds"] = c["seconds"]
        out["compositions_per_node"] = c["compositions"] / args.nodes
        out["writes_per_s"] = c["writes"] / c["seconds"]
        out["ratio_vs_limit"] = out["writes_per_s"] / out["kv_put_limit"]
        out["peak_rss_bytes_per_key"] = c["peak_rss_bytes"] / c["keys"]
        out["rss_delta_bytes_per_key"] = (c["peak_rss_bytes"] - c["rss_before_bytes"]) / c["keys"]
        log(f"cold: {c['writes']} writes in {c['seconds']:.2f} s = {out['writes_per_s']:.0f}/s "
            f"(ratio {out['ratio_vs_limit']:.2f}); {out['peak_rss_bytes_per_key']:.0f} B/key; "
            f"{c['compositions']} compositions, {out['compositions_per_node']:.2f} a node")
        rules = rules_alone(mesh.states)
        top = ceiling(c["cache_load"], rules, floor, out["kv_put_limit"])
        out["ceiling"] = {"cache_load": c["cache_load"], "rules": rules, **top}
        out["ceiling_seconds"] = top["seconds"]
        out["ceiling_ratio_vs_limit"] = top["ratio_vs_limit"]
        out["ratio_vs_ceiling"] = out["seconds"] / top["seconds"]
        log(f"ceiling: {top['writes']} writes in at least {top['seconds']:.2f} s of one interpreter "
            f"(cache {c['cache_load']['cpu_seconds']:.2f} s, rules {rules['first_round_cpu_seconds']:.2f} s), "
            f"ratio at most {top['ratio_vs_limit']:.2f}; the cold start is {out['ratio_vs_ceiling']:.2f} times it")
        if args.cold_only:
            seat.stop()
            return out

        # Steady state.
        mix = {"bound": 2, "have": 1, "want": 1}
        states = asyncio.run(provision_states_of(url))
        pools = steady.targets(mesh, states, args.seed)
        owners = {key: k.provider for key, k in mesh.keys.items()}
        driver = steady.Driver(url, pools, args.seed)
        result = asyncio.run(driver.run(rate, seconds, mix, owners))
        out["steady"] = summary(result, rate, {k: len(v) for k, v in pools.items()})
        out["latency_p50_ms"] = result.percentile(50)
        out["latency_p99_ms"] = result.percentile(99)
        log(f"steady: {result.changes} changes, {len(result.samples)} writes matched, {result.missed} missed; "
            f"p50 {out['latency_p50_ms']:.1f} ms, p99 {out['latency_p99_ms']:.1f} ms")
        asyncio.run(steady.restore(url, pools, owners))
        settled = seat.settle()
        log(f"settled again in {settled['seconds']:.2f} s")

        # Head-of-line blocking: a heavy node of 500 modules joins, and changes all the time.
        heavy_mesh = generate(args.nodes, args.seed, heavy=heavy_modules)
        extra = difference(heavy_mesh, mesh)
        asyncio.run(put_states(url, extra))
        settled = seat.settle()
        log(f"heavy node of {heavy_modules} modules loaded and composed; settled in {settled['seconds']:.2f} s")
        hv = heavy_mesh.nodes[-1]
        heavy = steady.Target("have", [m for m in heavy_mesh.placed[hv] if m.startswith("hv-")], node=hv, heavy=True)
        states = asyncio.run(provision_states_of(url))
        hol: dict[str, Any] = {}
        for name, parallel in (("parallel", Config().max_parallel), ("serial", 1)):
            if name == "serial":
                seat.stop()
                seat = SeatProcess(url, max_parallel=1)
                log(f"seat with max_parallel=1 started: {seat.started['seconds']:.2f} s, "
                    f"{seat.started['writes']} writes")
            pools = steady.targets(mesh, states, args.seed + 1)
            driver = steady.Driver(url, pools, args.seed + 1)
            result = asyncio.run(driver.run(rate, seconds, mix, owners, heavy=heavy, heavy_rate=args.heavy_rate))
            hol[name] = summary(result, rate, {k: len(v) for k, v in pools.items()})
            hol[name]["max_parallel"] = parallel
            log(f"head-of-line ({name}): {result.changes} changes, {result.heavy_changes} to the heavy node, "
                f"p99 {result.percentile(99):.1f} ms, {result.missed} missed")
            asyncio.run(steady.restore(url, pools, owners))
            seat.settle()
        seat.stop()
        out["head_of_line"] = hol
        out["light_p99_ms"] = hol["parallel"]["p99_ms"]
        out["ratio_vs_serial_p99"] = hol["serial"]["p99_ms"] / hol["parallel"]["p99_ms"]
        reset(url)

        # Scale-out: one process and two sharing the mesh, each to its saturation rate and at half of it.
        scaled = partitioned.scale_out(url, args.nodes, args.seed, seconds=seconds, probe_seconds=args.probe_seconds
                                       or (1.0 if quick else 10.0), heavy_modules=heavy_modules,
                                       heavy_rate=args.heavy_rate, start_rate=20.0 if quick else 100.0,
                                       search_steps=1 if quick else 3,
                                       server_pid=server.process.pid if server.process else None,
                                       put_limit=out["kv_put_limit"])
        out["scale_out"] = scaled
        out.update({k: v for k, v in scaled.items() if not isinstance(v, dict)})
        out["saturation_changes_per_s"] = scaled["one_process"]["saturation_changes_per_s"]
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.converge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--json", type=Path, required=True, help="where to write the figures")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--quick", action="store_true", help="small and short: a smoke run, not a measurement")
    p.add_argument("--rate", type=float, default=0.0, help="changes a second (default 500; quick 100)")
    p.add_argument("--seconds", type=float, default=0.0, help="seconds of load (default 30; quick 1)")
    p.add_argument("--heavy", type=int, default=0, help="modules of the heavy node (default 500; quick 30)")
    p.add_argument("--heavy-rate", type=float, default=50.0, help="changes a second to the heavy node")
    p.add_argument("--cold-only", action="store_true",
                   help="measure the put limit, the cold start and its ceiling alone (writes, seconds, "
                        "compositions a node, ratio_vs_ceiling)")
    p.add_argument("--baseline-nodes", type=int, default=0, help="nodes of the seeds' comparison (default 100)")
    p.add_argument("--no-seed-design", action="store_true", help="leave the seeds' comparison out (it takes minutes)")
    p.add_argument("--probe-seconds", type=float, default=0.0,
                   help="seconds of each run of the search for the saturation rate (default 10; quick 1)")
    p.add_argument("--baseline-passes", type=int, default=1,
                   help="passes of the seeds' way (1: its cold pass, as its process makes it; more: up to its "
                   "fixed point)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stop_cleanly_on_sigterm()
    out = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    keys = ("kv_put_limit", "writes", "seconds", "compositions_per_node", "writes_per_s", "ratio_vs_limit",
            "ratio_vs_seed_design",
            "latency_p50_ms", "latency_p99_ms", "light_p99_ms", "ratio_vs_serial_p99", "peak_rss_bytes_per_key",
            "floor_writes_per_s", "floor_ratio_vs_limit", "ceiling_seconds", "ceiling_ratio_vs_limit",
            "ratio_vs_ceiling", "saturation_changes_per_s", "scale_out_cold_start", "scale_out_saturation",
            "p99_over_p50_half_saturation", "ratio_vs_serial_p99_half_saturation", "rss_two_over_one")
    for key in keys:
        if key in out:
            print(f"{key:24} {out[key]:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
