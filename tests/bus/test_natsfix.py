"""Each defect of nats-py that `natsfix.py` works around, shown on the nats-py installed, and the work-around.

A test named `test_nats_py_...` shows the defect on a plain nats-py client (or its parser). Once nats-py no longer
has it, that test fails and its message says which work-around can go. Its twin shows the seat's own client
(`FixedClient`) does not have it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import nats
import nats.errors
import nats.protocol.parser
import pytest
from helpers import NatsServer, wait_until
from nats.aio.client import Client
from nats.aio.msg import Msg

from mesh_provisioner.bus.connection import connect
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.natsfix import FixedClient, unsubscribe_js

GONE = "nats-py no longer has this defect: the work-around {} of mesh_provisioner/bus/natsfix.py can go"


class _Conn:
    """What nats-py's parser calls on its client: here, only the messages are kept."""

    def __init__(self) -> None:
        self.subjects: list[bytes] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
        self.subjects.append(bytes(subject))


LINES = {
    "MSG": b"MSG x.a\x0bb 1 5\r\nhello\r\n",
    "MSG with a reply": b"MSG x.a\x0cb 1 _INBOX.r 5\r\nhello\r\n",
    "HMSG": b"HMSG x.a\x0bb 1 12 17\r\nNATS/1.0\r\n\r\nhello\r\n",
    "4 KB behind": b"MSG x.a\x0bb 1 _INBOX.r 5000\r\n" + b"y" * 5000 + b"\r\n",
}


def _parse(parser: nats.protocol.parser.Parser, data: bytes) -> str:
    """Feed the parser; answers the error it raised ("" when none)."""
    try:
        asyncio.run(parser.parse(data))
    except Exception as err:
        return type(err).__name__
    return ""


@pytest.mark.parametrize("line", list(LINES.values()), ids=list(LINES))
def test_nats_py_parser_cannot_read_a_subject_with_a_vertical_tab_or_a_form_feed(line: bytes) -> None:
    conn = _Conn()
    error = _parse(nats.protocol.parser.Parser(conn), line)
    # It raised (the client then reconnects, and the key comes again), or it waits for bytes that never come.
    assert conn.subjects != [line.split(b" ")[1]], GONE.format("1 (_ProtocolParser)")
    assert error or not conn.subjects


@pytest.mark.parametrize("line", list(LINES.values()), ids=list(LINES))
def test_the_seats_parser_reads_a_subject_up_to_a_space_or_a_tab(line: bytes) -> None:
    async def parsed() -> list[bytes]:
        nc = FixedClient()
        conn = _Conn()
        nc._ps.nc = conn  # type: ignore[assignment]
        await nc._ps.parse(line)
        return conn.subjects

    assert asyncio.run(parsed()) == [line.split(b" ")[1]]


def test_nats_py_cannot_build_a_message_on_a_subject_that_is_not_utf8() -> None:
    async def built() -> str:
        try:
            Client()._build_message(1, b"x.a\xff\xfeb", b"", b"hi", None)
        except UnicodeDecodeError:
            return "raised"
        return "built"

    assert asyncio.run(built()) == "raised", GONE.format("2 (FixedClient._build_message)")


def test_the_seats_client_builds_it_with_the_bad_bytes_replaced() -> None:
    async def built() -> Msg:
        msg: Msg = FixedClient()._build_message(1, b"x.a\xff\xfeb", b"r.\xff", b"hi", None)
        return msg

    msg = asyncio.run(built())
    assert (msg.subject, msg.reply, msg.data) == ("x.a\ufffd\ufffdb", "r.\ufffd", b"hi")


@pytest.fixture
def plain(loop: EventLoopThread, nats_server: NatsServer) -> Iterator[Client]:
    """A client as nats-py makes it, reconnecting quickly."""
    client = loop.run(nats.connect(nats_server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1), 10)
    yield client
    loop.run(client.close(), 10)


def _break_parser_once(nc: Client) -> None:
    """Make the client's parser raise what nats-py does not foresee, once."""
    parse = nc._ps.parse

    async def fails_once(data: bytes = b"") -> None:
        nc._ps.parse = parse  # type: ignore[method-assign]
        raise RuntimeError("read() called while another coroutine is already waiting for incoming data")

    nc._ps.parse = fails_once  # type: ignore[method-assign]


def test_nats_py_stops_reading_on_an_unforeseen_error_and_counts_itself_connected(
    loop: EventLoopThread, plain: Client, other: Client
) -> None:
    _break_parser_once(plain)
    loop.run(other.publish("x.any", b"any"), 5)
    reader = plain._reading_task
    assert reader is not None
    wait_until(reader.done, what="nats-py's read loop ended")
    assert not (plain.is_connected and plain._reading_task is not reader), GONE.format("3 (FixedClient._read_loop)")
    assert plain.is_connected and plain.stats["reconnects"] == 0


def test_nats_py_waits_for_an_answer_from_a_lost_server_until_the_requests_timeout(
    loop: EventLoopThread, plain: Client, nats_server: NatsServer
) -> None:
    nats_server.pause()  # the request goes out, and a frozen server does not answer it
    began = time.monotonic()
    future = loop.submit(plain.request("$JS.API.INFO", b"", timeout=3))
    wait_until(lambda: plain._resp_map, what="the request waits for its answer")
    nats_server.kill()
    wait_until(lambda: plain.is_reconnecting, what="the client lost its server")
    with pytest.raises(nats.errors.TimeoutError):
        future.result(30)
    assert time.monotonic() - began >= 2.5, GONE.format("4 (FixedClient.connect's disconnect callback)")


