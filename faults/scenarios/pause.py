"""The NATS server paused (SIGSTOP, then SIGCONT) for longer than the seat's lease (contract 8, design.md property 3).

The disturbed seat is a `mesh_provisioner.seat.Seat` serving as `serve` does, holding a short lease (2 s). While the
stream of changes goes on, its server is frozen for one and a half lease times: the holder cannot renew, so it must
stop writing at once (its connection is spied on: no write of its states may go out past the lease the bus last
granted it). Once the server runs again, either a renewal reaches it before it has aged the key out, finds the lease
still its own and the seat writes again with its actors as they were, or the key aged out and the seat takes the
lease anew, starts its actors anew and resynchronises from the bus. Changes written during the pause reach the
server when it runs again. How many times the seat held the lease is a figure, not a check.
"""

from __future__ import annotations

import random
import threading
import time

from faults.mesh import final_changes, random_changes
from faults.spies import CasSpy
from faults.twin import Params, Run, Twin, finish
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.seat import Seat
from meshcheck import check
from meshcheck.bus import until

NAME = "pause"
FAULTS = "server pauses (SIGSTOP for 1.5 lease times, then SIGCONT) under a lease-holding seat"
CHANGES = 60
PAUSES = 2
LEASE = 2.0


def run(p: Params) -> Run:
    """One run: the stream with the server paused `p.faults` (2) times, then the final mesh; every check."""
    out = Run(NAME, p.seed)
    changes = random_changes(random.Random(p.seed), p.count(CHANGES), p.nodes)
    pauses = p.faults if p.faults is not None else PAUSES
    at = {(i + 1) * len(changes) // (pauses + 1) for i in range(pauses)}
    holds: list[tuple[float, Runtime | None]] = []
    resumed: list[float] = []
    with check.watching_errors() as errors, Twin(
        p.work, nodes=p.nodes, pace=p.pace, leased=True, lease_seconds=LEASE
    ) as twin:
        assert twin.server is not None
        server = twin.server
        config = twin.disturbed_config(lease_seconds=LEASE)
        seat = Seat(config, on_hold=lambda sup: holds.append((time.monotonic(), sup)))
        # The lease as the bus grants it: from the moment a take or renewal that succeeded was asked, for the lease
        # time (the key's max age runs from a later write). A write sent past that could race a standby's.
        granted = [0.0]
        take, renew = seat.lease.take, seat.lease.renew

        async def taken() -> bool:
            asked = time.monotonic()
            ok = await take()
            granted[0] = asked if ok else granted[0]
            return ok

        async def renewed() -> bool:
            asked = time.monotonic()
            ok = await renew()
            granted[0] = asked if ok else granted[0]
            return ok

        seat.lease.take = taken  # type: ignore[method-assign]
        seat.lease.renew = renewed  # type: ignore[method-assign]
        cas = CasSpy(held=lambda: time.monotonic() < granted[0] + LEASE)
        cas.wrap(seat.nc)
        twin.spies.append(cas)
        # A write sent just before the server froze is stored when it runs again, past the lease the server granted:
        # the spy shows the seat sent it in time; the history counts it (stored_after_lease) instead of failing.
        twin.late_writes_ok = True
        stop = threading.Event()
        serving = threading.Thread(target=seat.serve, args=(stop,), name="faults-seat", daemon=True)
        serving.start()
        pauser: threading.Thread | None = None

        def held() -> int:
            return sum(1 for _, sup in holds if sup is not None)

        def pause() -> None:
            server.pause()
            try:
                with twin.pacer.held():  # a frozen server takes no change: the stream's writes wait for it
                    stop.wait(LEASE * 1.5)  # the fault itself: frozen for longer than the lease
            finally:
                server.resume()
                resumed.append(time.monotonic())
                out.fault()

        try:
            until(lambda: (s := seat.supervisor) is not None and s.wait_settled(5), 60, 0.05, "the seat to hold")

            def fault() -> None:
                nonlocal pauser
                if pauser is not None:
                    pauser.join(30)
                    # Held again: by taking the lease anew, or by a renewal that found the key still its own.
                    until(lambda: seat.lease.held and seat.supervisor is not None, 60, 0.02,
                          "the seat to hold the lease again")
                pauser = threading.Thread(target=pause, name="faults-pause", daemon=True)
                pauser.start()

            twin.stream(changes, out, seconds=p.seconds, marks=at, fault=fault)
            if pauser is not None:
                pauser.join(30)
            for change in final_changes(changes, p.nodes):
                twin.write(change, out)

            def settled(timeout: float) -> bool:
                deadline = time.monotonic() + timeout
                try:
                    until(lambda: seat.supervisor is not None and seat.lease.held, timeout, 0.02, "the lease")
                except TimeoutError:
                    return False
                sup = seat.supervisor
                return sup is not None and sup.wait_settled(max(deadline - time.monotonic(), 1))

            def stepped_down() -> list[str]:
                # The seat must stop writing while it may not hold the lease, and write again once it holds it:
                # the spy and the final checks say both. It need not give the lease up at each pause: a renewal
                # that reaches a server which has not yet aged the key out finds it still its own.
                return cas.problems()

            finish(out, twin, settled=settled, seat=lambda: seat.supervisor,
                   answers=lambda: check.verb_answers(twin.disturbed.url),
                   errors=errors, more=stepped_down)
            retakes = [next((t for t, s in holds if s is not None and t > r), r) - r for r in resumed]
            out.figures.update(holds=held(), lease_seconds=LEASE, pause_seconds=LEASE * 1.5,
                               retake_after_resume_seconds=[round(x, 2) for x in retakes],
                               compare_and_sets=cas.writes)
        finally:
            stop.set()
            if pauser is not None:
                pauser.join(30)
            serving.join(60)
    return out
