"""The NATS connection of the seat: made to reconnect forever, and the buckets of its own states.

`connect` makes a client that never gives up on the server and logs each disconnect and reconnect. What the bus
layer keeps beside a client (`Link`: its count of requests, and who listens for reconnects) works for a client
the host made too: `link(nc)` makes it on first use, and a host that made its own client calls
`link(nc).reconnected()`, `link(nc).disconnected()` and `link(nc).closed()` from its own callbacks of the same names.

Whatever another module writes reaches the client as the subject of a message (a key is a subject), so the bus
layer reads every subject as the NATS protocol defines it, never taking the connection down over one (contract
section 7): see `_PROTOCOL_MSG` and `Link`.

`ensure_buckets` creates the key-value buckets of the seat's own states (contract section 4) when they are
missing. The buckets the seat reads (section 2) belong to other modules and are never created here: a missing one
is waited for (see `cache.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import socket
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import nats.errors
import nats.js.errors
import nats.protocol.parser
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from mesh_provisioner.config import Config
from mesh_provisioner.rules.view import NEEDS, PLANS, PROVISIONS, REFUSED, REGISTRY, SEAT, bucket

log = logging.getLogger("mesh_provisioner.bus.connection")

# The seat's own states, whose buckets the seat creates (contract section 4).
SEAT_STATES: Final = (PLANS, PROVISIONS, REFUSED, NEEDS, REGISTRY, SEAT)
# The lease time of the seat, the max age of its lease bucket (contract section 8).
LEASE_SECONDS: Final = 15.0

_STREAM_NAME_IN_USE: Final = 10058  # JSStreamNameExistErr: someone created the bucket first

# nats-py parses a message's control line with `\s` between its fields, but the protocol's delimiters are space and
# tab only: the server takes a subject with a vertical tab or a form feed in it (a key another module wrote), and
# nats-py then cannot parse the line that delivers it. It reconnects, or, with 4 KB or more behind the line, waits for
# bytes that never make it parse; each reconnect's watch delivers the key again, and a reconnect retried while the
# parser is stuck leaves two coroutines reading one stream ("read() called while another coroutine is already
# waiting"): the connection is lost for good. These are nats-py's patterns with the protocol's delimiters; they are
# module globals of nats-py's parser, so they hold for every client of the process.
_FIELD: Final = rb"([^ \t\r\n]+)"
_PROTOCOL_MSG: Final = re.compile(rb"\AMSG[ \t]+" + _FIELD + rb"[ \t]+" + _FIELD + rb"[ \t]+(" + _FIELD
                                  + rb"[ \t]+)?(\d+)\r\n")
_PROTOCOL_HMSG: Final = re.compile(rb"\AHMSG[ \t]+" + _FIELD + rb"[ \t]+" + _FIELD + rb"[ \t]+(" + _FIELD
                                   + rb"[ \t]+)?(\d+)[ \t]+(\d+)\r\n")
nats.protocol.parser.MSG_RE = _PROTOCOL_MSG
nats.protocol.parser.HMSG_RE = _PROTOCOL_HMSG


def stream_of(state: str) -> str:
    """The JetStream stream that holds a state's bucket: `KV_<bucket>`."""
    return f"KV_{bucket(state)}"


def subject_of(state: str, key: str) -> str:
    """The subject of a key of a state's bucket, `$KV.<bucket>.<key>` (`>`: every key)."""
    return f"$KV.{bucket(state)}.{key}"


