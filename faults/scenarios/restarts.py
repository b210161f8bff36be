"""The NATS server restarted several times during a seeded stream of changes (design.md, property 3).

The disturbed seat's server goes down and comes back on the same port and store, alternately killed (SIGKILL, as a
crash) and stopped (SIGTERM), at evenly spaced points of the stream; before each restart but the first the seat must
be back on the bus (its cache resynchronised), so every restart finds a seat that was working. Changes made while the
seat was away, or as it came back, must arrive as changes.
"""

from __future__ import annotations

import random

from faults.mesh import final_changes, random_changes
from faults.spies import CasSpy, spied_compositions, spied_runtimes
from faults.twin import Params, Run, Twin, finish
from meshcheck import check
from meshcheck.bus import until

NAME = "restarts"
FAULTS = "nats-server restarts (SIGKILL and SIGTERM alternately)"
CHANGES = 150
RESTARTS = 3


def run(p: Params) -> Run:
    """One run: the stream with the server restarted `p.faults` (3) times, then the final mesh; every check."""
    out = Run(NAME, p.seed)
    changes = random_changes(random.Random(p.seed), p.count(CHANGES), p.nodes)
    restarts = p.faults if p.faults is not None else RESTARTS
    at = {(i + 1) * len(changes) // (restarts + 1) for i in range(restarts)}
    cas = CasSpy()
    with check.watching_errors() as errors, spied_compositions() as composing, Twin(
        p.work, nodes=p.nodes, pace=p.pace
    ) as twin:
        with spied_runtimes(cas):
            sup = twin.start_disturbed()
        server = twin.server
        assert server is not None

        def fault() -> None:
            if out.faults:
                until(lambda: sup.cache.resyncs >= out.faults, 60, 0.02, "the seat back on the bus")
            if out.faults % 2 == 0:
                server.kill()
            else:
                server.stop()
            server.start()
            out.fault()

        twin.stream(changes, out, seconds=p.seconds, marks=at, fault=fault)
        for change in final_changes(changes, p.nodes):
            twin.write(change, out)

        def resynced() -> list[str]:
            if sup.cache.resyncs < out.faults:
                return [f"the seat resynchronised {sup.cache.resyncs} times after {out.faults} restarts"]
            return []

        finish(out, twin, settled=sup.wait_settled, answers=lambda: check.composes(sup), errors=errors,
               more=lambda: resynced() + cas.problems() + composing.problems())
        out.figures.update(resyncs=sup.cache.resyncs, compare_and_sets=cas.writes)
    return out
