"""The actors' protocol: what the supervisor, node, bound and asker actors tell each other (design.md).

Each message is a frozen msgspec Struct of one tagged union, so a host's actors can build them too and nothing
mutable crosses a thread.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, frozen=True, tag=True):
    """A message between actors."""


class Tick(Message, frozen=True):
    """To an actor: take and run every judgment the dispatcher queued for it."""


class Wake(Message, frozen=True):
    """To an actor: queue these judgments (`(kind, subject)`, actors/dispatch.py) to run whatever they read, as a
    write the bus failed is retried after a backoff."""

    judgments: tuple[tuple[str, str], ...]


class ComposeNode(Message, frozen=True):
    """Compose a node now and answer its `Composed` (to the seat's mailbox for a host, `Runtime.ref`, which routes it
    to the node's actor)."""

    node: str


class Decided(Message, frozen=True):
    """To the asker: the router decided something, or its stream was created; look at every retiring key again."""


class Resync(Message, frozen=True):
    """Forget nothing, trust nothing: judge everything this actor owns again from the bus."""


class Crash(Message, frozen=True):
    """Die as a crash would (the chaos API): the supervisor restarts the actor."""


class Status(Message, frozen=True):
    """Ask the seat how it is (at `Runtime.ref`): answered with a `SeatStatus`."""


class Stop(Message, frozen=True):
    """Ask the seat to stop (at `Runtime.ref`): answered at once, the seat stopped on a thread of its own, as
    `Runtime.stop` does; `Runtime.failed` is done once it has."""


class ChildExited(Message, frozen=True):
    """To the supervisor: a child stopped, by a crash (`failed`) or by a stop nobody asked for."""

    name: str
    urn: str
    failed: bool
    why: str = ""


class Restart(Message, frozen=True):
    """To the supervisor, once a backoff has passed: start a child again."""

    name: str


class SeatStatus(msgspec.Struct, frozen=True):
    """How a seat is: its supervisor's children, how many restarts each had, and whether it failed."""

    children: dict[str, bool]
    restarts: dict[str, int]
    failed: str = ""
    in_flight: int = 0
