"""One run of a scenario: its parameters, what it found, and the two buses it compares (disturbed and undisturbed).

Two buses get the same sample mesh and, change by change, the same changes (written to both by another module's
connection). A seat serves each: the disturbed one suffers the scenario's faults, the reference is left alone, in a
process of its own, and the stream is written by a process of its own too (`faults.apart`). Every
write to the disturbed seat's states is recorded as the run goes (`meshcheck.history.History`), and each seat
process logs the compare-and-sets it sends (`faults.spies.CasSpy`: in-process, or `python -m faults.logged` for a
seat process). The run ends with `finish`: both settled, then every check of `meshcheck.check` and the write
history's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.apart import SeatProcess, Writer
from faults.mesh import Change, prepare
from faults.servers import server
from faults.spies import CasSpy, spied_runtimes
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.config import Config
from mesh_provisioner.contract import LEASE_SECONDS
from mesh_provisioner.runtime import Runtime
from meshcheck import check, history
from meshcheck.bus import Bus, seat_config

log = logging.getLogger("faults")

SETTLE_SECONDS = 90.0


@dataclass
class Params:
    """What one run of a scenario does; None takes the scenario's own default."""

    seed: int
    work: Path
    changes: int | None = None
    """Changes of the other modules' states per run (`--count`): for bad input, the bad values through the live seat;
    for the storm, its bound entries; for warrants, the forged and replayed answers."""
    seconds: float = 60.0
    """The bound of a run's disturbance (`--seconds`): its stream of changes and faults ends by then."""
    faults: int | None = None
    """Faults per run where a scenario counts them (server restarts, pauses, processes killed)."""
    rate: float = 40.0
    """Actor kills per second, for the kills scenario."""
    inputs: int = 100_000
    """Bad values through the pure rules, for the bad-input scenario."""
    nodes: int = 3
    """The mesh's nodes (faults/mesh.py): the sample's three, or more grown ones."""
    pace: float | None = None
    """Changes a second of the stream (both buses' writes of one change count once); None: as fast as written."""

    def count(self, default: int) -> int:
        """The changes of this run: the one asked for, else the scenario's default."""
        return self.changes if self.changes is not None else default


class Pacer:
    """Spaces calls `1 / rate` seconds apart on average from the first: a call made late is made up for by the next
    ones coming at once, but never more than BURST seconds of them (after a pause of the stream, it goes on at the
    rate). Counts the calls, their span, and the time the stream was held (`held`) while a scenario waited on a fault.
    """

    BURST = 0.5

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.calls = 0
        self.first = self.last = 0.0
        self.held_for = 0.0
        self._next = 0.0

    def wait(self) -> None:
        """Return at the next slot."""
        now = time.monotonic()
        if self.rate:
            self._next = max(self._next, now - self.BURST) if self.calls else now
            if self._next > now:
                time.sleep(self._next - now)
                now = time.monotonic()
            self._next += 1.0 / self.rate
        self.first = self.first or now
        self.last = now
        self.calls += 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The stream held while a scenario injects a fault and waits on what it must see of it (a server back, the
        processes settled): that time is not the stream's, and its pace is reported without it. After, the stream
        goes on at the rate, with no burst for the time held."""
        since = time.monotonic()
        try:
            yield
        finally:
            now = time.monotonic()
            if self.calls:
                self.held_for += now - since
            self._next = now

    def figures(self) -> dict[str, Any]:
        """The rate asked for and the one made, changes a second over the span of the calls less the time the stream
        was held; and over the whole span."""
        span = self.last - self.first
        flowing = span - self.held_for

        def rate(seconds: float) -> float | None:
            return round((self.calls - 1) / seconds, 1) if self.calls > 1 and seconds > 0 else None

        return {"asked": self.rate, "made": rate(flowing), "overall": rate(span), "held_seconds": round(
            self.held_for, 2), "changes": self.calls}


@dataclass
class Run:
    """What one run did and found."""

    scenario: str
    seed: int
    faults: int = 0
    changes: int = 0
    settle_seconds: float | None = None
    lost: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    seconds: float = 0.0
    last_fault: float = 0.0
    last_change: float = 0.0

    @property
    def ok(self) -> bool:
        """Nothing was lost, and no exception escaped."""
        return not self.lost and not self.errors

    def fault(self) -> None:
        """One fault injected now."""
        self.faults += 1
        self.last_fault = time.monotonic()

    def changed(self, n: int = 1) -> None:
        """n changes made now."""
        self.changes += n
        self.last_change = time.monotonic()

    def as_json(self) -> dict[str, Any]:
        """The run as the runner's JSON keeps it."""
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "faults": self.faults,
            "changes": self.changes,
            "settle_seconds": None if self.settle_seconds is None else round(self.settle_seconds, 3),
            "lost": self.lost,
            "errors": self.errors,
            "figures": self.figures,
            "summary": self.summary,
            "seconds": round(self.seconds, 2),
        }


