"""The bus loop thread: running coroutines from other threads, with timeouts, and adopting a host's loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings

import pytest
from helpers import wait_until

from mesh_provisioner.bus.loop import Abandoned, EventLoopThread


def test_run_answers_the_result_on_the_loop_thread(loop: EventLoopThread) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert loop.run(where(), 5) == "test-bus"
    assert loop.submit(where()).result(5) == "test-bus"


async def waits_for_ever(cancelled: threading.Event) -> None:
    """Waits until it is cancelled, which sets `cancelled`."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.set()
        raise


def test_run_past_its_timeout_cancels_and_raises_timeout_error(loop: EventLoopThread) -> None:
    cancelled = threading.Event()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.05 s"):
        loop.run(waits_for_ever(cancelled), 0.05)
    wait_until(cancelled.is_set, 5, what="the timed-out coroutine cancelled")


def test_run_abandoned_while_it_waits_cancels_and_raises_abandoned(loop: EventLoopThread) -> None:
    cancelled = threading.Event()
    ended = threading.Event()  # what the wait was for (a seat's holding) ended
    threading.Timer(0.2, ended.set).start()
    with pytest.raises(Abandoned, match="waits_for_ever was abandoned"):
        loop.run(waits_for_ever(cancelled), None, abandon=ended.is_set)
    wait_until(cancelled.is_set, 5, what="the abandoned coroutine cancelled")
    assert loop.run(asyncio.sleep(0, "done"), 5, abandon=lambda: False) == "done"


def test_run_raises_a_coroutines_own_timeout_as_it_is_not_as_its_wait_past(loop: EventLoopThread) -> None:
    # A request's timeout inside the coroutine is not the wait's: said as one, it read "did not finish within 40 s"
    # of a call that had failed at once.
    async def request_timed_out() -> None:
        raise TimeoutError("nats: timeout")

    with pytest.raises(TimeoutError, match=r"^nats: timeout$"):
        loop.run(request_timed_out(), 40)


def test_run_on_the_loop_thread_is_refused(loop: EventLoopThread) -> None:
    async def nested() -> None:
        async def inner() -> None:
            return None

        loop.run(inner(), 1)

    with pytest.raises(RuntimeError, match="own thread"):
        loop.run(nested(), 5)


def test_stop_cancels_what_still_runs() -> None:
    started, ended = threading.Event(), threading.Event()
    running = EventLoopThread("short")

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    running.submit(forever())
    wait_until(started.is_set, 5, what="the coroutine started")
    running.stop()
    assert ended.is_set()
    assert running.loop.is_closed()


def test_stop_cancels_again_a_task_that_lost_its_cancellation() -> None:
    # As Python 3.11's `asyncio.wait_for` loses one that comes as its own timeout does (nats-py's connect then tries
    # the next server): the loop stops all the same, at once, not past `stop`'s wait.
    thread = EventLoopThread("test-stubborn")
    started, lost = threading.Event(), threading.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            lost.set()
        await asyncio.Event().wait()

    thread.submit(stubborn())
    wait_until(started.is_set, 5, what="the coroutine started")
    began = time.monotonic()
    thread.stop(timeout=5)
    assert lost.is_set()
    assert thread.loop.is_closed(), "the loop still runs the task that lost its cancellation"
    assert time.monotonic() - began < 2


def test_stop_lets_a_cancelled_task_finish_what_it_shields_on_its_way_out() -> None:
    # As a watch deletes its consumer under a shield when cancelled (bus/cache.py): that clean-up, a task started
    # after the stop began, is waited for, not cancelled again at once.
    thread = EventLoopThread("test-shield")
    started, cleaned = threading.Event(), threading.Event()

    async def clean_up() -> None:
        await asyncio.sleep(0.2)
        cleaned.set()

    async def watch() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(clean_up())

    thread.submit(watch())
    wait_until(started.is_set, 5, what="the coroutine started")
    thread.stop(timeout=5)
    assert cleaned.is_set(), "the shielded clean-up was cut short"
    assert thread.loop.is_closed()


def test_an_adopted_loop_is_neither_started_nor_stopped_by_it() -> None:
    with EventLoopThread("host") as host:
        adopted = EventLoopThread.adopt(host.loop)

        async def answer() -> int:
            return 42

        assert adopted.run(answer(), 5) == 42
        adopted.stop()
        assert host.loop.is_running()
        assert host.run(answer(), 5) == 42


def test_a_loop_interrupted_as_it_starts_stops_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[threading.Event] = []

    class Interrupted(threading.Event):
        """The start's wait, left by a signal's exception just as the loop runs."""

        def __init__(self) -> None:
            super().__init__()
            made.append(self)

        def wait(self, timeout: float | None = None) -> bool:
            if timeout is None:
                super().wait(10)
                raise KeyboardInterrupt
            return super().wait(timeout)

    before = set(threading.enumerate())
    monkeypatch.setattr(threading, "Event", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        EventLoopThread("cut-short")
    monkeypatch.undo()
    assert made and made[0].is_set(), "the loop never ran"
    assert not [t.name for t in set(threading.enumerate()) - before if t.name == "cut-short"]


def test_run_on_a_stopped_loop_raises_and_leaves_no_coroutine_never_awaited() -> None:
    stopped = EventLoopThread("test-stopped")
    stopped.stop()

    async def later() -> None:
        return None

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError):
            stopped.run(later(), 1)
        gc.collect()  # an un-awaited coroutine is said when it is collected
    assert [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)] == []
