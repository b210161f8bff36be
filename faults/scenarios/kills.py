"""Random actor kills at a given rate during a seeded stream of changes (design.md, properties 3 and 4).

A killer thread kills a random live child of the disturbed seat at random moments, `rate` a second on average: half
through the chaos API (`Runtime.kill`: it dies as a crash would, at its next message) and half by a stop from
outside (`ActorRef.stop()`). The restart intensity is raised for the run: kills at this rate are far past the
production limit (10 in 60 s) by design, and the point is what the restarted actors recover, not the give-up.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time

from faults.mesh import final_changes, random_changes
from faults.spies import CasSpy, spied_compositions, spied_runtimes
from faults.twin import Params, Run, Twin, finish
from mesh_provisioner.runtime import Runtime
from meshcheck import check
from meshcheck.bus import until

NAME = "kills"
FAULTS = "actor kills (crash or stop), at random"
CHANGES = 300


def kill_one(sup: Runtime, rng: random.Random) -> bool:
    """Kill a random live child, by the chaos API or by a stop from outside; whether one was alive."""
    alive = [(n, ref) for n, ref in sup.children().items() if ref.is_alive()]
    if not alive:
        return False
    name, ref = rng.choice(alive)
    if rng.random() < 0.5:
        try:
            sup.kill(name)
        except KeyError:
            return False
    else:
        ref.stop(block=False)
    return True


def run(p: Params) -> Run:
    """One run: the stream with kills at `p.rate` a second (at least `p.faults` of them when given), then the
    final mesh; every check."""
    out = Run(NAME, p.seed)
    rng = random.Random(p.seed)
    changes = random_changes(rng, p.count(CHANGES), p.nodes)
    cas = CasSpy()
    with check.watching_errors() as errors, spied_compositions() as composing, Twin(
        p.work, nodes=p.nodes, pace=p.pace, restart_intensity=100_000, backoff_first=0.005, backoff_max=0.05
    ) as twin:
        with spied_runtimes(cas):
            sup = twin.start_disturbed()
        stop = threading.Event()
        killer_rng = random.Random(p.seed + 1)

        def killer() -> None:
            while not stop.wait(killer_rng.expovariate(p.rate)):
                if kill_one(sup, killer_rng):
                    out.fault()

        thread = threading.Thread(target=killer, name="faults-killer", daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            for change in changes:
                if time.monotonic() - started > p.seconds:
                    break
                twin.write(change, out)
            if p.faults:  # at least this many kills before the final mesh, within the run's bound
                with twin.pacer.held():  # the fault and its waits: not the stream's time
                    left = max(p.seconds - (time.monotonic() - started), 0.1)
                    with contextlib.suppress(TimeoutError):
                        until(lambda: out.faults >= (p.faults or 0), left, 0.01, "the kills asked for")
            for change in final_changes(changes, p.nodes):
                twin.write(change, out)
        finally:
            stop.set()
            thread.join(10)
        out.figures["restarts"] = sum(sup.status().restarts.values())
        finish(out, twin, settled=sup.wait_settled, answers=lambda: check.composes(sup), errors=errors,
               more=lambda: cas.problems() + composing.problems())
        out.figures.update(compositions=composing.count, compare_and_sets=cas.writes,
                           asks_published_again=sup.asks.duplicates)
    return out
