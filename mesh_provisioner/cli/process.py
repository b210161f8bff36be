"""What the process owns, and the package never touches: its logging (text or JSON, to stderr) and its signals
(SIGTERM and SIGINT honoured at every moment)."""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final

import msgspec

log = logging.getLogger("mesh_provisioner.cli")

# The package's own code, where a signal's handler may raise (`Signals`).
PACKAGE: Final = str(Path(__file__).parents[1]) + os.sep

# ---- logging ------------------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time (UTC, milliseconds), level, logger, message, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        at = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out = {"time": at, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(out).decode()


def configure_logging(level: str, form: str) -> None:
    """The process's logging: to stderr, as text or JSON (the seat itself never configures logging)."""
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


# ---- signals ------------------------------------------------------------------------------------------------


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the process: raised in its main thread where that runs the package's own code (the
    thread poked until it does, `Signals`), so every `finally` on the way cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stop(threading.Event):
    """The process's stop: set by a signal, or by a command that is done. It remembers whether the main thread has
    seen it set (set it, or `is_set` or `wait` answering True there), from which moment that thread stops by itself."""

    seen = False

    def set(self) -> None:
        super().set()
        self._seen(True)

    def is_set(self) -> bool:
        return self._seen(super().is_set())

    def wait(self, timeout: float | None = None) -> bool:
        return self._seen(super().wait(timeout))

    def _seen(self, stopped: bool) -> bool:
        if stopped and threading.current_thread() is threading.main_thread():
            self.seen = True
        return stopped


class Signals:
    """SIGTERM and SIGINT honoured at every moment, while installed (`with Signals() as s:`).

    The first sets `stop` (what waits on it ends its loop) and raises Interrupted in the main thread, where it runs
    this package's own code (waiting in `EventLoopThread.run` for connecting, a load or a request, say). The
    `finally` blocks on the way give the lease back and stop the actors. A second signal during that clean-up exits
    at once. Installed only on the main thread (the only one that receives signals), and the handlers before it are
    put back after.

    A handler runs between any two bytecodes of the main thread. Inside a library (a `threading.Event`'s wait,
    logging, starting a thread) an exception raised there can land between a lock's taking and the `try` that gives
    it back, and `stop.set()` there waits for a lock the main thread itself may hold: it never returns (the Python
    documentation's "Note on Signal Handlers and Exceptions"). So the handler takes no lock: a thread sets `stop`.
    And it raises only out of the package's own code, which takes its locks with `with`; a signal that came inside a
    library is raised later, `POKE` sent to the main thread every `AGAIN` seconds until it is, or until the main
    thread has seen `stop` set and stops by itself (a wait on the bus loop begun meanwhile does not end on `stop`).
    A signal that comes once the main thread has seen `stop` (a command that is done, stopping) raises nothing:
    that thread is in its clean-up, which it finishes (`late`).
    """

    AGAIN: Final = 0.005
    # Sent to the main thread, not SIGTERM or SIGINT again, so that each of those is the operator's; ignored by
    # default, should one come once the handlers are put back, and used by nothing else here.
    POKE: Final = signal.SIGURG

    def __init__(self) -> None:
        self.stop = Stop()
        self.signum = 0
        self.late = False  # the first signal came once the main thread had seen `stop`: it finishes as it was
        self._before: dict[int, Any] = {}
        self._caller: FrameType | None = None
        self._signalled: queue.SimpleQueue[int] = queue.SimpleQueue()  # its put is reentrant, fit for a handler
        self._relay: threading.Thread | None = None
        self._done = threading.Event()
        self._pending = False  # the first signal came and is not raised yet

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._caller = sys._getframe(1)
            self._relay = threading.Thread(target=self._relay_signal, name="mesh-provisioner-signals", daemon=True)
            self._relay.start()
            self._before[self.POKE] = signal.signal(self.POKE, self._poked)
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._before[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        # The relay ended before the handlers are put back: it pokes no thread that no longer expects it.
        self._done.set()
        if self._relay is not None:
            self._signalled.put(0)
            self._relay.join()
            self._relay = None
        for sig, handler in self._before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: not one of Python's
        self._before.clear()
        self._caller = None

    def _relay_signal(self) -> None:
        """Set `stop` once a signal came (0: the handlers are being put back, none came); then poke the main thread
        while the signal is not raised and that thread has not seen `stop`."""
        if not self._signalled.get():
            return
        self.stop.set()
        main = threading.main_thread().ident
        assert main is not None
        while not self._done.wait(self.AGAIN):
            if not self._pending or self.stop.seen:
                return
            signal.pthread_kill(main, self.POKE)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            name = signal.Signals(signum).name
            log.warning("%s again while stopping: exiting at once, without the rest of the clean-up", name)
            logging.shutdown()
            os._exit(128 + signum)
        self.signum = signum
        self.late = self.stop.seen
        raising = not self.late and self._own_code(frame)
        self._pending = not raising and not self.late
        self._signalled.put(signum)
        if raising:
            raise Interrupted(signum)

    def _poked(self, signum: int, frame: FrameType | None) -> None:
        if self._pending and not self.stop.seen and not self._done.is_set() and self._own_code(frame):
            self._pending = False
            raise Interrupted(self.signum)

    def _own_code(self, frame: FrameType | None) -> bool:
        """Whether the frame the signal interrupted and every frame out to the one that entered `with Signals()` (not
        that one: its `try` may be behind it) are the package's code, none of them this module's."""
        if frame is self._caller:
            return False
        while frame is not None and frame is not self._caller:
            if not frame.f_code.co_filename.startswith(PACKAGE) or frame.f_code.co_filename == __file__:
                return False
            frame = frame.f_back
        return frame is not None
