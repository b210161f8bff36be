"""The event-loop thread that owns the NATS connection, and the one way other threads reach it.

pykka actors are threads and nats-py is asyncio (design.md): one loop runs every coroutine of the bus, and an
actor hands it a coroutine and waits for the result, always with a timeout. The loop is either one this module
starts on a daemon thread, or one a host already runs (`EventLoopThread.adopt`), which it then neither starts
nor stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

log = logging.getLogger("mesh_provisioner.bus.loop")

T = TypeVar("T")

# The longest a wait of `EventLoopThread.run` goes without looking for a signal (`_waited`), and a stopped loop
# between two looks at the tasks it still runs.
SLICE: Final = 0.05
# A stopped loop's tasks: how long they have to end once cancelled, and how many slices in all it waits for them
# (about `EventLoopThread.stop`'s wait).
GRACE: Final = 1.0
CANCELS: Final = 100


class Abandoned(Exception):
    """A wait on the bus loop given up because what it was for ended meanwhile (`EventLoopThread.run`'s `abandon`);
    the coroutine waited for was cancelled."""


class EventLoopThread:
    """An asyncio loop on its own daemon thread (or a host's loop), that any other thread can run coroutines on."""

    _owned: bool
    _loop: asyncio.AbstractEventLoop
    _thread: threading.Thread | None

    def __init__(self, name: str = "mesh-provisioner-bus") -> None:
        """Start a new loop on a daemon thread named `name`; it is running when this returns."""
        self._owned = True
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(started,), name=name, daemon=True
        )
        try:
            self._thread.start()
            started.wait()
        except BaseException:
            # Interrupted as it started (a signal's handler raises in the package's code, cli/process.py): the loop
            # stops with it, for nothing else holds it yet.
            if self._thread.ident is not None:
                started.wait(5.0)
                self.stop()
            raise

    @classmethod
    def adopt(cls, loop: asyncio.AbstractEventLoop) -> EventLoopThread:
        """A handle on a loop a host already runs on its own thread: `stop()` leaves that loop alone."""
        self = cls.__new__(cls)
        self._owned = False
        self._loop = loop
        self._thread = None
        return self

    @property
    def owned(self) -> bool:
        """Whether this started the loop (and `stop` ends it), not a host."""
        return self._owned

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop every coroutine of the bus runs on."""
        return self._loop

    def in_loop(self) -> bool:
        """Whether the calling thread is the loop's own thread."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule a coroutine on the loop from any thread; answers its future without waiting."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(
        self, coro: Coroutine[Any, Any, T], timeout: float | None, *, abandon: Callable[[], bool] | None = None
    ) -> T:
        """Run a coroutine on the loop from another thread and wait for its result at most `timeout` seconds (None:
        until it ends; a signal's handler that raises still interrupts the wait).

        Past the timeout the coroutine is cancelled and TimeoutError is raised, naming it. `abandon` is asked every
        `SLICE` of the wait: once it answers True, the coroutine is cancelled and `Abandoned` raised (a long read
        whose result nobody waits for any more), even when the timeout passed in the same slice. Called on the loop's
        own thread this would wait for itself forever, so it raises RuntimeError instead.
        """
        if self.in_loop():
            coro.close()
            raise RuntimeError("EventLoopThread.run was called on the loop's own thread; await the coroutine instead")
        name = getattr(coro, "__qualname__", repr(coro))
        # Waited for on a bare lock, in calls of this module's own: an exception a signal's handler raises in them
        # lands nowhere else (`Future.result` waits inside `threading`'s bookkeeping; cli/process.py `Signals`).
        ended = threading.Lock()
        ended.acquire()
        future: concurrent.futures.Future[T] | None = None
        try:
            try:
                future = self.submit(coro)
            except BaseException:
                coro.close()  # a loop closed meanwhile never runs it: not left to be said never awaited
                raise
            future.add_done_callback(lambda _: ended.release())
            why = _waited(ended, timeout, abandon)
        except BaseException:
            # The wait itself was interrupted (a signal's handler raised, Ctrl-C): what it waited for stops too.
            if future is not None:
                future.cancel()
            raise
        if why and future.cancel():  # not cancelled: it ended just now
            if why == ABANDONED:
                raise Abandoned(f"{name} was abandoned on the bus loop and cancelled")
            raise TimeoutError(f"{name} did not finish within {timeout} s on the bus loop; it was cancelled")
        return future.result()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop this started: cancel its tasks, let them end, close it. An adopted loop is left running."""
        if not self._owned or self._thread is None:
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the bus loop thread did not end within %s s", timeout)
        self._thread = None

    def __enter__(self) -> EventLoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, started: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            # Whatever still runs (watches, subscriptions' tasks) is cancelled and given its chance to end, what it
            # starts on its way out (a watch's consumer deleted under a shield) too; past `GRACE`, whatever still runs
            # is cancelled again. A cancellation can be lost: Python 3.11's `asyncio.wait_for` drops one that comes as
            # its own timeout does, and nats-py's connect, cancelled so, tries the next server.
            ended: set[asyncio.Task[Any]] = set()
            for i in range(CANCELS):
                pending = {t for t in asyncio.all_tasks(loop) if not t.done()}
                if not pending:
                    break
                if i == 0 or i * SLICE >= GRACE:
                    for task in pending:
                        task.cancel()
                done, _ = loop.run_until_complete(asyncio.wait(pending, timeout=SLICE))
                ended |= done
            for task in ended:
                if not task.cancelled():
                    task.exception()  # retrieved: what a cancelled task raised on its way out is not reported
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            log.debug("the bus loop is closed")


ABANDONED: Final = "abandoned"
TIMED_OUT: Final = "timed out"


def _waited(lock: threading.Lock, timeout: float | None, abandon: Callable[[], bool] | None = None) -> str:
    """Acquire `lock` within `timeout` seconds (None: however long it takes) unless `abandon` answers True first;
    answers "" once acquired, else `ABANDONED` or `TIMED_OUT`. In waits of `SLICE` at most: a lock's wait does not
    look for a signal that came just before it began, and one that comes in a slice's end is handled there
    (cli/process.py `Signals`)."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if lock.acquire(timeout=max(0.0, min(left, SLICE))):
            return ""
        if abandon is not None and abandon():
            return ABANDONED
        if left <= SLICE:
            return TIMED_OUT
