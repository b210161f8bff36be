"""The NATS connection of the seat: made to reconnect forever, and the buckets of its own states.

`connect` makes a client of the seat's own (`SeatClient`, link.py): it never gives up on the server, logs each
disconnect and reconnect and tells the client's Link of them, and has nats-py's defects worked around
(`natsfix.py`).

`ensure_buckets` creates the key-value buckets of the seat's own states (contract section 4) when they are
missing. The buckets the seat reads (section 2) belong to other modules and are never created here: a missing one
is waited for (see `cache.py`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from mesh_provisioner.bus.link import SeatClient
from mesh_provisioner.config import Config
from mesh_provisioner.rules.view import NEEDS, PLANS, PROVISIONS, REFUSED, SEAT, bucket

log = logging.getLogger("mesh_provisioner.bus.connection")

# The seat's own states, whose buckets the seat creates (contract section 4).
SEAT_STATES: Final = (PLANS, PROVISIONS, REFUSED, NEEDS, SEAT)
# The lease time of the seat, the max age of its lease bucket (contract section 8).
LEASE_SECONDS: Final = 15.0

_STREAM_NAME_IN_USE: Final = 10058  # JSStreamNameExistErr: someone created the bucket first


def stream_of(state: str) -> str:
    """The JetStream stream that holds a state's bucket: `KV_<bucket>`."""
    return f"KV_{bucket(state)}"


def subject_of(state: str, key: str) -> str:
    """The subject of a key of a state's bucket, `$KV.<bucket>.<key>` (`>`: every key)."""
    return f"$KV.{bucket(state)}.{key}"


def closed_for_good(nc: Client) -> str:
    """Why a client will not connect again ("" while it may): it is closed, by nats-py (on a server's error it takes
    as final, such as a control line too long) or by whoever holds it."""
    if not nc.is_closed:
        return ""
    err = nc.last_error
    return "the NATS connection is closed for good" + (f" ({type(err).__name__}: {err})" if err else "")


Callback = Callable[[], Awaitable[None]]


async def connect(servers: list[str], *, client: SeatClient | None = None, **options: Any) -> SeatClient:
    """A client of the seat's own connected to `servers` that reconnects forever, logs its disconnects and tells
    its Link: `client` when given (made beforehand, so that whoever made it can close it should this not return),
    else a new one.

    `options` go to nats-py's `Client.connect`; callbacks given there are called after this module's own.
    """
    nc = client if client is not None else SeatClient()
    tie = nc.link
    theirs_disconnected: Callback | None = options.pop("disconnected_cb", None)
    theirs_reconnected: Callback | None = options.pop("reconnected_cb", None)
    theirs_closed: Callback | None = options.pop("closed_cb", None)
    theirs_error: Callable[[Exception], Awaitable[None]] | None = options.pop("error_cb", None)

    async def disconnected() -> None:
        if not nc.is_closed:
            log.warning("disconnected from NATS; reconnecting")
        await tie.disconnected()
        if theirs_disconnected is not None:
            await theirs_disconnected()

    async def reconnected() -> None:
        log.warning("reconnected to NATS at %s", nc.connected_url.netloc if nc.connected_url else "?")
        await tie.reconnected()
        if theirs_reconnected is not None:
            await theirs_reconnected()

    async def closed() -> None:
        log.info("the NATS connection is closed")
        await tie.closed()
        if theirs_closed is not None:
            await theirs_closed()

    async def error(err: Exception) -> None:
        log.info("NATS: %s", err or type(err).__name__)
        if theirs_error is not None:
            await theirs_error(err)

    options.setdefault("max_reconnect_attempts", -1)
    options.setdefault("name", "mesh-provisioner")
    await nc.connect(
        servers,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        closed_cb=closed,
        error_cb=error,
        **options,
    )
    log.info("connected to NATS at %s", nc.connected_url.netloc if nc.connected_url else servers)
    return nc


