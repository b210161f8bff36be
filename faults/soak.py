"""The soak: one seat process under a steady load for a long time, sampled as it goes, and judged flat or not.

    python -m faults --soak MINUTES [--soak-rate R] [--soak-nodes N] [--soak-interval S] [--json F] [--markdown F]

A nats-server of its own (the embedded one, on 127.0.0.1, its store in a temporary directory), the benchmarks'
seeded mesh of N nodes (`benchmarks.mesh`, 1,000 by default) loaded into it, and one seat process on it
(`benchmarks.seat_proc --shards 64`: the one process of a partitioned seat, started as `serve` starts it, as the
saturation figure was measured; it serves its `/metrics` on a loopback port). Once its cold start has settled, the
benchmarks' load (`benchmarks.steady.Driver`, run by `benchmarks.partitioned.drive`) changes providers' words at R
changes a second for MINUTES, and every S seconds (10 by default) the seat process is sampled:

- its resident memory (`VmRSS` of /proc/<pid>/status), open file descriptors (the entries of /proc/<pid>/fd),
  threads (`Threads` of /proc/<pid>/status) and CPU time (/proc/<pid>/stat), read before the scrape below so that
  the scrape's own connection and thread are not counted;
- the asyncio tasks not done on its event loops: `mesh_provisioner_loop_tasks`, summed over its loops, from its
  `/metrics`;
- the change-to-write latency (p50, p99) of the writes the load saw in that window, the changes it made, and the
  writes that did not come within 5 s.

`verdict` judges the samples: see its rules there. Every loop is bounded in count and time; the server and the seat
process stop when the soak ends, however it ends (the runner turns SIGTERM into an exit).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import statistics
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks import partitioned, steady
from benchmarks.harness import SeatProcess
from benchmarks.mesh import generate
from faults.scale import SATURATION
from mesh_provisioner.bus.embedded import EmbeddedServer, free_port

log = logging.getLogger("faults.soak")

# The soak runs at half one seat process's saturation (faults/scale.py) unless told another rate (`--soak-rate`; 0
# measures the saturation first).
RATE = SATURATION / 2
NODES = 1000
SHARDS = partitioned.SHARDS
INTERVAL = 10.0
# The growth of a resource is judged from this point on: the first minutes fill caches, pools and the allocator's
# arenas. A run shorter than three times this takes a third of its length instead.
WARMUP_SECONDS = 300.0
# A resource's value at each end of the judged span is the median of this many samples (a minute at 10 s a sample):
# one sample taken in a burst of writes in flight says little (the tasks of a seat at 100 changes a second on 1,000
# nodes were 106 in most samples and up to 120 in a fifth of them).
ENDS = 6
# A resource is flat when it grew by less than this share from the start of the judged span to its end.
GROWTH = 0.05
# The latency is flat when the p99 of the writes of the judged span's last fifth is at most this many times the p99
# of its first fifth's, or at most this many milliseconds more (a ratio of small p99s says little).
P99_RATIO = 1.5
P99_FLOOR_MS = 50.0
# The resources judged, and how the report names them.
RESOURCES = {"rss_bytes": "resident memory", "fds": "open file descriptors", "threads": "threads",
             "tasks": "asyncio tasks"}


@dataclass
class Sample:
    """The seat process at the end of one window of the soak, and the load's writes of that window."""

    seconds: float  # since the load began
    rss_bytes: int
    fds: int
    threads: int
    tasks: int | None  # None: its /metrics did not answer
    cpu_seconds: float
    changes: int  # made in the window
    writes: int  # timed in the window
    missed: int  # writes that did not come within 5 s, counted in the window
    p50_ms: float | None
    p99_ms: float | None
    latencies_ms: list[float] = field(default_factory=list, repr=False)  # the window's, not kept in the JSON

    def as_json(self) -> dict[str, Any]:
        """The sample as the runner's JSON keeps it (its latencies summed up by p50 and p99)."""
        out = asdict(self)
        del out["latencies_ms"]
        for k in ("seconds", "cpu_seconds", "p50_ms", "p99_ms"):
            if out[k] is not None:
                out[k] = round(out[k], 3)
        return out


