"""The undisturbed seat of a run, in a process of its own.

The reference seat is an in-process `Runtime` in every way but where it runs: a child process (spawned, not
forked: the runner's process has threads) starts `Runtime.start(config)` and answers the runner over a pipe: whether
it settled within a time, the errors its loggers recorded, and its stop. In the runner's process it shared the
interpreter lock with the disturbed seat and the writer of the stream: on a mesh of 200 nodes the two seats and the
writer together made at most about 70 changes a second, against about 260 with the disturbed seat alone, so the
stream could not flow at the pace a run asks for.
"""

from __future__ import annotations

import logging
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from mesh_provisioner.config import Config
from mesh_provisioner.runtime import Runtime
from meshcheck import check

log = logging.getLogger("faults")

# How long a question to the child may take beyond the time it is given to answer it.
SLACK = 30.0


def _serve(conn: Connection, config: Config) -> None:
    """The child: the seat, then one answer to each question until asked to stop."""
    with check.watching_errors() as errors:
        try:
            sup = Runtime.start(config)
        except Exception as err:
            conn.send(("failed", f"{type(err).__name__}: {err}"))
            return
        conn.send(("started", None))
        while True:
            what, arg = conn.recv()
            if what == "settled":
                conn.send(sup.wait_settled(arg))
            elif what == "errors":
                conn.send(errors.problems())
            elif what == "stop":
                sup.stop()
                conn.send(errors.problems())
                return


class SeatProcess:
    """A `Runtime` of `config` in a child process: `wait_settled`, `problems` and `stop`, as the runner asks them."""

    def __init__(self, config: Config, *, timeout: float = 120.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, config), name="faults-undisturbed-seat", daemon=True)
        self._proc.start()
        child.close()
        self._errors: list[str] = []
        said, why = self._answer(timeout)
        if said != "started":
            self._proc.join(10)
            raise RuntimeError(f"the undisturbed seat did not start: {why}")

    def _answer(self, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"the undisturbed seat's process did not answer within {timeout:g} s")
        return self._conn.recv()

    def _ask(self, what: str, arg: Any = None, timeout: float = SLACK) -> Any:
        self._conn.send((what, arg))
        return self._answer(timeout)

    def wait_settled(self, timeout: float) -> bool:
        """Whether the seat settled within `timeout` seconds."""
        return bool(self._ask("settled", timeout, timeout + SLACK))

    def problems(self) -> list[str]:
        """The errors the seat's loggers recorded so far (check.ErrorLog), but deliberate kills."""
        if self._proc.is_alive():
            self._errors = list(self._ask("errors"))
        return self._errors

    def stop(self) -> None:
        """Stop the seat and its process."""
        try:
            if self._proc.is_alive():
                self._errors = list(self._ask("stop"))
        finally:
            self._proc.join(10)
            if self._proc.is_alive():
                log.warning("the undisturbed seat's process did not exit; killing it")
                self._proc.kill()
                self._proc.join(10)
            self._conn.close()
