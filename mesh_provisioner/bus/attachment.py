"""How one seat is attached to NATS: its client and the loop that runs it, each its own or a host's.

pykka actors are threads and nats-py is asyncio (design.md): one loop runs every coroutine of the bus. A seat
either makes both (a client of its own, on a loop of its own on the daemon thread `mesh-provisioner-bus`), or runs
on a host's loop with a client of its own, or on a host's client and the loop that runs it. `Attachment.open`
makes or takes them; `Attachment.close` undoes exactly what the seat made, whatever state the bus is in:

- its own client is closed (its subscriptions go with it), its own loop stopped and its thread ended;
- a host's client is left as the host made it and still connected: whatever the seat subscribed on it is
  unsubscribed, the store's inbox of acknowledgements too, and nothing of the seat's stays on the host's loop;
- a host's loop is left running.

A host's client is followed for its reconnects, disconnects and close by its public state (`connection.follow`):
a host closing its connection stops the seat, with no call the host must know about. A host's client is driven
only from the loop that runs it, so `nc=` comes with `loop=` or is refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from mesh_provisioner.bus.connection import connect_config
from mesh_provisioner.bus.link import Link, SeatClient, borrow, give_back
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.config import Config

log = logging.getLogger("mesh_provisioner.bus.attachment")


class Attachment:
    """A seat's client and loop, and whether each is its own (see the module)."""

    def __init__(self, nc: Client, loop: EventLoopThread, link: Link, *, owns_nc: bool) -> None:
        """Use `open`: this only keeps what it is given."""
        self.nc = nc
        self.loop = loop
        self.link = link
        self.owns_nc = owns_nc
        self._closed = False

    @classmethod
    def open(
        cls, config: Config, *, nc: Client | None = None, loop: asyncio.AbstractEventLoop | None = None
    ) -> Attachment:
        """Attach a seat: connect a client of its own to `config`'s servers unless `nc` is given, on a loop of its
        own unless `loop` is.

        `nc` without `loop` raises ValueError at once: a host's client runs on the host's loop. A `loop` that does
        not run, or that is the calling thread's own, raises ValueError too (the seat waits on the loop from other
        threads). A connection that cannot be made within three request timeouts raises TimeoutError, with nothing
        left running: no thread, no client, no task.
        """
        if nc is not None and loop is None:
            raise ValueError(
                "nc= was given without loop=: a host's NATS client must be driven from the event loop that runs it, "
                "so give that loop too (start(config, nc=host_nc, loop=host_loop)), or give neither and the seat "
                "connects on a loop of its own"
            )
        if loop is not None:
            _check_loop(loop)
        thread = EventLoopThread.adopt(loop) if loop is not None else EventLoopThread()
        try:
            if nc is None:
                own = SeatClient()
                try:
                    thread.run(connect_config(config, own), config.request_timeout * 3)
                except BaseException:
                    # A connect cut short leaves nats-py's tasks of it on the loop: closed, it leaves none.
                    with contextlib.suppress(Exception):
                        thread.run(own.close(), config.request_timeout)
                    raise
                return cls(own, thread, own.link, owns_nc=True)
            if nc.is_closed:
                raise ValueError("the NATS client given is closed: the seat cannot run on it")
            return cls(nc, thread, thread.run(borrow(nc), config.request_timeout), owns_nc=False)
        except BaseException:
            thread.stop()
            raise

    @property
    def owns_loop(self) -> bool:
        """Whether the loop is the seat's own (stopped by `close`), not a host's."""
        return self.loop.owned

    def close(self, timeout: float, subscriptions: Iterable[Subscription] = ()) -> None:
        """Detach the seat (see the module), each step within `timeout` seconds; never raises, whatever the bus.

        `subscriptions` are what the seat subscribed on a host's client itself (its own client's go with it).
        Called again, it does nothing.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self.owns_nc:
                self.loop.run(self.nc.close(), timeout)
            else:
                self.loop.run(self._give_back(list(subscriptions)), timeout)
        except Exception as err:  # the bus may be gone already: what the seat holds is let go all the same
            log.debug("the bus did not detach cleanly: %s", err)
        finally:
            self.loop.stop(timeout)

    async def _give_back(self, subscriptions: list[Subscription]) -> None:
        """Unsubscribe the seat's subscriptions on a host's client, then give the client back (`give_back`)."""
        for sub in subscriptions:
            if self.nc.is_closed:
                break  # closed, nats-py has dropped every subscription itself
            with contextlib.suppress(nats.errors.Error):  # one unsubscribed already, say
                await sub.unsubscribe()
        await give_back(self.nc)


def _check_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Refuse a loop the seat cannot run its bus on, saying why."""
    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(f"loop= must be an asyncio event loop, not {type(loop).__name__}")
    if loop.is_closed() or not loop.is_running():
        raise ValueError("the event loop given does not run: the seat runs its bus on a loop that a thread runs")
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    if current is loop:
        raise ValueError(
            "the seat is started on the thread of the loop given: it waits for that loop from other threads, so "
            "start it from another thread (asyncio.to_thread, say)"
        )
