"""Loading a mesh's states into a bus: the demo's sample, the `load` command's, and the tests' meshes. It writes
other modules' buckets."""

from __future__ import annotations

import nats.js.errors
from nats.aio.client import Client
from nats.js.api import StreamConfig

from mesh_provisioner.bus.connection import LOAD_CONNECTION, connect
from mesh_provisioner.contract import ROUTER_STREAM, ROUTER_SUBJECTS, bucket

_STREAM_NAME_IN_USE = 10058  # JSStreamNameExistErr


async def put_states(nc: Client, states: dict[str, dict[str, bytes]], *, replicas: int = 1) -> int:
    """Create each state's bucket when missing (kept by `replicas` servers of a cluster) and put every key's value;
    answers how many keys were put."""
    js = nc.jetstream()
    n = 0
    for state, values in states.items():
        kv = await js.create_key_value(bucket=bucket(state), history=1, replicas=replicas)
        for key, value in values.items():
            await kv.put(key, value)
            n += 1
    return n


async def load_states(url: str, states: dict[str, dict[str, bytes]], *, replicas: int = 1) -> int:
    """`put_states` over a connection of its own; `url` may name several servers, comma-separated."""
    nc = await connect(url.split(","), name=LOAD_CONNECTION)
    try:
        return await put_states(nc, states, replicas=replicas)
    finally:
        await nc.close()


async def add_router_stream(nc: Client, duplicate_window: float = 24 * 3600.0, *, replicas: int = 1) -> bool:
    """Create the stream a router of asks keeps (`asks` on `asks.ask.>`), as a stand-in for the router; answers
    whether it was made (False: a stream of that name is there already).

    Its duplicate window is what de-duplicates an ask published again under the same `Nats-Msg-Id`.
    """
    config = StreamConfig(name=ROUTER_STREAM, subjects=list(ROUTER_SUBJECTS), duplicate_window=duplicate_window,
                          num_replicas=replicas)
    js = nc.jetstream()
    try:
        await js.stream_info(ROUTER_STREAM)
        return False
    except nats.js.errors.NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except nats.js.errors.APIError as err:
        if err.err_code != _STREAM_NAME_IN_USE:
            raise
        return False
    return True


async def router_stream(url: str, duplicate_window: float = 24 * 3600.0, *, replicas: int = 1) -> None:
    """`add_router_stream` over a connection of its own, as the demo's stand-in for the router."""
    nc = await connect(url.split(","), name=LOAD_CONNECTION)
    try:
        await add_router_stream(nc, duplicate_window, replicas=replicas)
    finally:
        await nc.close()