class Link:
    """What the bus layer keeps beside one NATS client: how many requests went out, and who hears it reconnect or
    close."""

    def __init__(self, nc: Client) -> None:
        """Start counting the client's requests (every JetStream call is one), read a subject that is not UTF-8, and
        keep no listener yet."""
        self.requests = 0
        self.reconnects = 0
        self._listeners: list[Callable[[], None]] = []
        self._closed_listeners: list[Callable[[], None]] = []
        self._disconnected_listeners: list[Callable[[], None]] = []
        self._nc = weakref.ref(nc)
        self._reviving: set[asyncio.Task[None]] = set()
        request = nc.request

        async def counted(*args: Any, **kwargs: Any) -> Msg:
            self.requests += 1
            return await request(*args, **kwargs)

        nc.request = counted  # type: ignore[method-assign]
        build = nc._build_message

        def readable(sid: int, subject: bytes, reply: bytes, data: bytes, headers: dict[str, str] | None) -> Any:
            try:
                return build(sid, subject, reply, data, headers)
            except UnicodeDecodeError:
                # The server takes a subject that is not UTF-8 (a key another module wrote as raw bytes); nats-py's
                # read loop would end on it for good, with the client still counted connected. Read with its bad
                # bytes replaced, the key is no token and is named as bad input where it is read (section 7).
                log.warning("a message on subject %r is not UTF-8: read with its bad bytes replaced", subject[:300])
                return build(sid, _replaced(subject), _replaced(reply), data, headers)

        nc._build_message = readable  # type: ignore[method-assign]

    def on_reconnected(self, listener: Callable[[], None]) -> None:
        """Call `listener` on the loop after each reconnect; it must not block (it may start a task)."""
        self._listeners.append(listener)

    def on_closed(self, listener: Callable[[], None]) -> None:
        """Call `listener` on the loop once the client is closed for good; it must not block (it may start a thread)."""
        self._closed_listeners.append(listener)

    def on_disconnected(self, listener: Callable[[], None]) -> None:
        """Call `listener` on the loop each time the client loses its server; it must not block."""
        self._disconnected_listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling a listener (of reconnects, disconnects or the close); one never added is ignored."""
        for listeners in (self._listeners, self._closed_listeners, self._disconnected_listeners):
            if listener in listeners:
                listeners.remove(listener)

    def watch_reader(self) -> None:
        """Make a new connection should the client's current read loop end while the client counts itself connected.

        Runs on the loop, after each connect and reconnect (`reconnected` does it).
        """
        nc = self._nc()
        reader = nc._reading_task if nc is not None else None
        if reader is not None:
            reader.remove_done_callback(self._reader_ended)
            reader.add_done_callback(self._reader_ended)

    def _reader_ended(self, reader: asyncio.Task[None]) -> None:
        # nats-py's read loop ends on a reconnect or a close, the client then no longer connected. One that ends while
        # the client counts itself connected met an error nats-py did not foresee (such as "read() called while
        # another coroutine is already waiting"): nats-py logs it and stops reading, and its client neither reads nor
        # reconnects again. A new connection is made instead; the watches resynchronise after it as after any.
        nc = self._nc()
        if nc is None or reader is not nc._reading_task or not nc.is_connected:
            return
        log.warning("the NATS client stopped reading while connected (nats-py logged why); making a new connection")
        task = asyncio.get_running_loop().create_task(nc.force_reconnect())
        self._reviving.add(task)
        task.add_done_callback(self._reviving.discard)

    async def reconnected(self) -> None:
        """Tell every listener the client is connected again; a listener that raises is logged and skipped."""
        self.reconnects += 1
        self.watch_reader()
        _tell(self._listeners, "a reconnect listener failed")

    async def disconnected(self) -> None:
        """Fail the requests waiting for an answer, then tell every listener the client lost its server; a listener
        that raises is logged and skipped."""
        self._fail_requests()
        _tell(self._disconnected_listeners, "a disconnect listener failed")

    def _fail_requests(self) -> None:
        # An answer to a request sent before the server was lost never comes, and nats-py waits for it until the
        # request's timeout all the same: a watch dropped during a reconnect waited that long to delete its consumer,
        # and the cache's resync behind it. nats-py keeps each waiting request's future by its token (`_resp_map`);
        # each fails now with the timeout it would have met later (nats-py's `request` raises its own TimeoutError
        # for it either way), so every caller handles it as it handles one.
        nc = self._nc()
        waiting = getattr(nc, "_resp_map", None)
        if not isinstance(waiting, dict):
            return
        for future in list(waiting.values()):
            if isinstance(future, asyncio.Future) and not future.done():
                future.set_exception(nats.errors.TimeoutError())

    async def closed(self) -> None:
        """Tell every listener the client is closed for good; a listener that raises is logged and skipped."""
        _tell(self._closed_listeners, "a close listener failed")


def _tell(listeners: list[Callable[[], None]], failed: str) -> None:
    """Call each listener; one that raises is logged with `failed` and skipped."""
    for listener in list(listeners):
        try:
            listener()
        except Exception:
            log.exception("%s", failed)


def _replaced(raw: bytes) -> bytes:
    """UTF-8 bytes of what `raw` says, each byte that is not UTF-8 made U+FFFD."""
    return raw.decode("utf-8", "replace").encode()


def closed_for_good(nc: Client) -> str:
    """Why a client will not connect again ("" while it may): it is closed, by nats-py (on a server's error it takes
    as final, such as a control line too long) or by whoever holds it."""
    if not nc.is_closed:
        return ""
    err = nc.last_error
    return "the NATS connection is closed for good" + (f" ({type(err).__name__}: {err})" if err else "")


_links: weakref.WeakKeyDictionary[Client, Link] = weakref.WeakKeyDictionary()


def link(nc: Client) -> Link:
    """The Link of a client, made (and its requests counted from then on) on first use."""
    found = _links.get(nc)
    if found is None:
        found = _links[nc] = Link(nc)
    return found


Callback = Callable[[], Awaitable[None]]


async def connect(servers: list[str], **options: Any) -> Client:
    """A client connected to `servers` that reconnects forever, logs its disconnects and tells its Link.

    `options` go to nats-py's `Client.connect`; callbacks given there are called after this module's own.
    """
    nc = Client()
    await _connect(nc, servers, options)
    return nc


async def _connect(nc: Client, servers: list[str], options: dict[str, Any]) -> None:
    """Connect `nc` as `connect` says."""
    tie = link(nc)
    theirs_disconnected: Callback | None = options.pop("disconnected_cb", None)
    theirs_reconnected: Callback | None = options.pop("reconnected_cb", None)
    theirs_closed: Callback | None = options.pop("closed_cb", None)
    theirs_error: Callable[[Exception], Awaitable[None]] | None = options.pop("error_cb", None)
    where = ", ".join(servers)
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
            log.info("the NATS connection is closed")
        await tie.closed()
        if theirs_closed is not None:
            await theirs_closed()

    async def error(err: Exception) -> None:
        # Every error nats-py reports is one the operator may have to act on (a server out of reach, credentials
        # refused, a permission missing): a warning that says what to do, once while it stays the same.
        said.warn(explain(err, where))
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
    made[0] = True
    tie.watch_reader()
    log.info("connected to NATS at %s", nc.connected_url.netloc if nc.connected_url else servers)


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
    nc = Client()
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


async def connect_config(config: Config, *, name: str = "mesh-provisioner") -> Client:
    """A connection to the servers of a config, with its credentials, under a client name."""
    return await connect(config.servers(), name=name, **connect_options(config))


async def open_bus(config: Config, within: float, said: Callable[[str], None] | None = None) -> Client:
    """A connection to the servers of a config (`connect_within`) that JetStream serves; NotConnected says why not."""
    nc = await connect_within(config.servers(), connect_options(config), within, said)
    why = await jetstream_problem(nc, min(config.request_timeout, 5.0))
    if why:
        await nc.close()
        raise NotConnected(why)
    return nc
