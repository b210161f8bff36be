"""The benchmarks' code runs: `benchmarks.converge --quick` on a tiny mesh writes every figure (not a speed test)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_until

from benchmarks.breakdown import PARTS, Breakdown
from benchmarks.steady import Load

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("kv_put_limit", "writes", "seconds", "writes_per_s", "ratio_vs_limit", "ratio_vs_seed_design",
           "latency_p50_ms", "latency_p99_ms", "light_p99_ms", "ratio_vs_serial_p99", "peak_rss_bytes_per_key",
           "floor_writes_per_s", "floor_ratio_vs_limit", "ceiling_seconds", "ceiling_ratio_vs_limit",
           "scale_out_cold_start", "cpu_two_over_one", "scale_out_cold_start_cpu_bound",
           "p99_floor_over_p50_half_saturation")


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
    one = figures["scale_out"]["one_process"]
    assert 0 < one["p99_floor_ms"] <= one["p99_ms"], "no write comes sooner than its floor"
    two = figures["scale_out"]["two_processes"]
    assert len(two["cpu_seconds"]) == 2 and min(two["cpu_seconds"]) > 0 and two["server_cpu_seconds"] > 0
    ceiling = figures["ceiling"]
    assert ceiling["cache_load"]["keys"] == figures["cold"]["loaded_keys"]  # the cache loaded all the mesh
    assert ceiling["rules"]["settled"] and ceiling["rules"]["writes"] > 0
    parts = (ceiling["cache_load"]["cpu_seconds"] + ceiling["rules"]["first_round_cpu_seconds"]
             + ceiling["writes"] * figures["bus_floor"]["cpu_us_per_write"] / 1e6)
    assert figures["ceiling_seconds"] == pytest.approx(parts)


def _servers_of(pid: int) -> list[int]:
    """The nats-servers a process started (Linux: each /proc/<pid>/stat names its parent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(") ")
        if name == "nats-server" and int(rest.split()[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_benchmark_stopped_by_sigterm_stops_the_server_it_started(tmp_path: Path) -> None:
    # The benchmark stops its server itself when it is told to stop, and its store is removed.
    run = subprocess.Popen([sys.executable, "-m", "benchmarks.scaling", "--quick", "--json", str(tmp_path / "s.json")],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        servers = wait_until(lambda: _servers_of(run.pid), timeout=60, what="the benchmark's nats-server")
        run.terminate()
        assert run.wait(60) == 143
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in servers), timeout=15,
                   what="the benchmark's nats-server gone")
    finally:
        run.kill()
        run.wait()


# A driver whose clean-up never ends once SIGTERM unwinds it (a lock left taken, say); `argv[1]` is its grace.
STUCK_DRIVER = """
import sys, time
from benchmarks.harness import stop_cleanly_on_sigterm

stop_cleanly_on_sigterm(float(sys.argv[1]))
try:
    print("running", flush=True)  # inside the try: the signal the test sends on reading it unwinds through it
    while True:
        time.sleep(0.01)
finally:
    print("cleaning up", flush=True)
    while sys.argv[2] == "stuck":
        time.sleep(0.01)
"""


# A clean-up that ends has a grace it cannot outlast however loaded the machine; a stuck one, a short one.
@pytest.mark.parametrize(("clean_up", "grace"), [("ends", 60), ("stuck", 1)])
def test_a_driver_stopped_by_sigterm_exits_once_its_clean_up_ends_or_its_grace_is_over(clean_up: str,
                                                                                        grace: int) -> None:
    run = subprocess.Popen([sys.executable, "-c", STUCK_DRIVER, str(grace), clean_up], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert run.stdout is not None and run.stdout.readline() == "running\n"
        run.terminate()
        out, err = run.communicate(timeout=30)
        assert run.returncode == 143 and out == "cleaning up\n"
        assert ("did not end within" in err) == (clean_up == "stuck"), err
    finally:
        run.kill()
        run.wait()


def test_a_seat_process_peak_rss_is_its_own_not_that_of_the_process_that_started_it() -> None:
    # Linux keeps in getrusage's ru_maxrss the peak of the image a process was started from: a seat process started
    # by a benchmark holding 262 MiB said 262 MiB, whatever it held itself.
    held = bytearray(256 * 2**20)
    held[:: 4096] = b"x" * len(held[:: 4096])  # every page touched: resident
    child = subprocess.run(
        [sys.executable, "-c", "from benchmarks.seat_proc import peak_rss; print(peak_rss())"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    assert int(child.stdout) < len(held) / 2, f"the child's peak {int(child.stdout)} is the parent's"
    del held


def test_the_p99_floor_writes_each_change_alone_at_the_put_limit() -> None:
    # At 1,000 puts a second a change of 100 keys has its k-th key written k ms after it at the soonest; ten changes
    # of one key, 1 ms each. Of the 110 bounds, the 99th percentile (nearest rank: the 109th) is 99 ms.
    load = Load(fan_outs=[100, *[1] * 10])
    assert load.p99_floor(1000.0) == pytest.approx(99.0)
    assert Load(fan_outs=[1, 1]).p99_floor(500.0) == pytest.approx(2.0)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="a thread's CPU is read from Linux's /proc")
def test_the_breakdown_counts_each_parts_own_cpu_less_the_parts_within_it() -> None:
    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    class Seat:
        @staticmethod
        def outer() -> None:
            spin(0.05)
            Seat.inner()

        @staticmethod
        def inner() -> None:
            spin(0.1)

    parts = Breakdown(((Seat, "outer", "outer"), (Seat, "inner", "inner")))
    parts.install()
    Seat.outer()
    Seat.inner()
    figures = parts.figures()
    main = time.thread_time()
    by_part = figures["cpu_by_part"]
    assert by_part["inner"]["calls"] == 2 and by_part["outer"]["calls"] == 1
    assert 0.2 <= by_part["inner"]["cpu_seconds"] < 0.3
    assert 0.05 <= by_part["outer"]["cpu_seconds"] < 0.1, "the inner part's CPU was counted as the outer's too"
    assert set(figures["cpu_by_thread"]) == {"bus loop", "main", "others"}
    assert figures["cpu_by_thread"]["main"] == pytest.approx(main, abs=0.05), "the main thread's CPU, in seconds"


def test_the_breakdowns_parts_are_where_the_seat_looks_them_up() -> None:
    # A part renamed or moved would otherwise be found missing only when `--breakdown` runs.
    for owner, name, part in PARTS:
        assert callable(getattr(owner, name, None)), f"{part}: {owner.__name__}.{name} is gone"
        assert not inspect.iscoroutinefunction(getattr(owner, name)), f"{part}: a coroutine's thread CPU counts others"
