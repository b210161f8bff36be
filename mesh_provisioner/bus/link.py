"""What the bus layer keeps beside a NATS client (`Link`), for a client of the seat's own or a host's.

A Link counts the requests sent, tells listeners of the client's reconnects, disconnects and close, and keeps what
the bus layer made on the client once (the store's inbox of acknowledgements). A client the seat makes itself is a
`SeatClient`: nats-py's client with the work-arounds of `natsfix.py`, its Link its own, told by the callbacks
`connection.connect` gives it. A client a host passes in is left as nats-py made it: `borrow` keeps a Link for it
while a seat runs on it, told by watching the client's public state (`follow`: a host's callbacks are its own),
and `give_back` undoes whatever the bus layer made on it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from mesh_provisioner.bus.natsfix import FixedClient

log = logging.getLogger("mesh_provisioner.bus.link")

# How often a host's client is looked at for a reconnect, a disconnect or its close (`follow`).
FOLLOW_EVERY: Final = 0.1


class Kept(Protocol):
    """Something the bus layer makes once per client and undoes when it gives the client back."""

    async def close(self) -> None:
        """Undo it on the client (unsubscribe, say); the client may be closed already."""


K = TypeVar("K", bound=Kept)
T = TypeVar("T")


class Link:
    """What the bus layer keeps beside one NATS client: how many requests went out, who hears it reconnect, lose
    its server or close, and what was made on it once."""

    def __init__(self) -> None:
        """Keep no listener yet; count requests from 0 (on the seat's own clients only: see `SeatClient`)."""
        self.requests = 0
        self.reconnects = 0
        self._listeners: list[Callable[[], None]] = []
        self._closed_listeners: list[Callable[[], None]] = []
        self._disconnected_listeners: list[Callable[[], None]] = []
        self._kept: dict[str, Kept] = {}

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

    def kept(self, name: str, make: Callable[[], K]) -> K:
        """The one thing of that name made on this client, made now on first use."""
        found = self._kept.get(name)
        if found is None:
            found = self._kept[name] = make()
        return found  # type: ignore[return-value]

    async def let_go(self) -> None:
        """Undo everything kept (each on its own: one that fails is logged), and forget it."""
        kept, self._kept = self._kept, {}
        for name, thing in kept.items():
            try:
                await thing.close()
            except Exception as err:
                log.debug("undoing the %s of a connection: %s", name, err)

    async def reconnected(self) -> None:
        """Tell every listener the client is connected again; a listener that raises is logged and skipped."""
        self.reconnects += 1
        _tell(self._listeners, "a reconnect listener failed")

    async def disconnected(self) -> None:
        """Tell every listener the client lost its server; a listener that raises is logged and skipped."""
        _tell(self._disconnected_listeners, "a disconnect listener failed")

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


class SeatClient(FixedClient):
    """A client the seat made itself: nats-py's defects worked around (`natsfix.py`), its requests counted, and its
    Link told by the callbacks `connect` gives it."""

    def __init__(self) -> None:
        super().__init__()
        self.link = Link()

    async def request(self, *args: Any, **kwargs: Any) -> Msg:
        """nats-py's `request`, counted (every JetStream call is one)."""
        self.link.requests += 1
        return await super().request(*args, **kwargs)


class _Borrowed:
    """A host's client while seats run on it: its Link, how many seats hold it, and what follows its state."""

    def __init__(self, link: Link, follower: asyncio.Task[None]) -> None:
        self.link = link
        self.holders = 1
        self.follower = follower


_borrowed: weakref.WeakKeyDictionary[Client, _Borrowed] = weakref.WeakKeyDictionary()


def link(nc: Client) -> Link:
    """The Link of a client: a seat's client's own, or the one kept while a seat holds a host's client (`borrow`).

    Of a host's client no seat holds, a Link that nothing tells.
    """
    if isinstance(nc, SeatClient):
        return nc.link
    held = _borrowed.get(nc)
    return held.link if held is not None else Link()


async def unless_closed(nc: Client, work: Awaitable[T]) -> T:
    """What `work` answers, or ConnectionClosedError as soon as the client is closed for good (the work given up).

    Work nats-py began on a client that closes meanwhile may wait its whole timeout for an answer that cannot come
    (the verb's registration once waited 10 s), before a process whose connection is gone can say so and exit."""
    closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_closed() -> None:
        if not closed.done():
            closed.set_result(None)

    tie = link(nc)
    tie.on_closed(on_closed)
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    try:
        if not nc.is_closed:
            await asyncio.wait([task, closed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        tie.remove_listener(on_closed)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise nats.errors.ConnectionClosedError
    return task.result()


async def borrow(nc: Client) -> Link:
    """Hold a host's client for a seat, on the loop that runs it: its Link, told of its reconnects, disconnects
    and close by `follow` while held. A seat's own client needs none of this: its own Link is answered.

    Every `borrow` is matched by one `give_back`; seats holding one client at once share its Link.
    """
    if isinstance(nc, SeatClient):
        return nc.link
    held = _borrowed.get(nc)
    if held is not None:
        held.holders += 1
        return held.link
    tie = Link()
    follower = asyncio.get_running_loop().create_task(follow(nc, tie), name="mesh-provisioner follows a connection")
    _borrowed[nc] = _Borrowed(tie, follower)
    return tie


async def give_back(nc: Client) -> None:
    """Let go of a host's client held by `borrow`, on its loop: once no seat holds it, nothing follows it any more
    and what the bus layer made on it (the store's inbox) is undone. The client is left as the host made it."""
    held = _borrowed.get(nc)
    if held is None:
        return
    held.holders -= 1
    if held.holders > 0:
        return
    del _borrowed[nc]
    held.follower.cancel()
    await asyncio.gather(held.follower, return_exceptions=True)
    await held.link.let_go()


async def follow(nc: Client, tie: Link, every: float = FOLLOW_EVERY) -> None:
    """Tell `tie` of a client's disconnects, reconnects and close, as its public state shows them, every `every`
    seconds, until it is closed.

    A host's callbacks are its own: nothing is asked of the host, and its client is not changed.
    """
    reconnects = nc.stats["reconnects"]
    down = not nc.is_connected
    while not nc.is_closed:
        now = nc.stats["reconnects"]
        if not down and (not nc.is_connected or now != reconnects):
            down = True
            await tie.disconnected()
        if now != reconnects:
            reconnects = now
            await tie.reconnected()
        if down and nc.is_connected:
            down = False
        await asyncio.sleep(every)
    if not down:
        await tie.disconnected()
    await tie.closed()
