"""A three-server NATS cluster on loopback, a server of each role killed mid-stream and brought back (design.md
property 3).

Three nats-servers route to each other on free loopback ports, each with JetStream in a store of its own. Every
bucket is replicated on all three: the other modules' (as the mesh would keep them), the router's stream and its
records, and the seat's own, which the seat creates itself with `--replicas 3` (`Config.replicas`). The seat serves
as `serve` does (a `Seat`, holding the lease) and is given all three URLs.

Each kill takes the server of one role, in turn: the one the seat is connected to, the leader of the lease's stream,
the leader of a watched bucket (placement), a follower (a server that is none of these). While it is down, the
changes go on; before it is brought back the seat must have written them, within twice the time the undisturbed seat
on one server took for the same changes, plus the cluster's election of new leaders. With a quorum standing the seat
never gives up its lease.
"""

from __future__ import annotations

import random
import threading
import time

import nats.js.errors

from faults.mesh import final_changes, random_changes
from faults.servers import Cluster
from faults.spies import CasSpy, spied_compositions
from faults.twin import SETTLE_SECONDS, Params, Run, Twin, finish
from mesh_provisioner.bus.cache import watched_states
from mesh_provisioner.bus.watch import ATTEMPT, RETRY_MAX
from mesh_provisioner.contract import PLACEMENT, PLANS, PROVISIONS, REFUSED, SEAT
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.seat import Seat
from meshcheck import check
from meshcheck.bus import Bus, until

NAME = "cluster"
FAULTS = ("kills (SIGKILL) and revivals of a server of a three-server cluster, each role in turn: the seat's, "
          "the lease's leader, a watched bucket's leader, a follower")
CHANGES = 160
ROLES = ("the seat's server", "the lease's leader", "a watched bucket's leader", "a follower")
KILLS = len(ROLES)
REPLICAS = 3
# How long after the election a watch that could not be made tries again, at most: a try's wait and the pause after.
NOTICED = ATTEMPT + RETRY_MAX
# The slack of measuring a settle by polling (`wait_settled` looks every few milliseconds, twice in a row).
POLL_SLACK = 0.25
# The streams the seat needs a leader of to go on: every bucket it watches (each of them watched again after its own
# server is lost), and its lease's. A watch's consumer is made by the cluster's meta leader: a consumer made says
# that one is in place too.
ELECTED = (*watched_states(), SEAT)


def server_of(seat: Seat, cluster: Cluster) -> int:
    """The index of the server the seat's connection is on now."""
    url = seat.nc.connected_url
    return next(i for i, s in enumerate(cluster.servers) if url is not None and s.port == url.port)


def choose(role: str, seat: Seat, cluster: Cluster, bus: Bus, streams: list[str]) -> int:
    """The server that has this role now."""

    def leader(state: str) -> int | None:
        return cluster.index(bus.stream_leader(state))

    mine, lease, watched = server_of(seat, cluster), leader(SEAT), leader(PLACEMENT)
    if role == ROLES[0]:
        return mine
    if role == ROLES[1] and lease is not None:
        return lease
    if role == ROLES[2] and watched is not None:
        return watched
    leaders = {leader(s) for s in streams}
    followers = [i for i in range(len(cluster.servers)) if i != mine and i not in leaders]
    return followers[0] if followers else next(i for i in range(len(cluster.servers)) if i not in (mine, lease))


def exists(bus: Bus, state: str) -> bool:
    """Whether a state's bucket exists on the bus."""
    try:
        bus.stream_replicas(state)
    except nats.js.errors.NotFoundError:
        return False
    return True


class Downtime:
    """One server down: when it was killed, and when the streams the seat needs had leaders again (a thread looks)."""

    def __init__(self, role: str, server: int, bus: Bus, streams: list[str]) -> None:
        self.role, self.server = role, server
        self.killed_at = time.monotonic()
        self.elected_at: float | None = None
        name = f"n{server + 1}"

        def look() -> None:
            def led() -> bool:
                try:
                    return (all(bus.stream_leader(s) not in ("", name) for s in streams)
                            and bus.makes_consumers(PLACEMENT))
                except Exception:
                    return False

            try:
                until(led, SETTLE_SECONDS, 0.05, "new leaders")
                self.elected_at = time.monotonic()
            except TimeoutError:
                pass

        self._looking = threading.Thread(target=look, name="faults-election", daemon=True)
        self._looking.start()

    def election(self) -> float | None:
        """Seconds from the kill until every stream the seat needs had a leader on a live server."""
        self._looking.join(SETTLE_SECONDS)
        return None if self.elected_at is None else self.elected_at - self.killed_at


