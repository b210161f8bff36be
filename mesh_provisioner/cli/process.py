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
    """SIGTERM or SIGINT reached the process: raised where its main thread was, so every `finally` cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """SIGTERM and SIGINT honoured at every moment, while installed (`with Signals() as s:`).

    The first sets `stop` (what waits on it ends its loop) and, where the main thread runs only this package's code
    (waiting in `EventLoopThread.run` for connecting, a load or a request, say), raises Interrupted there. The
    `finally` blocks on the way give the lease back and stop the actors. A second signal during that clean-up exits
    at once. Installed only on the main thread (the only one that receives signals), and the handlers before it are
    put back after.

    Why not more: a handler runs between any two bytecodes of the main thread. Inside a library (a `threading.Event`'s
    wait, logging) an exception raised there can land between a lock's taking and the `try` that gives it back, and
    `stop.set()` there waits for a lock the main thread itself may hold: it never returns. So the handler takes no
    lock (a thread sets `stop`) and raises only out of this package's own code, which takes its locks with `with`
    (the Python documentation's "Note on Signal Handlers and Exceptions").
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signum = 0
        self._before: dict[int, Any] = {}
        self._caller: FrameType | None = None
        self._signalled: queue.SimpleQueue[int] = queue.SimpleQueue()  # its put is reentrant, fit for a handler
        self._relay: threading.Thread | None = None

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._caller = sys._getframe(1)
            self._relay = threading.Thread(target=self._set_stop, name="mesh-provisioner-signals", daemon=True)
            self._relay.start()
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._before[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
        self._before.clear()
        self._caller = None
        if self._relay is not None:
            self._signalled.put(0)
            self._relay.join()
            self._relay = None

    def _set_stop(self) -> None:
        """Set `stop` once a signal came (0: the handlers are put back, nothing came)."""
        if self._signalled.get():
            self.stop.set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            log.warning("%s again while stopping: exiting at once, without the rest of the clean-up", name)
            logging.shutdown()
            os._exit(128 + signum)
        self.signum = signum
        self._signalled.put(signum)
        if self._own_code(frame):
            raise Interrupted(signum)

    def _own_code(self, frame: FrameType | None) -> bool:
        """Whether every frame from the one the signal interrupted out to the one that entered `with Signals()` is
        this package's code."""
        while frame is not None and frame is not self._caller:
            if not frame.f_code.co_filename.startswith(PACKAGE):
                return False
            frame = frame.f_back
        return frame is not None
