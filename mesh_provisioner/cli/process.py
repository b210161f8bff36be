"""What the process owns, and the package never touches: its logging (text or JSON, to stderr) and its signals
(SIGTERM and SIGINT honoured at every moment)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import msgspec

log = logging.getLogger("mesh_provisioner.cli")

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

    The first sets `stop` (what waits on it ends its loop) and raises Interrupted in the main thread, out of whatever
    it waits for: connecting, the lease, settling. The `finally` blocks on the way give the lease back and stop the
    actors. A second signal during that clean-up exits at once. Installed only on the main thread (the only one
    that receives signals), and the handlers before it are put back after.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signum = 0
        self._before: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._before[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            log.warning("%s again while stopping: exiting at once, without the rest of the clean-up", name)
            logging.shutdown()
            os._exit(128 + signum)
        self.signum = signum
        self.stop.set()
        raise Interrupted(signum)
