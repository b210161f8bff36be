"""A storm of bound entries: thousands of changes to one provider's `bound` bucket in a second (contract 5.3, 6).

Another module's connection puts (and now and then deletes) entries of `postgres.bound` as fast as the server takes
them, many in flight at once: the keys of every provision postgres provides on any node, and keys of no provision at
all (a helper ahead of the seat). The seat must coalesce: a key judged once for many changes, and its last state the
one its provider's last entry says. The undisturbed seat is given only the last entry of each key, as the disturbed
bus holds it once the storm is over: what a seat ends with must not depend on the entries it did not see.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from faults.mesh import REFERENCED, node_names
from faults.spies import CasSpy, spied_compositions, spied_runtimes
from faults.twin import Params, Run, Twin, finish
from mesh_provisioner.contract import bound, bucket
from meshcheck import check
from meshcheck.bus import Bus, raw

NAME = "storm"
FAULTS = "storm of a provider's bound entries, thousands a second"
CHANGES = 5000
STATE = bound("postgres")
IN_FLIGHT = 256

OUTCOMES: list[dict[str, Any] | None] = [
    {"state": "provided"}, {"state": "failed", "why": "quota"}, {"state": "waits", "why": "a person accepts it"},
    {"state": "provided"}, {}, None,
]


def storm_keys(nodes: int = 3) -> list[str]:
    """Every key postgres may provide in the mesh, but the one naming a vault value, and ten of no provision."""
    keys = []
    for node in node_names(nodes):
        keys += [f"{node}.webapp.postgres-database", f"{node}.mailer.postgres-database.mail",
                 f"{node}.gitea.postgres-database.main", f"{node}.reports.postgres-database"]
    keys = [k for k in keys if (STATE, k) not in REFERENCED]
    return keys + [f"zed{i}.nobody.postgres-database" for i in range(10)]


async def _storm(bus: Bus, changes: list[tuple[str, dict[str, Any] | None]], seconds: float) -> tuple[int, float]:
    """Make the changes with up to IN_FLIGHT at once; answers how many were made and in how many seconds."""
    kv = await bus.js.key_value(bucket(STATE))
    gate = asyncio.Semaphore(IN_FLIGHT)
    started = time.monotonic()
    made = 0

    async def one(key: str, value: dict[str, Any] | None) -> None:
        nonlocal made
        async with gate:
            if time.monotonic() - started > seconds:
                return
            if value is None:
                await kv.delete(key)
            else:
                await kv.put(key, raw(value))
            made += 1

    await asyncio.gather(*(one(k, v) for k, v in changes))
    return made, time.monotonic() - started


def run(p: Params) -> Run:
    """One run: a storm of `p.changes` (5000) entries, then the undisturbed seat given the last of each; every check."""
    out = Run(NAME, p.seed)
    rng = random.Random(p.seed)
    keys = storm_keys(p.nodes)
    changes = [(rng.choice(keys), rng.choice(OUTCOMES)) for _ in range(p.count(CHANGES))]
    cas = CasSpy()
    with check.watching_errors() as errors, spied_compositions() as composing, Twin(
        p.work, nodes=p.nodes, pace=p.pace
    ) as twin:
        with spied_runtimes(cas):
            sup = twin.start_disturbed()
        before = cas.writes
        made, took = twin.disturbed.loop.run(_storm(twin.disturbed, changes, p.seconds), p.seconds + 120)
        out.fault()
        out.changed(made)
        # The undisturbed seat gets the storm's outcome only: each key's last entry, as the disturbed bus holds it.
        last = twin.disturbed.entries(STATE)
        for key in keys:
            twin.reference.write(STATE, key, last.get(key))
        finish(out, twin, settled=sup.wait_settled, answers=lambda: check.composes(sup), errors=errors,
               more=lambda: cas.problems() + composing.problems())
        out.figures.update(entries=made, storm_seconds=round(took, 2),
                           entries_per_second=round(made / took) if took else None,
                           keys=len(keys), writes_of_the_seat=cas.writes - before)
    return out
