"""Every work-around for a defect of nats-py, in one place, on the seat's own clients only.

`FixedClient` is nats-py's `Client` with the work-arounds below; the seat makes its own connections of it
(`connection.connect`). Nothing here changes nats-py itself or a client a host passes in: a host's client stays as
nats-py made it, defects and all. Each defect has a test (tests/bus/test_natsfix.py) that shows it on the nats-py
installed, and fails, saying which work-around can go, once nats-py no longer has it.

The work-arounds reach into nats-py's private attributes where no public API does the same; they do so here only.

1. Subjects with a vertical tab or a form feed (`_ProtocolParser`). nats-py parses a message's control line with
   `\\s` between its fields, but the protocol's delimiters are space and tab only: the server takes a subject with
   a vertical tab or a form feed in it (a key another module wrote, contract section 7), and nats-py then cannot
   parse the line that delivers it. It reconnects, or, with 4 KB or more behind the line, waits for bytes that
   never make it parse; each reconnect's watch delivers the key again, and a reconnect retried while the parser is
   stuck leaves two coroutines reading one stream. The client's parser reads the control line with the
   protocol's delimiters instead.
2. Subjects that are not UTF-8 (`_build_message`). The server takes them; nats-py's read loop ends on decoding one,
   with the client still counted connected. The subject is read with its bad bytes replaced.
3. A read loop that ends while connected (`_read_loop`). On an error nats-py did not foresee (such as "read()
   called while another coroutine is already waiting") it logs and stops reading, and its client neither reads
   nor reconnects again. A new connection is made instead (nats-py's open pull request 914 proposes the same).
4. Requests waiting past a lost server (`connect`'s disconnect callback). The answer to a request sent before the
   server was lost never comes, and nats-py waits for it until the request's timeout all the same. Each waiting
   request fails at the disconnect with the timeout it would have met later.
5. A close that raises before it cancels the subscriptions (`close`). With data pending for a server that is
   gone, nats-py's close raises ConnectionResetError before it cancels its subscriptions' tasks: they stay on the
   loop for good (a host's loop, when the seat runs on one). They are cancelled here.
6. A JetStream subscription stopped on a closed client (`unsubscribe_js`). nats-py's unsubscribe raises before it
   cancels the subscription's heartbeat and flow-control tasks, which then outlive the watch.
7. The PONG of a flush that is no longer waited for (`_process_pong`). A flush timed out or cancelled (a request
   given up, a signal) leaves its ping's future, cancelled, first in line; nats-py sets the result of the next PONG
   on it, which raises, and its read loop ends: a new connection (3), its watches made again. That PONG is taken
   as the answer to the flush nobody waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import types
from collections.abc import Awaitable, Callable
from typing import Any, Final

import nats.errors
import nats.protocol.parser
from nats.aio.client import Client
from nats.js import JetStreamContext

log = logging.getLogger("mesh_provisioner.bus.natsfix")

# 1. nats-py's patterns of MSG and HMSG control lines, with the protocol's delimiters (space and tab) in place of
# `\s`.
_FIELD: Final = rb"([^ \t\r\n]+)"
PROTOCOL_MSG: Final = re.compile(rb"\AMSG[ \t]+" + _FIELD + rb"[ \t]+" + _FIELD + rb"[ \t]+(" + _FIELD
                                 + rb"[ \t]+)?(\d+)\r\n")
PROTOCOL_HMSG: Final = re.compile(rb"\AHMSG[ \t]+" + _FIELD + rb"[ \t]+" + _FIELD + rb"[ \t]+(" + _FIELD
                                  + rb"[ \t]+)?(\d+)[ \t]+(\d+)\r\n")


def _parse_with_protocol_delimiters() -> Any:
    """nats-py's own `Parser.parse`, reading MSG and HMSG lines with the protocol's patterns.

    The patterns are globals of nats-py's parser module, read by `parse` at each line. Rather than rebind them for
    every client of the process, this is the same function over a copy of that module's globals with the two
    patterns replaced: the parser's code stays nats-py's, whatever its version.
    """
    parse = nats.protocol.parser.Parser.parse
    namespace = {**vars(nats.protocol.parser), "MSG_RE": PROTOCOL_MSG, "HMSG_RE": PROTOCOL_HMSG}
    fixed = types.FunctionType(parse.__code__, namespace, parse.__name__, parse.__defaults__, parse.__closure__)
    fixed.__kwdefaults__ = parse.__kwdefaults__
    fixed.__qualname__ = parse.__qualname__
    return fixed


class _ProtocolParser(nats.protocol.parser.Parser):
    """nats-py's parser of the wire protocol, reading a subject up to a space or a tab only (1)."""

    parse = _parse_with_protocol_delimiters()


