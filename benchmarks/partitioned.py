"""Scale-out: the seat with one process and with two sharing the mesh (contract 8.1), each measured the same way.

For each process count, on a fresh copy of the N-node mesh:

- the cold start: the processes started together (`benchmarks.seat_proc --shards S`), until a round in which every
  process is settled and none wrote anything more; its seconds, writes, each process's peak RSS and CPU, and the
  server's CPU meanwhile;
- the saturation rate: the highest rate of changes (`benchmarks.steady`) the seat sustains with its backlog bounded
  (`sustained`), found by doubling the rate from a start until a run is not sustained, then halving the interval;
- at half the saturation rate: the change-to-write p50 and p99, and the head-of-line ratio (one heavy node changing
  all the time; the other nodes' p99 with `--max-parallel 1` over that with the default).

One process with S shards holds them all: the same code path as two, so the ratios compare like with like.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from benchmarks import steady
from benchmarks.harness import (
    SeatProcess,
    cpu_seconds_of,
    difference,
    log,
    provision_states_of,
    put_states,
    reset,
    summary,
)
from benchmarks.mesh import Mesh, generate, load

SHARDS = 64
# The load's mix of changes, as the steady-state figures use it.
MIX = {"bound": 2, "have": 1, "want": 1}
# A run sustains a rate when it made (almost) every change asked for, every write came, and its latency did not grow:
# the median of its last quarter of samples within this factor (and a floor, for runs whose latencies are tiny) of
# its first quarter's.
MADE_SHARE = 0.9
GROWTH = 3.0
GROWTH_FLOOR_MS = 50.0


class Seats:
    """Seat processes of one partitioned mesh, started together; each process's figures come back on its stdout."""

    def __init__(self, url: str, processes: int, shards: int = SHARDS, max_parallel: int | None = None, *,
                 metrics_addrs: Sequence[str] = ()) -> None:
        """`processes` seat processes of `shards` shards (0: one seat, not partitioned); process i serves its
        `/metrics` on `metrics_addrs[i]` when there is one."""
        self.began = time.perf_counter()
        addrs = [*metrics_addrs, *[""] * processes][:processes]
        self.procs: list[SeatProcess] = []
        try:
            for addr in addrs:
                self.procs.append(SeatProcess(url, max_parallel, shards=shards, wait=False, metrics_addr=addr))
            for p in self.procs:
                p.first()
        except BaseException:
            self.close()
            raise

    def settle(self, rounds: int = 1000) -> tuple[float, list[dict[str, Any]]]:
        """Settle every process again and again until a round writes nothing more: when the last round that wrote
        ended (perf_counter), and each process's figures then. Past `rounds` rounds that all wrote, RuntimeError."""
        last, ended = -1, time.perf_counter()
        for _ in range(rounds):
            figures = [p.settle() for p in self.procs]
            total = sum(f["writes"] for f in figures)
            if total == last and all(f["settled"] for f in figures):
                return ended, figures
            last, ended = total, time.perf_counter()
        raise RuntimeError(f"the seat processes still wrote after {rounds} rounds of settling")

    def stop(self) -> None:
        """Stop every process."""
        for p in self.procs:
            p.stop()

    def close(self) -> None:
        """Make sure every process has ended (`SeatProcess.close`), stopped or not."""
        for p in self.procs:
            p.close()


def cold(url: str, mesh: Mesh, processes: int, shards: int = SHARDS, *, metrics_addrs: Sequence[str] = (),
         server_pid: int | None = None) -> tuple[Seats, dict[str, Any]]:
    """The cold start of `processes` processes on a freshly loaded mesh; the seats, still running, and the figures.

    With the server's `server_pid`, also the CPU the server spent meanwhile (0 without)."""
    reset(url)
    keys = asyncio.run(load(url, mesh))
    server_before = cpu_seconds_of(server_pid)
    seats = Seats(url, processes, shards, metrics_addrs=metrics_addrs)
    try:
        ended, figures = seats.settle()
    except BaseException:
        seats.close()
        raise
    peaks = [f["peak_rss_bytes"] for f in figures]
    out = {
        "processes": processes, "shards": shards, "loaded_keys": keys,
        "seconds": ended - seats.began, "writes": sum(f["writes"] for f in figures),
        "compositions": sum(f["compositions"] for f in figures), "keys": figures[0]["keys"],
        "peak_rss_bytes": peaks, "peak_rss_bytes_per_key_sum": sum(peaks) / figures[0]["keys"],
        "cpu_seconds": [f["cpu_seconds"] for f in figures],
        "server_cpu_seconds": cpu_seconds_of(server_pid) - server_before,
    }
    log(f"cold, {processes} process(es): {out['writes']} writes in {out['seconds']:.2f} s, "
        f"{out['compositions']} compositions, peak RSS {[round(p / 2**20) for p in peaks]} MiB")
    return seats, out


