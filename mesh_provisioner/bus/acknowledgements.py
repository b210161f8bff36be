"""Publishing JetStream messages on one connection and gathering their acknowledgements on one inbox of its own.

The store's batches go out this way (store.py): a batch is published whole, then its answers are waited for once,
with at most `IN_FLIGHT` messages of a connection waiting for theirs at once. The inbox is made at first use and kept
by the connection's Link, so that stores made again and again on a connection subscribe once, and a host's
connection given back is unsubscribed.

A message whose answer has not come `RESEND_AFTER` s after it went out is sent again, as long as the sender allows
it: on a cluster, a stream's leader that dies with a message in flight never answers, and the new leader (elected in
a few seconds) answers the message sent again. Waiting the whole timeout for the first answer held such a write for
ten seconds.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Final

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from mesh_provisioner.bus.link import Link, link

IN_FLIGHT: Final = 1024  # messages of a connection waiting for their acknowledgement at once, at most
# How long an answer is waited for before its message is sent again: far past a server's answer under load (a few
# milliseconds; tens while a seat's loop is busy), within a cluster's leader election.
RESEND_AFTER: Final = 1.0


class _Room:
    """A count of free places that publishers wait for, first come first served.

    As asyncio.Semaphore, but a release wakes its waiter in constant time: the Semaphore looks past every waiter
    already woken and not yet run, and with a thousand publishers waiting that made each acknowledgement cost
    a scan of them.
    """

    def __init__(self, places: int) -> None:
        self._free = places
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def take(self) -> None:
        """Take a place, waiting for one while none is free (or others wait for one already)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # given a place by `give`
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # the place it was given goes to the next
            raise

    def give(self, *_: object) -> None:
        """Give a place back: to the first waiter still waiting, or to the free count."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class _Acks:
    """Publishes JetStream messages on one connection and gathers their acknowledgements on one inbox of its own.

    As nats-py's request, without a future waited for with a timer of its own per message: a batch is published
    whole, then waited for once.
    """

    def __init__(self, nc: Client, tie: Link, in_flight: int = IN_FLIGHT) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._next = 0
        self._subscribing = asyncio.Lock()
        # At most this many messages wait for their answer at once: a thousand compositions writing together must
        # not flood the connection (the server drops a client that reads its answers too slowly).
        self._room = _Room(in_flight)
        self._link = tie
        tie.on_disconnected(self._lost)

    async def _inbox(self) -> str:
        if self._sub is None:
            async with self._subscribing:
                if self._sub is None:
                    prefix = self._nc.new_inbox()
                    self._sub = await self._nc.subscribe(prefix + ".*", cb=self._answer)
                    self._prefix = prefix + "."
        return self._prefix

    def _lost(self) -> None:
        """The server is lost: an answer to a message sent before never comes, and is not waited for.

        Whoever waits is told at once, not after the batch's timeout (a server restarted mid-batch made every
        composition writing then wait that long). A message nats-py still held, sent once it reconnects, may land all
        the same: its write is said to have failed, is made again later and finds its key moved on, as any write
        that did not land is (compare-and-set: nothing is written blind).
        """
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the connection to NATS was lost before the answer came"))

    async def close(self) -> None:
        """Unsubscribe the inbox (a host's connection given back keeps nothing of the seat's), and tell whoever
        waits that no answer comes."""
        self._link.remove_listener(self._lost)
        sub, self._sub = self._sub, None
        self._lost()
        if sub is not None and not self._nc.is_closed:
            await sub.unsubscribe()

    async def _answer(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[len(self._prefix):], None)
        if future is not None and not future.done():
            future.set_result(msg)

    async def publish(
        self,
        messages: list[tuple[str, bytes, dict[str, str]]],
        timeout: float,
        *,
        resend: Callable[[int], bool] | None = None,
    ) -> tuple[list[Msg | BaseException], set[int]]:
        """Publish every message, then wait `timeout` s at most for all answers: each answer, or why there is none,
        and the indexes of the messages sent more than once.

        A message still unanswered `RESEND_AFTER` s after it went out is sent again (and again, each `RESEND_AFTER`)
        while `resend(index)` says so; its first answer, to either sending, is its answer.
        """
        prefix = await self._inbox()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Msg]] = []
        tokens: list[str] = []
        resent: set[int] = set()
        failed: BaseException | None = None
        try:
            for subject, payload, headers in messages:
                await self._room.take()
                future: asyncio.Future[Msg] = loop.create_future()
                future.add_done_callback(self._room.give)
                futures.append(future)
                failed = await self._send(prefix, subject, payload, headers, future, tokens)
                if failed is not None:
                    futures.pop().cancel()  # not published: neither this one nor those after it went out
                    break
            deadline = loop.time() + timeout
            while futures and (left := deadline - loop.time()) > 0:
                wait = left if resend is None else min(left, RESEND_AFTER)
                _, pending = await asyncio.wait(futures, timeout=wait)
                if not pending or wait >= left:
                    break
                again = [i for i, f in enumerate(futures) if not f.done() and resend is not None and resend(i)]
                for i in again:
                    if await self._send(prefix, *messages[i], futures[i], tokens) is None:
                        resent.add(i)
        finally:
            for token in tokens:
                self._waiting.pop(token, None)
            for future in futures:
                if not future.done():
                    future.cancel()  # gives its room back
        out = [_result(f) for f in futures]
        return out + [failed or TimeoutError("nats: not published")] * (len(messages) - len(out)), resent

    async def _send(self, prefix: str, subject: str, payload: bytes, headers: dict[str, str],
                    future: asyncio.Future[Msg], tokens: list[str]) -> BaseException | None:
        """Publish one message whose answer settles `future`; answers why it was not published (None when it was)."""
        self._next += 1
        token = str(self._next)
        self._waiting[token] = future
        try:
            await self._nc.publish(subject, payload, reply=prefix + token, headers=headers)
        except (nats.errors.Error, OSError) as err:
            self._waiting.pop(token, None)
            return err
        tokens.append(token)
        return None


def acks_of(nc: Client) -> _Acks:
    """The one inbox of a connection for its stores' acknowledgements, made at first use (as nats-py's own for
    its requests) and kept by its Link: stores made again and again on a connection subscribe no more than once,
    and a host's connection given back is unsubscribed (`connection.give_back`)."""
    tie = link(nc)
    return tie.kept("acks", lambda: _Acks(nc, tie))


def _result(future: asyncio.Future[Msg]) -> Msg | BaseException:
    if not future.done():
        future.cancel()
        return TimeoutError("nats: timeout")
    if future.cancelled():
        return TimeoutError("nats: timeout")
    exc = future.exception()
    return exc if exc is not None else future.result()
