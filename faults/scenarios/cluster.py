"""A three-server NATS cluster on loopback, one server killed mid-stream and brought back (design.md property 3).

Three nats-servers route to each other on free loopback ports, each with JetStream in a store of its own. Every
bucket is replicated on all three: the other modules' (as the mesh would keep them), the router's stream and its
records, and the seat's own, which the seat creates itself with `--replicas 3` (`Config.replicas`). The seat is
given all three URLs. At a third of the stream a server is killed (SIGKILL), at two thirds it is started again on its
ports and store; a leader lost means an election, during which writes wait.
"""

from __future__ import annotations

import random
import time

from faults.mesh import final_changes, random_changes
from faults.servers import Cluster
from faults.spies import CasSpy, spied_compositions, spied_runtimes
from faults.twin import Params, Run, Twin, finish
from mesh_provisioner.contract import PLANS, PROVISIONS, REFUSED, SEAT
from meshcheck import check

NAME = "cluster"
FAULTS = "servers of a three-server cluster killed (SIGKILL) and brought back"
CHANGES = 150
KILLS = 1
REPLICAS = 3


def run(p: Params) -> Run:
    """One run: the stream with a cluster server killed and revived `p.faults` (1) times; every check."""
    out = Run(NAME, p.seed)
    rng = random.Random(p.seed)
    changes = random_changes(rng, p.count(CHANGES), p.nodes)
    kills = p.faults if p.faults is not None else KILLS
    # Each kill at (2k+1)/(2n+1) of the stream, its revival at (2k+2)/(2n+1).
    marks = [(j + 1) * len(changes) // (2 * kills + 1) for j in range(2 * kills)]
    cluster = Cluster(p.work / "cluster").start()
    cas = CasSpy()
    try:
        with check.watching_errors() as errors, spied_compositions() as composing, Twin(
            p.work, nodes=p.nodes, pace=p.pace, disturbed_url=cluster.url, replicas=REPLICAS
        ) as twin:
            with spied_runtimes(cas):
                sup = twin.start_disturbed()
            down = -1
            started = time.monotonic()
            for i, change in enumerate(changes):
                if time.monotonic() - started > p.seconds:
                    break
                if i in marks:
                    if down < 0:
                        down = rng.randrange(len(cluster.servers))
                        cluster.kill(down)
                    else:
                        cluster.revive(down)
                        down = -1
                    out.fault()
                twin.write(change, out)
            if down >= 0:
                cluster.revive(down)
                out.fault()
            for change in final_changes(changes, p.nodes):
                twin.write(change, out)

            def replicated() -> list[str]:
                return [f"the seat's bucket of {state} is kept by {n} server(s), not {REPLICAS}"
                        for state in (PLANS, PROVISIONS, REFUSED, SEAT)
                        if (n := twin.disturbed.stream_replicas(state)) != REPLICAS]

            finish(out, twin, settled=sup.wait_settled, answers=lambda: check.composes(sup), errors=errors,
                   more=lambda: replicated() + cas.problems() + composing.problems())
            out.figures.update(servers=len(cluster.servers), replicas=REPLICAS, resyncs=sup.cache.resyncs,
                               compare_and_sets=cas.writes)
    finally:
        cluster.stop()
    return out