def run(p: Params) -> Run:
    """One run: the stream with a server of each role killed and revived in turn (`p.faults` kills, a role each,
    four by default); every check."""
    out = Run(NAME, p.seed)
    rng = random.Random(p.seed)
    changes = random_changes(rng, p.count(CHANGES), p.nodes)
    kills = p.faults if p.faults is not None else KILLS
    # Each kill at (2k+1)/(2n+1) of the stream, its revival at (2k+2)/(2n+1).
    marks = [(j + 1) * len(changes) // (2 * kills + 1) for j in range(2 * kills)]
    cluster = Cluster(p.work / "cluster").start()
    holds: list[Runtime | None] = []
    downs: list[dict[str, object]] = []
    try:
        with check.watching_errors() as errors, spied_compositions() as composing, Twin(
            p.work, nodes=p.nodes, pace=p.pace, disturbed_url=cluster.url, replicas=REPLICAS, leased=True
        ) as twin:
            seat = Seat(twin.disturbed_config(), on_hold=holds.append)
            cas = CasSpy(held=lambda: seat.lease.held)
            cas.wrap(seat.nc)
            twin.spies.append(cas)
            stop = threading.Event()
            serving = threading.Thread(target=seat.serve, args=(stop,), name="faults-seat", daemon=True)
            serving.start()
            try:
                until(lambda: (s := seat.supervisor) is not None and s.wait_settled(5), 120, 0.05, "the seat to hold")
                down: Downtime | None = None
                streams = [state for state in ELECTED if exists(twin.disturbed, state)]

                def fault() -> None:
                    nonlocal down
                    if down is None:
                        role = ROLES[len(downs) % len(ROLES)]
                        server = choose(role, seat, cluster, twin.disturbed, streams)
                        cluster.kill(server)
                        down = Downtime(role, server, twin.disturbed, streams)
                    else:
                        downs.append(while_down(out, twin, seat, down))
                        cluster.revive(down.server)
                        down = None
                    out.fault()

                twin.stream(changes, out, seconds=p.seconds, marks=marks, fault=fault)
                if down is not None:
                    with twin.pacer.held():
                        downs.append(while_down(out, twin, seat, down))
                        cluster.revive(down.server)
                        out.fault()
                for change in final_changes(changes, p.nodes):
                    twin.write(change, out)

                def replicated() -> list[str]:
                    return [f"the seat's bucket of {state} is kept by {n} server(s), not {REPLICAS}"
                            for state in (PLANS, PROVISIONS, REFUSED, SEAT)
                            if (n := twin.disturbed.stream_replicas(state)) != REPLICAS]

                def kept_the_lease() -> list[str]:
                    if holds == [holds[0]] and holds[0] is not None:
                        return []
                    times = sum(1 for h in holds if h)
                    return [f"the seat gave up its lease with a quorum standing: it held it {times} times"]

                def settled(timeout: float) -> bool:
                    sup = seat.supervisor
                    return sup is not None and sup.wait_settled(timeout)

                finish(out, twin, settled=settled, seat=lambda: seat.supervisor,
                       answers=lambda: check.verb_answers(twin.disturbed.url), errors=errors,
                       more=lambda: replicated() + kept_the_lease() + cas.problems() + composing.problems())
                sup = seat.supervisor
                out.figures.update(servers=len(cluster.servers), replicas=REPLICAS, while_down=downs,
                                   resyncs=sup.cache.resyncs if sup is not None else None,
                                   writes_sent_again=sup.store.resent if sup is not None else None,
                                   compare_and_sets=cas.writes)
            finally:
                stop.set()
                serving.join(60)
    finally:
        cluster.stop()
    return out


def while_down(out: Run, twin: Twin, seat: Seat, down: Downtime) -> dict[str, object]:
    """Before a killed server is brought back: how long the seat took to write the changes made since, against the
    bound (twice the undisturbed seat's time on one server, plus the election); a seat past it is said."""
    since = out.last_change
    alone: list[float] = []

    def undisturbed() -> None:
        if twin.reference_seat.wait_settled(SETTLE_SECONDS):
            alone.append(time.monotonic() - since)

    reference = threading.Thread(target=undisturbed, name="faults-reference", daemon=True)
    reference.start()
    sup = seat.supervisor
    settled = sup is not None and sup.wait_settled(SETTLE_SECONDS)
    took = time.monotonic() - since
    reference.join(SETTLE_SECONDS)
    election = down.election()
    figures: dict[str, object] = {"role": down.role, "server": down.server + 1, "settle_seconds": round(took, 3),
                                  "alone_seconds": round(alone[0], 3) if alone else None,
                                  "election_seconds": None if election is None else round(election, 3)}
    if not settled:
        out.lost.append(f"with {down.role} down, the seat did not settle within {SETTLE_SECONDS:g} s")
    elif election is None:
        out.lost.append(f"with {down.role} down, the cluster gave the seat's streams no leaders within "
                        f"{SETTLE_SECONDS:g} s")
    elif alone and election is not None and took > (bound := 2 * alone[0] + election + NOTICED + POLL_SLACK):
        out.lost.append(f"with {down.role} down, the seat wrote the changes {took:.2f} s after the last, past "
                        f"{bound:.2f} s: twice the undisturbed seat's {alone[0]:.2f} s, plus the election's "
                        f"{election:.2f} s, {NOTICED} s for a watch's next try and {POLL_SLACK} s of polling")
    return figures