def _subscribed_and_lost(loop: EventLoopThread, nc: Client, nats_server: NatsServer) -> asyncio.Task[None]:
    """A subscription on `nc`, its server killed and data pending for it; answers the subscription's task."""

    async def ignore(msg: Msg) -> None:
        pass

    sub = loop.run(nc.subscribe("x.>", cb=ignore), 5)
    loop.run(nc.flush(), 5)
    nats_server.kill()
    wait_until(lambda: nc.is_reconnecting, what="the client lost its server")
    loop.run(nc.publish("x.pending", b"p" * 100), 5)
    task = sub._wait_for_msgs_task
    assert task is not None
    return task


def test_nats_py_close_raises_with_data_pending_for_a_lost_server_and_leaves_its_subscriptions_running(
    loop: EventLoopThread, plain: Client, nats_server: NatsServer
) -> None:
    task = _subscribed_and_lost(loop, plain, nats_server)
    with pytest.raises(ConnectionResetError):
        loop.run(plain.close(), 10)
    # Given every chance to end, it does not.
    loop.run(asyncio.sleep(0), 5)
    assert not task.done(), GONE.format("5 (FixedClient.close)")
    task.cancel()


def test_the_seats_client_closes_with_data_pending_for_a_lost_server_and_leaves_no_task(
    loop: EventLoopThread, nats_server: NatsServer
) -> None:
    nc = loop.run(connect([nats_server.url], reconnect_time_wait=0.2), 10)
    task = _subscribed_and_lost(loop, nc, nats_server)
    loop.run(nc.close(), 10)
    assert nc.is_closed
    wait_until(task.done, what="the subscription's task ended")

    async def others() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    wait_until(lambda: not loop.run(others(), 5), what="no task of the client left on the loop")


def _watch_then_close(loop: EventLoopThread, nc: Client) -> Any:
    """A key-value watch on `nc`, then `nc` closed under it; answers the watch."""

    async def watching() -> Any:
        kv = await nc.jetstream().create_key_value(bucket="watched")
        return await kv.watchall()

    watcher = loop.run(watching(), 10)
    loop.run(nc.close(), 10)
    return watcher


def _heartbeat(watcher: Any) -> asyncio.Task[None]:
    task: asyncio.Task[None] = watcher._sub._sub._jsi._hbtask
    return task


def test_nats_py_stopping_a_watch_on_a_closed_client_leaves_its_heartbeat_check_running(
    loop: EventLoopThread, plain: Client
) -> None:
    watcher = _watch_then_close(loop, plain)
    with pytest.raises(nats.errors.ConnectionClosedError):
        loop.run(watcher.stop(), 5)
    loop.run(asyncio.sleep(0), 5)
    assert not _heartbeat(watcher).done(), GONE.format("6 (unsubscribe_js)")
    _heartbeat(watcher).cancel()


def test_unsubscribe_js_on_a_closed_client_ends_its_heartbeat_check(loop: EventLoopThread, plain: Client) -> None:
    watcher = _watch_then_close(loop, plain)
    with pytest.raises(nats.errors.ConnectionClosedError):
        loop.run(unsubscribe_js(watcher._sub), 5)
    wait_until(_heartbeat(watcher).done, what="the heartbeat check ended")


def test_a_read_loop_cancelled_while_connected_makes_no_new_connection(
    loop: EventLoopThread, nats_server: NatsServer
) -> None:
    # Only a reader that ended on its own error is replaced: one cancelled (a loop shutting down, say) is not.
    nc = loop.run(connect([nats_server.url], reconnect_time_wait=0.2), 10)
    try:
        reader = nc._reading_task
        assert reader is not None
        loop.loop.call_soon_threadsafe(reader.cancel)
        wait_until(reader.done, what="the read loop ended")
        assert nc.is_connected and not nc.is_reconnecting and nc.stats["reconnects"] == 0
    finally:
        loop.run(nc.close(), 10)


async def _flush_given_up(nc: Client) -> None:
    """A flush given up before its PONG came: its ping sent with a future cancelled at once, as a cancelled or timed
    out `flush` leaves it."""
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    future.cancel()
    await nc._send_ping(future)


def test_nats_py_ends_its_read_loop_on_the_pong_of_a_flush_given_up(loop: EventLoopThread, plain: Client) -> None:
    reader = plain._reading_task
    assert reader is not None
    loop.run(_flush_given_up(plain), 5)
    wait_until(lambda: reader.done() or plain._pongs_received > 0, what="the PONG came")
    assert reader.done(), GONE.format("7 (FixedClient._process_pong)")


def test_the_seats_client_takes_the_pong_of_a_flush_given_up_and_reads_on(
    loop: EventLoopThread, nats_server: NatsServer
) -> None:
    nc = loop.run(connect([nats_server.url], reconnect_time_wait=0.2), 10)
    try:
        reader = nc._reading_task
        loop.run(_flush_given_up(nc), 5)
        wait_until(lambda: nc._pongs_received > 0, what="the PONG came")
        loop.run(nc.flush(5), 10)  # the next flush has its own PONG
        assert nc._reading_task is reader and not reader.done() and nc.stats["reconnects"] == 0
    finally:
        loop.run(nc.close(), 10)