class Twin:
    """The disturbed bus and the undisturbed one, each with the mesh loaded, and the reference seat on the latter.

    `disturbed_url` is a bus the scenario made itself (a cluster); else a server is started here. The disturbed
    seat is the scenario's to start (`start_disturbed` for an in-process supervisor).

    `leased`: the disturbed seat holds a lease (`serve`, a `Seat`), and every write must be its holder's; a lone
    runtime holds none, and its writes need only be its own. `shards`: the seat's shard count (contract 8.1).
    """

    def __init__(
        self,
        work: Path,
        *,
        disturbed_url: str = "",
        replicas: int = 1,
        max_payload: int = 0,
        leased: bool = False,
        shards: int = 1,
        nodes: int = 3,
        pace: float | None = None,
        **config: Any,
    ) -> None:
        self.config = config
        self.nodes = nodes
        self.pacer = Pacer(pace)
        self.replicas = replicas
        self.leased = leased
        self.late_writes_ok = False
        self.shards = shards
        self.spies: list[CasSpy] = [CasSpy()]  # the in-process seats' writes; a scenario adds its own spies
        self.write_logs: list[Path] = []  # the seat processes' writes (faults.logged)
        self.history: history.History | None = None
        self.server: EmbeddedServer | None = None
        self.reference_server = server(work / "reference").start()
        if not disturbed_url:
            self.server = server(work / "disturbed", max_payload=max_payload).start()
            disturbed_url = self.server.url
        self.disturbed = Bus(disturbed_url)
        self.reference = Bus(self.reference_server.url)
        prepare(self.disturbed, replicas=replicas, nodes=nodes)
        prepare(self.reference, nodes=nodes)
        self.history = history.History(self.disturbed, replicas=replicas,
                                       lease_seconds=float(config.get("lease_seconds", LEASE_SECONDS)))
        self.reference_seat = SeatProcess(seat_config(self.reference.url, **config))
        self.writer = Writer(self.disturbed.url, self.reference.url, timeout=self.disturbed.timeout)
        self.sup: Runtime | None = None
        if not self.reference_seat.wait_settled(SETTLE_SECONDS):
            raise RuntimeError("the undisturbed seat did not settle on the sample mesh")

    def disturbed_config(self, **more: Any) -> Config:
        """The disturbed seat's config."""
        return seat_config(self.disturbed.url, **{"replicas": self.replicas, **self.config, **more})

    def start_disturbed(self, **more: Any) -> Runtime:
        """An in-process seat on the disturbed bus, settled on the sample mesh.

        A start that times out (a loaded cluster creating the seat's replicated buckets) is tried again, as a process
        manager starts a seat process again: what it created stays.
        """
        for attempt in range(3):
            try:
                with spied_runtimes(self.spies[0]):
                    self.sup = Runtime.start(self.disturbed_config(**more))
                break
            except TimeoutError as err:
                log.warning("the disturbed seat did not start (%s); starting it again", err)
                if attempt == 2:
                    raise
        assert self.sup is not None
        if not self.sup.wait_settled(SETTLE_SECONDS):
            raise RuntimeError(f"the disturbed seat did not settle on the sample mesh: {self.sup.status()}")
        return self.sup

    def intents(self) -> list[history.Intent]:
        """Every compare-and-set the disturbed seat's processes sent, as they logged it."""
        out = [i for spy in self.spies for i in spy.intents]
        for path in self.write_logs:
            out += history.read_intents(path)
        return out

    def checked_history(self, run: Run) -> list[str]:
        """The write history checked (meshcheck.history): its figures into the run, its problems answered."""
        if self.history is None:
            return ["no write history was recorded"]
        figures, problems = history.check(self.history, self.intents(), shards=self.shards, leased=self.leased,
                                                 late_ok=self.late_writes_ok)
        run.figures["write_history"] = figures
        return problems

    def write(self, change: Change, run: Run | None = None, *, reference: bool = True) -> None:
        """Make one change on both buses (or on the disturbed one alone), at the run's pace."""
        self.pacer.wait()
        self.writer.write(change, reference=reference)
        if run is not None:
            run.changed()

    def stream(self, changes: list[Change], run: Run, *, seconds: float, marks: Collection[int],
               fault: Callable[[], None]) -> None:
        """Make the changes in order at the run's pace, for `seconds` at most; before each change whose index is in
        `marks`, `fault()` injects a fault and waits on what it must see of it, with the stream held (`Pacer.held`)."""
        started = time.monotonic()
        for i, change in enumerate(changes):
            if time.monotonic() - started > seconds:
                break
            if i in marks:
                with self.pacer.held():
                    fault()
            self.write(change, run)

    def close(self) -> None:
        """Stop both seats, both connections and the servers this started."""
        for stop in (
            self.sup.stop if self.sup is not None else None,
            self.reference_seat.stop,
            self.writer.stop,
            self.history.close if self.history is not None else None,
            self.disturbed.close,
            self.reference.close,
            self.server.stop if self.server is not None else None,
            self.reference_server.stop,
        ):
            if stop is None:
                continue
            try:
                stop()
            except Exception as err:
                log.warning("closing a run: %s", err)

    def __enter__(self) -> Twin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finish(
    run: Run,
    twin: Twin,
    *,
    settled: Callable[[float], bool],
    seat: Callable[[], Runtime | None] | None = None,
    answers: Callable[[], list[str]],
    errors: check.ErrorLog | None = None,
    more: Callable[[], list[str]] | None = None,
    config: Config | None = None,
) -> None:
    """The end of every scenario: the disturbed seat settled (timed from the last fault or change), the reference
    settled, then every check of `meshcheck.check`; each problem goes into `run.lost`."""
    since = max(run.last_fault, run.last_change) or time.monotonic()
    try:
        done = settled(SETTLE_SECONDS)
    except Exception as err:  # a seat whose bus is gone times out where it asks it whether it caught up
        log.warning("asking whether the disturbed seat settled: %s", err)
        done = False
    if done:
        run.settle_seconds = time.monotonic() - since
    else:
        sup = seat() if seat is not None else twin.sup
        why = f": {check.unsettled(sup)}" if sup is not None else ""
        run.lost.append(f"the disturbed seat did not settle within {SETTLE_SECONDS:g} s of the last fault{why}")
    if not twin.reference_seat.wait_settled(SETTLE_SECONDS):
        run.lost.append("the undisturbed seat did not settle")
    run.lost += answers()
    # Before the fixed point's fresh seat, whose writes (none, at a fixed point) would be no seat process's.
    run.lost += twin.checked_history(run)
    settled_config = config or twin.disturbed_config()
    summary, differences = check.settled_as(twin.disturbed, settled_config.bound_reads)
    run.lost += differences
    run.lost += check.fixed_point(twin.disturbed, settled_config, SETTLE_SECONDS)
    # The undisturbed run is kept for what settle() of the final inputs leaves to history (meshcheck/settled.py):
    # a retiring key's dependencies, a key needed once and kept, a held provider's provisions. settle() cannot say
    # what those should be; a seat given the same changes without faults can, for the keys it ends with too.
    same, differences = check.same(twin.disturbed, twin.reference)
    run.lost += differences
    asks, twice = check.asked_once(twin.disturbed)
    run.lost += twice
    run.figures["asks"] = asks
    run.figures["nodes"] = twin.nodes
    if twin.pacer.calls:
        run.figures["changes_per_second"] = twin.pacer.figures()
    if more is not None:
        run.lost += more()
    run.errors += [f"the undisturbed seat: {p}" for p in twin.reference_seat.problems()]
    if errors is not None:
        run.errors += errors.problems()
        run.figures["deliberate kills logged"] = errors.kills
    run.summary = f"{summary}; against the undisturbed run: {same}"