async def open_bucket(js: JetStreamContext, state: str) -> tuple[KeyValue, api.StreamInfo]:
    """The bucket of a state, and its stream's info as of now; raises BucketNotFoundError when it is missing."""
    name = bucket(state)
    stream = stream_of(state)
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        raise nats.js.errors.BucketNotFoundError from None
    kv = KeyValue(name=name, stream=stream, pre=subject_of(state, ""), js=js, direct=bool(info.config.allow_direct))
    return kv, info


# What JetStream says while it cannot answer yet: nothing, no responder, or "temporarily unavailable".
_NOT_ANSWERING: Final = (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                         nats.js.errors.ServiceUnavailableError)


async def ensure_buckets(
    js: JetStreamContext,
    states: Iterable[str] = SEAT_STATES,
    *,
    history: int = 1,
    lease: float = LEASE_SECONDS,
    replicas: int = 1,
    patience: float = 0.0,
) -> list[str]:
    """Create the bucket of each state that has none; answers the buckets created.

    The seat creates only its own states' buckets (contract section 4); the lease bucket's max age is the lease
    time (section 8). `replicas` is how many servers of a cluster keep each (JetStream's R; at most the cluster's
    size). A bucket that exists is left as it is, whatever its configuration.

    While JetStream does not answer (a cluster electing its leaders after a server came back, say), each bucket is
    asked for again for `patience` seconds at most, then the error is raised.
    """
    deadline = asyncio.get_running_loop().time() + patience
    created = []
    for state in states:
        delay = 0.1
        while True:
            try:
                if await _ensure_bucket(js, state, history=history, lease=lease, replicas=replicas):
                    created.append(bucket(state))
                break
            except _NOT_ANSWERING as err:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise
                log.warning("JetStream does not answer for bucket %s yet (%s); asking again", bucket(state), err)
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 2.0)
    return created


async def _ensure_bucket(js: JetStreamContext, state: str, *, history: int, lease: float, replicas: int) -> bool:
    """Create one state's bucket unless it exists; whether this made it."""
    try:
        await js.stream_info(stream_of(state))
        return False
    except nats.js.errors.NotFoundError:
        pass
    ttl = lease if state == SEAT else None
    try:
        await js.create_key_value(bucket=bucket(state), history=history, ttl=ttl, replicas=replicas)
    except nats.js.errors.APIError as err:
        if err.err_code != _STREAM_NAME_IN_USE:
            raise
        return False
    log.info("created bucket %s", bucket(state))
    return True


async def ensure_config_buckets(nc: Client, config: Config) -> list[str]:
    """The seat's own buckets as a config says (`ensure_buckets`): each call within `request_timeout`, JetStream
    asked again while it does not answer for `work_timeout`; the whole within `config_buckets_wait(config)`."""
    return await ensure_buckets(
        nc.jetstream(timeout=config.request_timeout),
        lease=config.lease_seconds,
        replicas=config.replicas,
        patience=config.work_timeout,
    )


def config_buckets_wait(config: Config) -> float:
    """How long `ensure_config_buckets` may take: its patience, then a last try's two calls (looked for, made)."""
    return config.work_timeout + 2 * config.request_timeout


def connect_options(config: Config) -> dict[str, Any]:
    """nats-py's connect options for a config: credentials where given."""
    options: dict[str, Any] = {}
    if config.user:
        options["user"], options["password"] = config.user, config.password
    if config.token:
        options["token"] = config.token
    if config.creds:
        options["user_credentials"] = config.creds
    if config.nkey:
        options["nkeys_seed"] = config.nkey
    if config.tls_ca or config.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.tls_ca or None)
        if config.tls_cert:
            tls.load_cert_chain(config.tls_cert, config.tls_key or None)
        options["tls"] = tls
    return options


async def connect_config(config: Config, client: SeatClient | None = None) -> SeatClient:
    """A connection of the seat's own to the servers of a config, with its credentials (`client`: see `connect`)."""
    return await connect(config.servers(), client=client, **connect_options(config))
