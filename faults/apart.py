"""Parts of a run in processes of their own: the undisturbed seat (`SeatProcess`) and the writer of the stream
(`Writer`).

Each is a child process (spawned, not forked: the runner's process has threads) that answers the runner's
questions over a pipe, one at a time. In the runner's process both shared the interpreter lock with the disturbed
seat: on a mesh of 200 nodes the two seats and the writer together made at most about 70 changes a second, against
about 260 with the disturbed seat alone, and while actors were killed the writer got so little of the lock that the
stream could not flow at the pace a run asks for. Apart, the disturbed seat is alone in the runner's process with
the faults and the checks, as it is alone in a seat process.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from faults.mesh import Change, Router, write
from mesh_provisioner.config import Config
from mesh_provisioner.runtime import Runtime
from meshcheck import check
from meshcheck.bus import Bus

log = logging.getLogger("faults")

# How long a question to a child may take beyond the time it is given to answer it.
SLACK = 30.0
STOP = "stop"


def _answer_all(conn: Connection, answers: dict[str, Callable[[Any], Any]]) -> None:
    """The child's side: it started; then one answer to each question, ("ok", value) or ("failed", why), until
    asked to stop (which is answered too)."""
    conn.send(("ok", None))
    while True:
        what, arg = conn.recv()
        try:
            conn.send(("ok", answers[what](arg)))
        except Exception as err:
            conn.send(("failed", f"{type(err).__name__}: {err}"))
        if what == STOP:
            return


class Apart:
    """A child process running `target(conn, *args)`, which answers with `_answer_all`."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str, *,
                 timeout: float = 120.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=target, args=(child, *args), name=name, daemon=True)
        self._proc.start()
        child.close()
        said, why = self._answer(timeout)
        if said != "ok":
            self._proc.join(10)
            raise RuntimeError(f"{name} did not start: {why}")

    def _answer(self, timeout: float) -> tuple[str, Any]:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"{self.name} did not answer within {timeout:g} s")
        said: tuple[str, Any] = self._conn.recv()
        return said

    def ask(self, what: str, arg: Any = None, timeout: float = SLACK) -> Any:
        """The child's answer to a question; RuntimeError with its reason when it failed."""
        self._conn.send((what, arg))
        said, value = self._answer(timeout)
        if said != "ok":
            raise RuntimeError(f"{self.name}: {value}")
        return value

    @property
    def alive(self) -> bool:
        """Whether the child still runs."""
        return self._proc.is_alive()

    def stop(self) -> Any:
        """Ask the child to stop and wait for it; its last answer (None when it was not running)."""
        last = None
        try:
            if self._proc.is_alive():
                last = self.ask(STOP)
        finally:
            self._proc.join(10)
            if self._proc.is_alive():
                log.warning("%s did not exit; killing it", self.name)
                self._proc.kill()
                self._proc.join(10)
            self._conn.close()
        return last


def _seat(conn: Connection, config: Config) -> None:
    """The undisturbed seat's child."""
    with check.watching_errors() as errors:
        try:
            sup = Runtime.start(config)
        except Exception as err:
            conn.send(("failed", f"{type(err).__name__}: {err}"))
            return

        def stop(_: Any) -> list[str]:
            sup.stop()
            return errors.problems()

        _answer_all(conn, {"settled": sup.wait_settled, "errors": lambda _: errors.problems(), STOP: stop})


class SeatProcess(Apart):
    """A `Runtime` of `config` in a child process: `wait_settled`, `problems` and `stop`, as the runner asks them."""

    def __init__(self, config: Config) -> None:
        super().__init__(_seat, (config,), "the undisturbed seat's process")
        self._errors: list[str] = []

    def wait_settled(self, timeout: float) -> bool:
        """Whether the seat settled within `timeout` seconds."""
        return bool(self.ask("settled", timeout, timeout + SLACK))

    def problems(self) -> list[str]:
        """The errors the seat's loggers recorded so far (check.ErrorLog), but deliberate kills."""
        if self.alive:
            self._errors = list(self.ask("errors"))
        return self._errors

    def stop(self) -> None:
        """Stop the seat and its process."""
        last = super().stop()
        if last is not None:
            self._errors = list(last)


def _writer(conn: Connection, disturbed: str, reference: str) -> None:
    """The writer's child: a connection to each bus, as the other modules' (meshcheck.bus.Bus)."""
    buses = Bus(disturbed), Bus(reference)
    routers = Router(buses[0]), Router(buses[1])
    # The two buses are written at once, each on its own loop: one after the other, a change took two round trips,
    # and a loaded machine's round trips kept the stream below its pace.
    beside = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="faults-reference-writer")

    def one(arg: tuple[Change, bool]) -> None:
        change, both = arg
        referenced = beside.submit(write, buses[1], change, routers[1]) if both else None
        write(buses[0], change, routers[0])
        if referenced is not None:
            referenced.result()

    def stop(_: Any) -> None:
        beside.shutdown()
        for bus in buses:
            bus.close()

    _answer_all(conn, {"write": one, STOP: stop})


class Writer(Apart):
    """The stream's writer in a child process: each change written to the disturbed bus and the reference (or the
    disturbed one alone), answered once both acknowledged it."""

    def __init__(self, disturbed: str, reference: str, *, timeout: float) -> None:
        super().__init__(_writer, (disturbed, reference), "the stream's writer")
        self.timeout = timeout

    def write(self, change: Change, *, reference: bool = True) -> None:
        """Make one change (a bus away is waited for, as `Bus` waits, up to its timeout)."""
        self.ask("write", (change, reference), self.timeout + SLACK)
