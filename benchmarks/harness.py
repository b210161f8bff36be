"""What every benchmark run shares: the seat in a process of its own, the bus emptied between measurements, the
load's figures summed up, and the log of the run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Final

import nats
import nats.js.errors

from benchmarks import steady
from mesh_provisioner.contract import bucket

ROOT = Path(__file__).resolve().parent.parent
# How long a driver stopped by SIGTERM may take to clean up before it exits anyway (`stop_cleanly_on_sigterm`).
CLEAN_UP_GRACE: Final = 60.0


def stop_cleanly_on_sigterm(grace: float = CLEAN_UP_GRACE) -> None:
    """Have SIGTERM (a `timeout`, a CI job cancelled) unwind a driver's run as an exception does, so that each
    nats-server and seat process it started stops in order and each store is removed; past `grace` seconds of that
    clean-up the process exits anyway.

    The exception is raised wherever the main thread is, inside a library's lock bookkeeping too, where it can leave
    a lock taken and the clean-up waiting for it for ever: a watchdog thread bounds that. The handler only puts on a
    queue, whose put is reentrant, and takes no lock; a second SIGTERM does not cut the clean-up short. A driver that
    exits so still leaves nothing running: its servers die with it, and their stores are removed by the next one made
    (mesh_provisioner/bus/embedded.py)."""
    told: queue.SimpleQueue[int] = queue.SimpleQueue()
    signalled: list[int] = []

    def watch() -> None:
        signum = told.get()
        time.sleep(grace)  # the clean-up's time: its end ends the process, and this daemon thread with it
        os.write(2, f"the clean-up did not end within {grace:g} s of the signal: exiting\n".encode())
        os._exit(128 + signum)

    def handle(signum: int, frame: FrameType | None) -> None:
        if signalled:  # another while cleaning up: the clean-up goes on, the watchdog bounds it
            return
        signalled.append(signum)
        told.put(signum)
        sys.exit(128 + signum)

    threading.Thread(target=watch, name="sigterm-watchdog", daemon=True).start()
    signal.signal(signal.SIGTERM, handle)


async def _reset(url: str) -> None:
    """Delete every stream: the next mesh starts on an empty bus."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=60)
        for info in await js.streams_info():
            if info.config.name:
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()


def reset(url: str) -> None:
    """Delete every stream of the server."""
    asyncio.run(_reset(url))



# ---- the seat, in a process of its own --------------------------------------------------------------------------


class SeatProcess:
    """`benchmarks.seat_proc` in a subprocess: its first line is the cold start's figures."""

    def __init__(self, url: str, max_parallel: int | None = None, timeout: float = 1800.0, *, shards: int = 0,
                 wait: bool = True, metrics_addr: str = "") -> None:
        """The seat as configured by default, or with `max_parallel` compositions at once; with `shards`, one
        process of a partitioned seat; with `metrics_addr`, serving its `/metrics` there. Its first figures are
        waited for, unless not `wait` (then `first` does)."""
        bound = [] if max_parallel is None else ["--max-parallel", str(max_parallel)]
        sharded = ["--shards", str(shards)] if shards else []
        served = ["--metrics-addr", metrics_addr] if metrics_addr else []
        cmd = [sys.executable, "-m", "benchmarks.seat_proc", url, *bound, *sharded, *served,
               "--timeout", str(timeout), *os.environ.get("SEAT_ARGS", "").split()]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.started: dict[str, Any] = self._read() if wait else {}

    def first(self) -> dict[str, Any]:
        """The figures of its first settling (read once)."""
        if not self.started:
            self.started = self._read()
        return self.started

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the seat process ended with {self.proc.wait()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def _say(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def settle(self) -> dict[str, Any]:
        """Wait until the seat is settled; its figures."""
        return self._say("settle")

    def stop(self) -> dict[str, Any]:
        """Stop the seat; its last figures."""
        out = self._say("stop")
        self.proc.wait(60)
        return out

    def close(self, timeout: float = 60.0) -> None:
        """Make sure the process has ended, whatever state it is in: its stdin closed (it stops the seat as on
        `stop`), then SIGTERM, then SIGKILL, each waited for at most `timeout` seconds."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        for end in (None, self.proc.terminate, self.proc.kill):
            if end is not None:
                end()
            try:
                self.proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                continue


def cpu_seconds_of(pid: int | None) -> float:
    """The CPU time a process has spent so far, user and system (Linux: /proc/PID/stat); 0 for None."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log(*words: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *words, file=sys.stderr, flush=True)


def summary(result: steady.Load, rate: float, pools: dict[str, int]) -> dict[str, Any]:
    return {
        "rate": rate, "seconds": result.seconds, "changes": result.changes, "heavy_changes": result.heavy_changes,
        "matched": len(result.samples), "missed": result.missed, "targets": pools,
        "p50_ms": result.percentile(50), "p90_ms": result.percentile(90), "p99_ms": result.percentile(99),
        "max_ms": max(result.samples, default=float("nan")),
        "by_kind_p99_ms": {k: steady.Load(samples=v).percentile(99) for k, v in result.by_kind.items()},
        "by_fan_out": {k: _latency(v) for k, v in result.by_fan_out.items()},
        "samples_ms": [round(x, 3) for x in result.samples],
    }


def _latency(samples: list[float]) -> dict[str, Any]:
    """How many writes were timed, and their p50 and p99."""
    load = steady.Load(samples=samples)
    return {"writes": len(samples), "p50_ms": load.percentile(50), "p99_ms": load.percentile(99)}


async def provision_states_of(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        return await steady.provision_states(nc)
    finally:
        await nc.close()


def difference(bigger: Any, smaller: Any) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for state, kv in bigger.states.items():
        old = smaller.states.get(state, {})
        changed = {k: v for k, v in kv.items() if old.get(k) != v}
        if changed:
            out[state] = changed
    return out


async def put_states(url: str, states: dict[str, dict[str, bytes]]) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=60)
        puts = [(f"$KV.{bucket(s)}.{k}", v) for s, kv in states.items() for k, v in kv.items()]
        await asyncio.gather(*(js.publish(subject, v) for subject, v in puts))
    finally:
        await nc.close()
