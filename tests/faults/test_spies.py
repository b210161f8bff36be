"""The fault runner's spies (faults/spies.py): what they count, nested as the scenarios nest them."""

from __future__ import annotations

import asyncio

from helpers import NatsServer

from faults.spies import CasSpy, spied_runtimes
from mesh_provisioner.bus import attachment as attachment_module
from mesh_provisioner.config import Config
from meshcheck.history import EXPECTED


def test_spies_nested_each_count_the_writes_of_a_connection_made_within_both(nats_server: NatsServer) -> None:
    # A scenario spies on its runtimes around a twin that spies on its own (faults/twin.py): the inner spy once
    # called the function it replaced rather than the outer spy, and the outer counted no write at all.
    outer, inner = CasSpy(), CasSpy()
    real = attachment_module.connect_config  # type: ignore[attr-defined]

    async def writes() -> None:
        with spied_runtimes(outer), spied_runtimes(inner):
            nc = await attachment_module.connect_config(Config(nats=nats_server.url))  # type: ignore[attr-defined]
        try:
            await nc.publish(f"{CasSpy.PREFIX}provisions.n1.a", b"v", headers={EXPECTED: "0"})
            await nc.publish(f"{CasSpy.PREFIX}provisions.n1.b", b"v")  # blind
            await nc.flush()
        finally:
            await nc.close()

    asyncio.run(writes())
    assert (outer.writes, inner.writes) == (2, 2)
    assert len(outer.blind) == len(inner.blind) == 1
    assert attachment_module.connect_config is real, "the blocks did not put back what was there"  # type: ignore[attr-defined]