def warmup_for(seconds: float, warmup: float | None = None) -> float:
    """The warm-up of a run of `seconds`: the one asked for, else `WARMUP_SECONDS`, or a third of a shorter run."""
    if warmup is not None:
        return warmup
    return min(WARMUP_SECONDS, seconds / 3)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (nearest rank, as the benchmarks take it); None of nothing."""
    return steady.Load(samples=list(values)).percentile(q) if values else None


def verdict(samples: Sequence[Sample], warmup: float, *, ends: int = ENDS) -> dict[str, Any]:
    """Whether the samples are flat after `warmup` seconds, with the figures that say so.

    The judged span is the samples taken after the warm-up. Each resource (`RESOURCES`) is flat when its growth,
    (its value at the end − its value at the start of the span) / its value at the start, is under `GROWTH`; each
    value is the median of `ends` samples at that end. The latency is flat when the p99 of every write timed in the
    last fifth of the span's samples is at most `P99_RATIO` times that of the first fifth's, or at most `P99_FLOOR_MS`
    more. Fewer than 2 × `ends` samples in the span judge nothing, and say so; so does a fifth with no write timed, or
    a resource read at neither end.
    """
    judged = [s for s in samples if s.seconds > warmup]
    out: dict[str, Any] = {
        "judged": False, "flat": False, "why": "", "warmup_seconds": warmup, "ends": ends, "growth_limit": GROWTH,
        "p99_ratio_limit": P99_RATIO, "p99_floor_ms": P99_FLOOR_MS,
        "samples": len(samples), "samples_judged": len(judged),
        "rule": (f"each resource grew by less than {GROWTH:.0%} from the start of the span after the warm-up to its "
                 f"end (medians of {ends} samples at each end); the p99 of the span's last fifth at most {P99_RATIO:g} "
                 f"times its first fifth's, or at most {P99_FLOOR_MS:g} ms more"),
        "resources": {}, "p99": {},
    }
    if len(judged) < 2 * ends:
        out["why"] = (f"too few samples to judge: {len(judged)} after the warm-up of {warmup:.0f} s, and the verdict "
                      f"needs at least {2 * ends} ({ends} at each end)")
        return out
    unjudged: list[str] = []
    grown: list[str] = []
    for name, words in RESOURCES.items():
        first = [v for s in judged[:ends] if (v := getattr(s, name)) is not None]
        last = [v for s in judged[-ends:] if (v := getattr(s, name)) is not None]
        if not first or not last:
            out["resources"][name] = {"judged": False}
            unjudged.append(f"{words} not read at {'the start' if not first else 'the end'} of the span")
            continue
        start, end = statistics.median(first), statistics.median(last)
        growth = (end - start) / start if start else (math.inf if end > start else 0.0)
        flat = growth < GROWTH
        out["resources"][name] = {"judged": True, "start": start, "end": end, "growth": growth, "flat": flat}
        if not flat:
            grown.append(f"{words} grew {growth:+.1%} ({_value(name, start)} to {_value(name, end)})")
    fifth = max(1, len(judged) // 5)
    head = [x for s in judged[:fifth] for x in s.latencies_ms]
    tail = [x for s in judged[-fifth:] for x in s.latencies_ms]
    first_p99, last_p99 = percentile(head, 99), percentile(tail, 99)
    if first_p99 is None or last_p99 is None:
        out["p99"] = {"judged": False, "writes_first": len(head), "writes_last": len(tail)}
        unjudged.append(f"no write timed in the {'first' if first_p99 is None else 'last'} fifth of the span")
    else:
        ratio = last_p99 / first_p99 if first_p99 else math.inf
        flat = last_p99 <= max(P99_RATIO * first_p99, first_p99 + P99_FLOOR_MS)
        out["p99"] = {"judged": True, "first_ms": first_p99, "last_ms": last_p99, "ratio": ratio, "flat": flat,
                      "writes_first": len(head), "writes_last": len(tail), "samples_in_fifth": fifth}
        if not flat:
            grown.append(f"the p99 rose {ratio:.2f} times ({first_p99:.1f} ms to {last_p99:.1f} ms)")
    out["judged"] = not unjudged
    out["flat"] = not unjudged and not grown
    out["why"] = "; ".join([*(f"not judged: {w}" for w in unjudged), *grown])
    return out


def _value(name: str, value: float) -> str:
    return f"{value / 2**20:.1f} MiB" if name == "rss_bytes" else f"{value:g}"


# ---- sampling the seat process ----------------------------------------------------------------------------------


def resources(pid: int) -> tuple[int, int, int, float]:
    """A process's resident memory in bytes, open file descriptors, threads and CPU seconds (Linux: /proc)."""
    status: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    rss = int(status["VmRSS"].split()[0]) * 1024  # kB
    threads = int(status["Threads"])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15
    return rss, fds, threads, cpu