def _replaced(raw: bytes) -> bytes:
    """UTF-8 bytes of what `raw` says, each byte that is not UTF-8 made U+FFFD."""
    return raw.decode("utf-8", "replace").encode()


class FixedClient(Client):
    """nats-py's client with this module's work-arounds: the seat's own connections are of this class."""

    def __init__(self) -> None:
        super().__init__()
        self._ps = _ProtocolParser(self)  # 1: nats-py makes its parser once, here; no public way to give one

    def _build_message(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: dict[str, str] | None
    ) -> Any:
        try:
            return super()._build_message(sid, subject, reply, data, headers)
        except UnicodeDecodeError:
            # 2: read with its bad bytes replaced, the key is no token and is named as bad input where it is read.
            log.warning("a message on subject %r is not UTF-8: read with its bad bytes replaced", subject[:300])
            return super()._build_message(sid, _replaced(subject), _replaced(reply), data, headers)

    async def _read_loop(self) -> None:
        await super()._read_loop()
        # nats-py's read loop ends on a reconnect or a close, the client then no longer connected. One that ends
        # while the client counts itself connected met an error nats-py did not foresee (3), unless it was
        # cancelled or is not the client's reader any more (one replaced by a reconnect, ending late).
        me = asyncio.current_task()
        if self.is_connected and me is self._reading_task and not (me is not None and me.cancelling()):
            log.warning("the NATS client stopped reading while connected (nats-py logged why); making a new "
                        "connection")
            await self.force_reconnect()

    async def _process_pong(self) -> None:
        if self._pongs and self._pongs[0].done():  # 7: its flush timed out or was cancelled
            self._pongs.pop(0)
            self._pongs_received += 1
            self._pings_outstanding = 0
            return
        await super()._process_pong()

    async def connect(self, *args: Any, **options: Any) -> None:
        """nats-py's `connect`; the disconnect callback given (if any) is called after failing the requests that
        wait for an answer (4)."""
        theirs: Callable[[], Awaitable[None]] | None = options.pop("disconnected_cb", None)

        async def disconnected() -> None:
            self.fail_waiting_requests()
            if theirs is not None:
                await theirs()

        options["disconnected_cb"] = disconnected
        await super().connect(*args, **options)

    def fail_waiting_requests(self) -> None:
        """Fail every request still waiting for its answer with nats-py's own timeout error (4).

        nats-py keeps each waiting request's future by its token; each fails now with the error it would have met
        at its timeout, so every caller handles it as it handles a timeout.
        """
        for future in list(self._resp_map.values()):
            if not future.done():
                future.set_exception(nats.errors.TimeoutError())

    async def close(self) -> None:
        """nats-py's `close`; should it raise, the subscriptions' tasks it left are cancelled (5) and the error is
        logged, not raised: the client is closed either way."""
        try:
            await super().close()
        except Exception as err:
            log.info("closing the NATS connection: %s: %s", type(err).__name__, err)
            self._end_subscriptions()

    def _end_subscriptions(self) -> None:
        """What nats-py's close does after the step that raised: every subscription's task cancelled, and its
        waiters told, and the transport closed."""
        for sub in list(self._subs.values()):
            _end_js(sub)
            with contextlib.suppress(Exception):
                sub._stop_processing()
            for future in list((getattr(sub, "_pending_next_msgs_calls", None) or {}).values()):
                future.cancel()
        self._subs.clear()
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.close()  # type: ignore[no-untyped-call]


def _end_js(sub: Any) -> None:
    """Cancel a JetStream subscription's heartbeat and flow-control tasks (6), where it has them."""
    jsi = getattr(sub, "_jsi", None)
    for name in ("_hbtask", "_fctask"):
        task = getattr(jsi, name, None)
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()


def consumer_of(sub: JetStreamContext.PushSubscription) -> str | None:
    """The name of a JetStream push subscription's current consumer (an ordered consumer's changes as it is made
    again), None when it has none yet. nats-py keeps it on the subscription, with no public getter for it."""
    consumer = getattr(sub, "_consumer", None)
    return consumer if isinstance(consumer, str) else None


async def unsubscribe_js(sub: JetStreamContext.PushSubscription) -> None:
    """Unsubscribe a JetStream push subscription; on a client closed meanwhile, its heartbeat and flow-control tasks
    are cancelled too (6).

    Raises nats-py's errors as its `unsubscribe` does.
    """
    try:
        await sub.unsubscribe()
    except nats.errors.ConnectionClosedError:
        _end_js(getattr(sub, "_sub", sub))
        raise
