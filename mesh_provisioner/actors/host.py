"""The seat's mailbox for a host's actors (design.md): `ComposeNode`, `Status` and `Stop`, at `Runtime.ref`."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import pykka

from mesh_provisioner.config import Config
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import ComposeNode, SeatStatus, Status, Stop


class HostFacing(Protocol):
    """What a host's messages are answered from: the runtime."""

    config: Config

    def compose(self, node: str) -> pykka.Future[r.Composed]: ...

    def status(self) -> SeatStatus: ...

    def stop(self, timeout: float = 10.0) -> None: ...


class HostActor(pykka.ThreadingActor):
    """The seat's mailbox for a host's actors: `ComposeNode`, `Status`, `Stop` (design.md). Apart from the
    supervisor's, so that a composition a host waits for never holds a restart back."""

    def __init__(self, seat: HostFacing) -> None:
        super().__init__()
        self.seat = seat

    def on_receive(self, message: Any) -> Any:
        """Answer one host message."""
        if isinstance(message, ComposeNode):
            return self.seat.compose(message.node).get(timeout=self.seat.config.request_timeout * 6)
        if isinstance(message, Status):
            return self.seat.status()
        if isinstance(message, Stop):
            threading.Thread(target=self.seat.stop, daemon=True).start()
        return None