def loop_tasks(metrics_url: str, timeout: float = 10.0) -> int | None:
    """The seat's `mesh_provisioner_loop_tasks`, summed over its loops; None when its /metrics does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError as err:
        log.warning("%s did not answer: %s", metrics_url, err)
        return None
    found = [s.value for family in text_string_to_metric_families(text) if family.name == "mesh_provisioner_loop_tasks"
             for s in family.samples]
    return round(sum(found)) if found else None


async def sample_every(seat: SeatProcess, metrics_url: str, interval: float, count: int, driver: steady.Driver,
                       out: list[Sample]) -> None:
    """`count` samples of the seat process, one every `interval` seconds, appended to `out` as they are taken."""
    start = time.perf_counter()
    seen = changes = missed = 0
    for i in range(1, count + 1):
        await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
        if (code := seat.proc.poll()) is not None:
            raise RuntimeError(f"the seat process ended with {code} after {time.perf_counter() - start:.0f} s")
        rss, fds, threads, cpu = resources(seat.proc.pid)
        tasks = await asyncio.to_thread(loop_tasks, metrics_url)
        load = driver.load
        window = load.samples[seen:]
        seen += len(window)
        sample = Sample(
            seconds=time.perf_counter() - start, rss_bytes=rss, fds=fds, threads=threads, tasks=tasks,
            cpu_seconds=cpu, changes=load.changes - changes, writes=len(window), missed=load.missed - missed,
            p50_ms=percentile(window, 50), p99_ms=percentile(window, 99), latencies_ms=window,
        )
        changes, missed = load.changes, load.missed
        out.append(sample)
        log.info("soak %5.0f s: RSS %.1f MiB, %d fds, %d threads, %s tasks, %d changes, %d writes, p50 %s, p99 %s",
                 sample.seconds, rss / 2**20, fds, threads, "-" if tasks is None else tasks, sample.changes,
                 sample.writes, _ms(sample.p50_ms), _ms(sample.p99_ms))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


# ---- the soak ---------------------------------------------------------------------------------------------------


def soak(minutes: float, *, rate: float = RATE, nodes: int = NODES, interval: float = INTERVAL, seed: int = 1,
         shards: int = SHARDS, warmup: float | None = None) -> dict[str, Any]:
    """Run the soak and answer its figures (the runner's JSON keeps them as its `soak` section).

    `rate` 0 measures the saturation first (`benchmarks.partitioned.saturation`, 10-second probes) and soaks at half
    of it. `shards` 0 runs the seat not partitioned (`Runtime.start`, as `reconcile` does).
    """
    seconds = minutes * 60
    count = math.floor(seconds / interval + 1e-9)
    judged_after = warmup_for(seconds, warmup)
    mesh = generate(nodes, seed)
    samples: list[Sample] = []
    out: dict[str, Any] = {"minutes": minutes, "nodes": nodes, "seed": seed, "shards": shards,
                           "interval_seconds": interval}
    with EmbeddedServer() as server:
        addr = f"127.0.0.1:{free_port()}"
        seats, cold = partitioned.cold(server.url, mesh, 1, shards, metrics_addrs=[addr])
        try:
            out["cold"] = cold
            if rate <= 0:
                log.info("soak: measuring the saturation first")
                saturation, probes = partitioned.saturation(server.url, mesh, seats, 10.0, seed)
                out["saturation"] = {"changes_per_s": saturation, "probes": probes}
                rate = saturation / 2
                out["rate_source"] = f"half the saturation measured first ({saturation:.0f} changes/s)"
            else:
                out["rate_source"] = (f"half the saturation of one seat process on 1,000 nodes when this rate was "
                                      f"set, {SATURATION:g} a second (docs/BENCHMARKS.md; 250 in its later runs)"
                                      if rate == RATE else "asked for (--soak-rate)")
            out["rate"] = rate
            log.info("soak: %d nodes, %.0f changes/s for %g minute(s), a sample every %g s, judged after %.0f s",
                     nodes, rate, minutes, interval, judged_after)

            async def sampler(driver: steady.Driver) -> None:
                await sample_every(seats.procs[0], f"http://{addr}/metrics", interval, count, driver, samples)

            # The load runs a moment past the last sample, so that the last window is as full as the others.
            load = partitioned.drive(server.url, mesh, seats, rate, seconds + min(2.0, interval / 2), seed,
                                     alongside=sampler)
            out["stopped"] = seats.procs[0].stop()
        finally:
            seats.close()
    why = partitioned.sustained(load, rate)
    out["load"] = {
        "seconds": round(load.seconds, 1), "changes": load.changes, "writes": len(load.samples),
        "missed": load.missed, "p50_ms": _round(percentile(load.samples, 50)),
        "p99_ms": _round(percentile(load.samples, 99)), "max_ms": _round(max(load.samples, default=None)),
        "sustained": not why, "why_not_sustained": why,
    }
    out["samples"] = [s.as_json() for s in samples]
    out["verdict"] = verdict(samples, judged_after)
    v = out["verdict"]
    log.info("soak: %s%s; the load %s", "flat" if v["flat"] else "NOT FLAT", f" ({v['why']})" if v["why"] else "",
             "was sustained" if not why else f"was not sustained: {why}")
    return out


def passed(section: dict[str, Any]) -> bool:
    """Whether a soak passed: judged flat, with its load sustained."""
    return bool(section["verdict"]["flat"] and section["load"]["sustained"])
