"""The soak: its verdict, judged from samples alone, and one short soak of a small mesh through the runner, its figures
kept beside the scenarios' and its seat process and server stopped when the runner is stopped."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import wait_until
from running import ROOT, run_faults

from faults import soak
from faults.report import render
from faults.soak import Sample, verdict

MIB = 2**20


def samples(count: int = 60, interval: float = 10.0, *, rss: Callable[[float], float] = lambda _: 1.0,
            latency: Callable[[float], float] = lambda _: 1.0, tasks: int | None = 40, seed: int = 3) -> list[Sample]:
    """`count` samples of a steady seat: 300 MiB, 20 fds, 1,050 threads, `tasks` tasks, 100 writes a window of
    latencies around 10 ms with a tail; `rss` and `latency` scale memory and latencies by the sample's share of the
    run (0 to 1)."""
    rnd = random.Random(seed)
    out = []
    for i in range(1, count + 1):
        share = i / count
        window = [rnd.lognormvariate(2.3, 0.6) * latency(share) for _ in range(100)]
        out.append(Sample(seconds=i * interval, rss_bytes=round(300 * MIB * rss(share) + rnd.randrange(MIB)),
                          fds=20, threads=1050 + rnd.choice((0, 0, 1)), tasks=tasks, cpu_seconds=i * 3.0,
                          changes=1000, writes=len(window), missed=0, p50_ms=None, p99_ms=None,
                          latencies_ms=window))
    return out


def test_a_steady_seat_is_flat() -> None:
    v = verdict(samples(), warmup=300.0)
    assert v["judged"] and v["flat"] and v["why"] == ""
    assert v["samples_judged"] == 30  # the samples after the first 300 s
    assert all(r["flat"] and abs(r["growth"]) < 0.01 for r in v["resources"].values())
    assert v["p99"]["flat"] and v["p99"]["writes_first"] == v["p99"]["writes_last"] == 600  # six windows a fifth


def test_memory_that_keeps_growing_is_not_flat() -> None:
    # Growing by a fifth over the whole run: by about 7 % from the first minute after the warm-up to the last.
    v = verdict(samples(rss=lambda share: 1 + 0.2 * share), warmup=300.0)
    assert v["judged"] and not v["flat"]
    assert not v["resources"]["rss_bytes"]["flat"] and 0.06 < v["resources"]["rss_bytes"]["growth"] < 0.08
    assert v["resources"]["fds"]["flat"] and v["resources"]["threads"]["flat"] and v["p99"]["flat"]
    assert v["why"].startswith("resident memory grew +")


def test_growth_in_the_warm_up_alone_is_not_judged() -> None:
    v = verdict(samples(rss=lambda share: 1 + 0.5 * min(share, 0.4)), warmup=300.0)  # grows over the first 4 minutes
    assert v["flat"]


def test_a_rising_p99_is_not_flat_and_a_small_one_has_a_floor() -> None:
    rising = verdict(samples(latency=lambda share: 1 + 9 * share), warmup=300.0)  # to ten times slower
    assert rising["judged"] and not rising["flat"]
    assert not rising["p99"]["flat"] and rising["p99"]["ratio"] > soak.P99_RATIO
    assert "the p99 rose" in rising["why"]
    assert all(r["flat"] for r in rising["resources"].values())
    # Latencies a tenth as long tripling: more than 1.5 times, but not 50 ms more.
    small = verdict(samples(latency=lambda share: 0.1 if share < 0.8 else 0.3), warmup=300.0)
    assert small["p99"]["ratio"] > soak.P99_RATIO and small["p99"]["flat"]
    assert small["p99"]["last_ms"] - small["p99"]["first_ms"] <= soak.P99_FLOOR_MS


def test_too_few_samples_are_said_not_judged() -> None:
    v = verdict(samples(count=35), warmup=300.0)  # five samples after the warm-up
    assert not v["judged"] and not v["flat"]
    assert v["why"] == ("too few samples to judge: 5 after the warm-up of 300 s, and the verdict needs at least 12 "
                        "(6 at each end)")
    unread = verdict(samples(tasks=None), warmup=300.0)
    assert not unread["judged"] and not unread["flat"]
    assert "not judged: asyncio tasks not read at the start of the span" in unread["why"]
    assert unread["resources"]["rss_bytes"]["flat"]


def test_the_warm_up_is_five_minutes_or_a_third_of_a_shorter_run() -> None:
    assert soak.warmup_for(30 * 60) == 300.0
    assert soak.warmup_for(3 * 60) == 60.0
    assert soak.warmup_for(30 * 60, 120.0) == 120.0


@pytest.mark.slow
def test_a_short_soak_samples_the_seat_and_keeps_the_scenarios_figures(tmp_path: Path) -> None:
    figures, markdown = tmp_path / "figures.json", tmp_path / "RELIABILITY.md"
    before = json.loads((ROOT / "docs" / "reliability.json").read_text())
    before.pop("soak", None)
    figures.write_text(json.dumps(before))
    done = run_faults("--soak", "0.3", "--soak-nodes", "50", "--soak-interval", "1",
                      "--json", str(figures), "--markdown", str(markdown), timeout=120)
    data = json.loads(figures.read_text())
    section = data["soak"]
    # A soak this short on 50 nodes says little; it runs every part, and its exit says its verdict.
    assert done.returncode == (0 if soak.passed(section) else 1), done.stderr[-3000:]
    assert {k: v for k, v in data.items() if k != "soak"} == before  # the scenarios' figures are left as they were
    assert section["command"].startswith("python -m faults --soak 0.3 ")
    assert section["nodes"] == 50 and section["rate"] == soak.RATE and section["cold"]["writes"] > 0
    assert 17 <= len(section["samples"]) <= 18  # every second of 18
    for s in section["samples"]:
        assert s["rss_bytes"] > 0 and s["fds"] > 0 and s["threads"] > 1 and s["tasks"] > 0 and s["changes"] > 0
    assert section["load"]["changes"] > 0 and section["load"]["writes"] > 0
    v = section["verdict"]
    assert v["judged"] and v["warmup_seconds"] == 6.0 and set(v["resources"]) == set(soak.RESOURCES)
    text = markdown.read_text()
    assert text == render(data)
    assert "| kills |" in text and "## Soak" in text and "python -m faults --soak 0.3 " in text


def test_the_scenarios_run_again_keep_the_soaks_figures(tmp_path: Path) -> None:
    figures, markdown = tmp_path / "figures.json", tmp_path / "RELIABILITY.md"
    kept = json.loads((ROOT / "docs" / "reliability.json").read_text())["soak"]
    figures.write_text(json.dumps({"soak": kept}))
    done = run_faults("--scenario", "storm", "--seed", "7", "--runs", "1", "--count", "100",
                      "--json", str(figures), "--markdown", str(markdown))
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(figures.read_text())
    assert data["soak"] == kept and list(data["scenarios"]) == ["storm"]
    assert markdown.read_text() == render(data)
    assert "| storm |" in markdown.read_text() and kept["command"] in markdown.read_text()


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, by their command lines (Linux: /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(") ")[2].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found[int(entry.name)] = cmdline
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_soak_stopped_by_sigterm_stops_its_server_and_seat_process(tmp_path: Path) -> None:
    run = subprocess.Popen([sys.executable, "-m", "faults", "--soak", "5", "--soak-nodes", "50", "--soak-interval",
                            "1", "--json", str(tmp_path / "f.json")],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def both() -> dict[int, str] | None:
            found = _children(run.pid)
            kinds = {"nats-server" if "nats-server" in c else "seat" if "benchmarks.seat_proc" in c else ""
                     for c in found.values()}
            return found if {"nats-server", "seat"} <= kinds else None

        children = wait_until(both, timeout=60, interval=0.1, what="the soak's nats-server and seat process")
        # Stopped once it samples: the load and the sampling are running.
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(run.stderr or ()), daemon=True)
        reader.start()
        wait_until(lambda: any("s: RSS" in line for line in said), timeout=60, interval=0.1, what="a first sample")
        run.terminate()
        assert run.wait(90) == 143
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), timeout=15,
                   what="the soak's nats-server and seat process gone")
        assert not (tmp_path / "f.json").exists()  # a soak stopped half-way keeps no figures
    finally:
        run.kill()
        run.wait()