def sustained(load: steady.Load, rate: float) -> str:
    """Why a run did not sustain its rate ("" when it did): changes not made, writes that did not come within 5 s,
    or latency that grew over the run (a backlog that grows)."""
    asked = rate * load.seconds
    if load.changes < MADE_SHARE * asked:
        return f"made {load.changes} of {asked:.0f} changes"
    if load.missed:
        return f"{load.missed} writes did not come within 5 s"
    n = len(load.samples)
    if n < 8:
        return f"only {n} writes timed"
    quarter = n // 4
    first, last = sorted(load.samples[:quarter]), sorted(load.samples[-quarter:])
    head, tail = first[len(first) // 2], last[len(last) // 2]
    if tail > max(GROWTH * head, head + GROWTH_FLOOR_MS):
        return f"latency grew from {head:.0f} ms to {tail:.0f} ms"
    return ""


def drive(url: str, mesh: Mesh, seats: Seats, rate: float, seconds: float, seed: int,
          heavy: steady.Target | None = None, heavy_rate: float = 0.0, *,
          alongside: Callable[[steady.Driver], Coroutine[Any, Any, Any]] | None = None) -> steady.Load:
    """One run of the load at a rate, then every target put back and the seats settled again.

    `alongside` is run on the load's loop while the load runs (it watches `driver.load` grow), and cancelled if it
    has not ended when the load has; what it raised is raised here."""
    owners = {key: k.provider for key, k in mesh.keys.items()}
    pools = steady.targets(mesh, asyncio.run(provision_states_of(url)), seed)
    driver = steady.Driver(url, pools, seed)

    async def run() -> steady.Load:
        beside = asyncio.create_task(alongside(driver)) if alongside is not None else None
        try:
            return await driver.run(rate, seconds, MIX, owners, heavy=heavy, heavy_rate=heavy_rate)
        finally:
            if beside is not None:
                beside.cancel()
                failed: object = (await asyncio.gather(beside, return_exceptions=True))[0]
                if isinstance(failed, Exception):
                    raise failed

    result = asyncio.run(run())
    asyncio.run(steady.restore(url, pools, owners))
    seats.settle()
    return result


def saturation(url: str, mesh: Mesh, seats: Seats, seconds: float, seed: int, start: float = 100.0,
               most: float = 12800.0, steps: int = 3) -> tuple[float, list[dict[str, Any]]]:
    """The highest rate the seats sustain (`sustained`), and every probe made to find it."""
    probes: list[dict[str, Any]] = []

    def probe(rate: float) -> bool:
        result = drive(url, mesh, seats, rate, seconds, seed + len(probes))
        why = sustained(result, rate)
        probes.append({"rate": rate, "sustained": not why, "why": why, "changes": result.changes,
                       "p50_ms": result.percentile(50), "p99_ms": result.percentile(99), "missed": result.missed})
        log(f"  {rate:.0f}/s: {why or 'sustained'} (p50 {result.percentile(50):.1f} ms, "
            f"p99 {result.percentile(99):.1f} ms)")
        return not why

    good, bad = 0.0, start
    while bad <= most and probe(bad):
        good, bad = bad, bad * 2
    for _ in range(steps if good else 0):
        middle = (good + bad) / 2
        if probe(middle):
            good = middle
        else:
            bad = middle
    return good, probes


def measure(url: str, nodes: int, seed: int, processes: int, *, seconds: float, probe_seconds: float,
            heavy_modules: int, heavy_rate: float, start_rate: float = 100.0, search_steps: int = 3,
            server_pid: int | None = None, put_limit: float = 0.0) -> dict[str, Any]:
    """Every scale-out figure of one process count; with the server's `put_limit` (puts a second), the p99 a seat
    writing at that rate could not go below at half saturation (`Load.p99_floor`)."""
    mesh = generate(nodes, seed)
    seats, out = cold(url, mesh, processes, server_pid=server_pid)
    try:
        rate, probes = saturation(url, mesh, seats, probe_seconds, seed, start=start_rate, steps=search_steps)
        out["saturation_changes_per_s"] = rate
        out["saturation_probes"] = probes
        half = rate / 2
        result = drive(url, mesh, seats, half, seconds, seed + 100)
        out["half_saturation"] = summary(result, half, {})
        out["p50_ms"], out["p99_ms"] = result.percentile(50), result.percentile(99)
        if put_limit:
            out["p99_floor_ms"] = result.p99_floor(put_limit)
        log(f"{processes} process(es): saturation {rate:.0f}/s; at {half:.0f}/s p50 {out['p50_ms']:.1f} ms, "
            f"p99 {out['p99_ms']:.1f} ms")
        # Head-of-line blocking at half saturation: a heavy node joins and changes all the time.
        heavy_mesh = generate(nodes, seed, heavy=heavy_modules)
        asyncio.run(put_states(url, difference(heavy_mesh, mesh)))
        seats.settle()
        hv = heavy_mesh.nodes[-1]
        heavy = steady.Target("have", [m for m in heavy_mesh.placed[hv] if m.startswith("hv-")], node=hv, heavy=True)
        light = drive(url, mesh, seats, half, seconds, seed + 200, heavy, heavy_rate)
        seats.stop()
        seats = Seats(url, processes, max_parallel=1)
        seats.settle()
        serial = drive(url, mesh, seats, half, seconds, seed + 200, heavy, heavy_rate)
        out["head_of_line"] = {"parallel": summary(light, half, {}), "serial": summary(serial, half, {})}
        out["light_p99_ms"] = light.percentile(99)
        out["ratio_vs_serial_p99"] = serial.percentile(99) / light.percentile(99)
        log(f"{processes} process(es): head-of-line p99 {light.percentile(99):.1f} ms, serial "
            f"{serial.percentile(99):.1f} ms, ratio {out['ratio_vs_serial_p99']:.2f}")
    finally:
        seats.stop()
    return out


def scale_out(url: str, nodes: int, seed: int, **kwargs: Any) -> dict[str, Any]:
    """The figures of one process and of two, and their ratios.

    `cpu_two_over_one`: the CPU the two processes spent on their cold start over the one process's (the work each
    repeats: following the whole mesh). `scale_out_cold_start_cpu_bound`: the most `scale_out_cold_start` this machine
    allows for the CPU the two processes and the server spent, were it spread evenly over every core (with
    `server_pid`; the server's CPU counted as 0 without). `p99_floor_over_p50_half_saturation`: the p99 a seat writing
    at `put_limit` could not go below for the changes one process was given at half saturation, over its p50."""
    one = measure(url, nodes, seed, 1, **kwargs)
    two = measure(url, nodes, seed, 2, **kwargs)
    busy = (sum(two["cpu_seconds"]) + two["server_cpu_seconds"]) / (os.cpu_count() or 1)
    return {
        "cpu_two_over_one": sum(two["cpu_seconds"]) / one["cpu_seconds"][0],
        "scale_out_cold_start_cpu_bound": one["seconds"] / busy,
        "one_process": one, "two_processes": two,
        "scale_out_cold_start": one["seconds"] / two["seconds"],
        "scale_out_saturation": two["saturation_changes_per_s"] / max(one["saturation_changes_per_s"], 1e-9),
        "p99_over_p50_half_saturation": one["p99_ms"] / one["p50_ms"],
        "p99_floor_over_p50_half_saturation": one.get("p99_floor_ms", float("nan")) / one["p50_ms"],
        "p99_over_p50_half_saturation_two": two["p99_ms"] / two["p50_ms"],
        "ratio_vs_serial_p99_half_saturation": one["ratio_vs_serial_p99"],
        "ratio_vs_serial_p99_half_saturation_two": two["ratio_vs_serial_p99"],
        "rss_two_over_one": sum(two["peak_rss_bytes"]) / one["peak_rss_bytes"][0],
    }
