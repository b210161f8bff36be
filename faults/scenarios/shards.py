"""The partitioned seat (contract 8.1): `serve --shards 8` processes share the mesh, some killed (SIGKILL), new ones
joining, while the changes flow.

Two seat processes (`python -m faults.logged`: `serve --shards 8` with every write logged) start on the disturbed bus
with a short lease (2 s) and split the shards between them. At evenly spaced points of the stream of changes a live
process holding the shard of one of the mesh's nodes (each fault the next node, so that the faults hit writers) is
killed with SIGKILL: its shards' leases are not given back, whatever it was doing is cut short. A watcher reads the
shard leases every 50 ms: the survivors must hold every shard the killed process held within the lease time and a
fifth plus their look interval (a fifth of the lease time, at most a second; contract 8.1). Then a new process joins
and takes its fair share back from them. The stream waits until the bus is settled (quiet, and what `settle()` of
its inputs says) before it goes on, which times the settle after each fault.

Every check of `finish`, with each write of the seat's states checked against the lease of its key's shard at the
moment the server stored it (meshcheck/history.py).
"""

from __future__ import annotations

import random
import threading
import time

from faults.mesh import final_changes, node_names, random_changes
from faults.scenarios.sigkill import LeaseWatch, Processes
from faults.twin import SETTLE_SECONDS, Params, Run, Twin, finish
from mesh_provisioner.contract import SEAT
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.shards import parse_shard_key, shard_of
from meshcheck import check
from meshcheck.bus import until

NAME = "shards"
FAULTS = "shard processes of a partitioned seat killed (SIGKILL), each followed by one joining"
CHANGES = 60
KILLS = 2
LEASE = 2.0
SHARDS = 8
PROCESSES = 2
POLL = 0.05
# The survivors' look interval (bus/shards.py `renew_every`): a free shard is seen at the next look.
LOOK = min(LEASE / 5, 1.0)
TAKEOVER_BOUND = LEASE * 1.2 + LOOK


class ShardWatch(LeaseWatch):
    """The pid holding each shard, as last read."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "faults-shard-watch")
        self.holders: dict[int, int] = {}
        self._lock = threading.Lock()
        self.start()

    def look(self) -> None:
        now: dict[int, int] = {}
        for key, value in self.bus.entries(SEAT).items():
            shard = parse_shard_key(key, SHARDS)
            lease = r.decode(r.Lease, value)
            if shard is not None and lease is not None:
                now[shard] = lease.pid
        with self._lock:
            self.holders = now

    def held(self) -> dict[int, int]:
        """The pid holding each shard, as last read."""
        with self._lock:
            return dict(self.holders)


def run(p: Params) -> Run:
    """One run: the stream with `p.faults` (2) shard processes killed, each followed by one joining; every check."""
    out = Run(NAME, p.seed)
    changes = random_changes(random.Random(p.seed), p.count(CHANGES), p.nodes)
    kills = p.faults if p.faults is not None else KILLS
    at = {(i + 1) * len(changes) // (kills + 1) for i in range(kills)}
    takeovers: list[float] = []
    settles: list[float] = []
    nodes = node_names(p.nodes)
    with Twin(p.work, nodes=p.nodes, pace=p.pace, leased=True, shards=SHARDS, lease_seconds=LEASE) as twin:
        url = twin.disturbed.url
        procs = Processes(url, p.work, lease=LEASE, more=("--shards", str(SHARDS)))
        twin.write_logs = procs.writes
        watch = ShardWatch(url)
        config = twin.disturbed_config(shards=SHARDS)

        def live() -> set[int]:
            return {q.pid for q in procs.all if q.poll() is None}

        def spread() -> bool:
            # Every shard held by a live process, each holding its fair share (8 among n: no two differ by more
            # than one).
            held = watch.held()
            counts = [sum(1 for pid in held.values() if pid == q) for q in live()]
            return len(held) == SHARDS and set(held.values()) <= live() and max(counts) - min(counts) <= 1

        def settled_now(timeout: float) -> bool:
            last: list[dict[str, int]] = [{}]

            def quiet() -> bool:
                seqs = twin.disturbed.last_seqs()
                calm = seqs == last[0]
                last[0] = seqs
                return calm and spread() and not check.settled_as(twin.disturbed, config.bound_reads)[1]

            try:
                until(quiet, timeout, 0.25, "the shard processes to settle")
            except TimeoutError:
                return False
            return True

        try:
            for _ in range(PROCESSES):
                procs.start()
            until(spread, 60, POLL, "the processes to split the shards")

            def fault() -> None:
                node = nodes[out.faults % len(nodes)]
                held = watch.held()
                victim = next(q for q in procs.all if q.pid == held.get(shard_of(node, SHARDS))
                              and q.poll() is None)
                lost_shards = {s for s, pid in held.items() if pid == victim.pid}
                victim.kill()
                victim.wait(10)
                out.fault()
                killed = out.last_fault

                def taken(shards: set[int] = lost_shards, dead: int = victim.pid) -> bool:
                    now = watch.held()
                    return all(now.get(s) not in (None, dead) for s in shards)

                try:
                    until(taken, 4 * LEASE, POLL / 2, "the survivors to take the killed process's shards")
                    takeovers.append(time.monotonic() - killed)
                except TimeoutError:
                    out.lost.append(f"the survivors did not take shards {sorted(lost_shards)} of the killed "
                                    f"process {victim.pid} within {4 * LEASE:g} s")
                procs.start()  # one joins: it takes its fair share back from the survivors
                if settled_now(SETTLE_SECONDS):
                    settles.append(time.monotonic() - killed)
                else:
                    out.lost.append(f"the processes did not settle within {SETTLE_SECONDS:g} s of fault "
                                    f"{out.faults}")

            twin.stream(changes, out, seconds=p.seconds, marks=at, fault=fault)
            for change in final_changes(changes, p.nodes):
                twin.write(change, out)

            def bounded() -> list[str]:
                # The watch reads every POLL s: a takeover is seen up to POLL late.
                return [f"the survivors took a killed process's shards {took:.2f} s after the kill, past the "
                        f"lease time and a fifth plus their look interval ({TAKEOVER_BOUND:.2f} s)"
                        for took in takeovers if took > TAKEOVER_BOUND + POLL]

            # The fixed point's fresh seat is a lone one (one shard): it composes every node, whoever's shard.
            finish(out, twin, settled=settled_now, answers=lambda: check.verb_answers(url), more=bounded)
            out.figures.update(
                lease_seconds=LEASE, shards=SHARDS, processes=len(procs.all),
                takeover_seconds=[round(t, 2) for t in takeovers], takeover_bound_seconds=round(TAKEOVER_BOUND, 2),
                settle_after_each_fault_seconds=[round(t, 2) for t in settles])
        finally:
            watch.close()
            procs.end(out)
    return out
