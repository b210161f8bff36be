"""The seat process killed with SIGKILL while a standby waits (contract 8, design.md properties 3 and 4).

Two `python -m mesh_provisioner serve` processes share the disturbed bus with a short lease (2 s): one holds the seat,
the other waits as a standby. At evenly spaced points of the stream of changes the holder is killed with SIGKILL
(no lease given back, whatever it was doing cut short) and a new standby is started, so one always waits. Each
holder is killed once it serves (its verb answers). The standby takes the seat once the lease ages out and
resynchronises from the bus. A watcher reads the lease every 50 ms to time each takeover.

The processes log JSON (`--log-format json`); their ERROR records are the errors that escaped. Their settling is
seen from the bus: settled once it holds what the undisturbed bus holds and the seat's buckets stop moving.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from faults.mesh import final_changes, random_changes
from faults.twin import Params, Run, Twin, finish
from mesh_provisioner.contract import HOLDER_KEY, SEAT
from mesh_provisioner.messages import records as r
from meshcheck import check
from meshcheck.bus import Bus, until

NAME = "sigkill"
FAULTS = "seat processes killed (SIGKILL) while a standby waits"
CHANGES = 60
KILLS = 2
LEASE = 2.0


class Processes:
    """The seat processes of a run, each logging JSON to a file of its own, and the writes it sends to another
    (`faults.logged`: the write history's checker tells by them who wrote what)."""

    def __init__(self, url: str, work: Path, *, lease: float = LEASE, more: tuple[str, ...] = ()) -> None:
        self.url = url
        self.work = work
        self.lease = lease
        self.more = more
        self.all: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.writes: list[Path] = []

    def start(self) -> subprocess.Popen[bytes]:
        """One more `serve` process."""
        n = len(self.all) + 1
        log, writes = self.work / f"seat-{n}.log", self.work / f"seat-{n}.writes"
        cmd = [sys.executable, "-m", "faults.logged", str(writes), "--nats", self.url, "--lease-seconds",
               str(self.lease), *self.more, "--log-format", "json", "serve"]
        with open(log, "wb") as out:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out)
        self.all.append(p)
        self.logs.append(log)
        self.writes.append(writes)
        return p

    def end(self, out: Run) -> None:
        """Stop every process; what did not stop cleanly is lost in `out`, and each exception in their logs an error."""
        out.lost += self.stop()
        for log in self.logs:
            out.errors += check.process_errors(log)

    def by_pid(self, pid: int) -> subprocess.Popen[bytes] | None:
        """The process of a pid, when it is one of these."""
        return next((p for p in self.all if p.pid == pid), None)

    def stop(self) -> list[str]:
        """SIGTERM every live process; answers each that did not exit 0 (a killed one aside)."""
        problems = []
        for p in self.all:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.all:
            try:
                code = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait(10)
                problems.append(f"the seat process {p.pid} did not stop on SIGTERM within 30 s")
            if code not in (0, -signal.SIGKILL):
                problems.append(f"the seat process {p.pid} exited {code}")
        return problems


class LeaseWatch:
    """Reads the seat's lease bucket every 50 ms on a connection of its own, on a thread of its own, until closed;
    each subclass says what it keeps of each reading (`look`)."""

    def __init__(self, url: str, name: str) -> None:
        self.bus = Bus(url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def look(self) -> None:
        """One reading of the bucket."""
        raise NotImplementedError

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.look()
            except Exception:  # the bus away for a moment: read again at the next tick
                continue

    def close(self) -> None:
        """Stop watching."""
        self._stop.set()
        self._thread.join(5)
        self.bus.close()


class HolderWatch(LeaseWatch):
    """Who holds the seat, and since when."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "faults-holder-watch")
        self.holder = 0
        self.changes: list[tuple[float, int]] = []
        self.start()

    def look(self) -> None:
        value = self.bus.get(SEAT, HOLDER_KEY)
        pid = r.decode(r.Lease, value).pid if value else 0
        if pid != self.holder:
            self.holder = pid
            self.changes.append((time.monotonic(), pid))

    def taken_after(self, at: float, other_than: int) -> float | None:
        """Seconds from `at` until a process other than `other_than` held the seat; None when none did."""
        return next((t - at for t, pid in self.changes if t >= at and pid and pid != other_than), None)


def run(p: Params) -> Run:
    """One run: the stream with the holder killed `p.faults` (2) times, then the final mesh; every check."""
    out = Run(NAME, p.seed)
    changes = random_changes(random.Random(p.seed), p.count(CHANGES), p.nodes)
    kills = p.faults if p.faults is not None else KILLS
    at = {(i + 1) * len(changes) // (kills + 1) for i in range(kills)}
    with Twin(p.work, nodes=p.nodes, pace=p.pace, leased=True, lease_seconds=LEASE) as twin:
        url = twin.disturbed.url
        procs = Processes(url, p.work)
        twin.write_logs = procs.writes
        watch = HolderWatch(url)
        takeovers: list[tuple[float, int]] = []
        try:
            procs.start()
            until(lambda: watch.holder, 60, 0.05, "a seat process to hold the seat")
            procs.start()
            until(lambda: check.verb_answers(url, 1) == [], 60, 0.1, "the holder to answer its verb")

            def live_holder() -> subprocess.Popen[bytes] | None:
                holder = procs.by_pid(watch.holder)
                return holder if holder is not None and holder.poll() is None else None

            def fault() -> None:
                # A live process holds the seat (the standby took over from the last one killed), and is killed.
                holder = until(live_holder, 60, 0.02, "a live process to hold the seat")
                # Serving, not still starting: on a large mesh a new holder spends a while loading it, and a
                # kill at the next mark would find every holder but the first still at it.
                out.lost += check.verb_answers(url, 60)
                holder.send_signal(signal.SIGKILL)
                holder.wait(10)
                out.fault()
                takeovers.append((out.last_fault, holder.pid))
                procs.start()  # the next standby

            twin.stream(changes, out, seconds=p.seconds, marks=at, fault=fault)
            for change in final_changes(changes, p.nodes):
                twin.write(change, out)

            def settled(timeout: float) -> bool:
                last: list[dict[str, int]] = [{}]

                def quiet() -> bool:
                    if live_holder() is None:
                        return False
                    seqs = twin.disturbed.last_seqs()
                    calm = seqs == last[0]
                    last[0] = seqs
                    return calm and twin.reference_seat.wait_settled(5) and not check.same(
                        twin.disturbed, twin.reference)[1]

                try:
                    until(quiet, timeout, 0.25, "the seat processes to settle")
                except TimeoutError:
                    return False
                return True

            def more() -> list[str]:
                problems = []
                for at_kill, pid in takeovers:
                    took = watch.taken_after(at_kill, pid)
                    if took is None:
                        problems.append(f"no standby took the seat after {pid} was killed")
                    else:
                        out.figures.setdefault("takeover_seconds", []).append(round(took, 2))
                return problems

            finish(out, twin, settled=settled, answers=lambda: check.verb_answers(url), more=more)
            out.figures.update(lease_seconds=LEASE, processes=len(procs.all))
        finally:
            watch.close()
            procs.end(out)
    return out
