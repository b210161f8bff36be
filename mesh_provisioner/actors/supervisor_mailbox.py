"""The supervisor's own mailbox (supervisor.py): its children's exits and their restarts, handled one at a time in
order, and nothing else, so that the supervisor never waits on a child's work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pykka

from mesh_provisioner.actors.base import InFlight
from mesh_provisioner.messages.protocol import ChildExited, Restart


class SupervisorMailbox(pykka.ThreadingActor):
    """Hands each `ChildExited` to `on_exit` and each `Restart` to `on_restart`, in order."""

    def __init__(self, in_flight: InFlight, on_exit: Callable[[ChildExited], None],
                 on_restart: Callable[[str], None]) -> None:
        super().__init__()
        self._in_flight = in_flight
        self._on_exit = on_exit
        self._on_restart = on_restart

    def on_receive(self, message: Any) -> Any:
        """Handle one exit or restart; each was counted in flight by whoever told it."""
        try:
            if isinstance(message, ChildExited):
                self._on_exit(message)
            elif isinstance(message, Restart):
                self._on_restart(message.name)
        finally:
            if isinstance(message, ChildExited):
                self._in_flight.done(self.actor_urn)
        return None
