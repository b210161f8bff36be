"""Loading a mesh's states into a bus: the demo's sample, and the tests' meshes. It writes other modules' buckets."""

from __future__ import annotations

from nats.js.api import StreamConfig

from mesh_provisioner.bus.connection import connect
from mesh_provisioner.rules.view import bucket


async def load_states(url: str, states: dict[str, dict[str, bytes]], *, replicas: int = 1) -> int:
    """Create each state's bucket when missing (kept by `replicas` servers of a cluster) and put every key's value;
    answers how many keys were put. `url` may name several servers, comma-separated."""
    nc = await connect(url.split(","))
    try:
        js = nc.jetstream()
        n = 0
        for state, values in states.items():
            kv = await js.create_key_value(bucket=bucket(state), history=1, replicas=replicas)
            for key, value in values.items():
                await kv.put(key, value)
                n += 1
        return n
    finally:
        await nc.close()


async def router_stream(url: str, duplicate_window: float = 24 * 3600.0, *, replicas: int = 1) -> None:
    """Create the stream a router of asks keeps (`asks` on `asks.ask.>`), as the demo's stand-in for the router.

    Its duplicate window is what de-duplicates an ask published again under the same `Nats-Msg-Id`.
    """
    nc = await connect(url.split(","))
    try:
        config = StreamConfig(name="asks", subjects=["asks.ask.>"], duplicate_window=duplicate_window,
                              num_replicas=replicas)
        await nc.jetstream().add_stream(config)
    finally:
        await nc.close()
