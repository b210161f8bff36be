"""The actors' protocol: what the supervisor, node, bound and asker actors tell each other (design.md).

Each message is a frozen msgspec Struct of one tagged union, so a host's actors can build them too and nothing
mutable crosses a thread.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, frozen=True, tag=True):
    """A message between actors."""


class Changed(Message, frozen=True):
    """Something a node's composition reads changed: compose it again (coalesced with any other pending)."""

    at: float = 0.0
    """When the change reached the cache (monotonic seconds; 0: unknown): stamped once the cache holds it, so that a
    composition begun later is known to have read it, and to measure the time to its write."""
    state: str = ""
    key: str = ""
    revision: int = 0
    """The change that woke the node: a value of `state` at `key` put at `revision` ("", 0: unknown, or a delete)."""


class Tick(Message, frozen=True):
    """To an actor from itself: do all that is pending, once (coalescing)."""


class Rejudge(Message, frozen=True):
    """Judge these keys again from their providers' outcomes."""

    keys: frozenset[str]
    at: float = 0.0
    """When the change reached the cache (monotonic seconds); 0: unknown."""


class ComposeNode(Message, frozen=True):
    """Compose a node now and answer its `Composed` (to the supervisor: route it to the node's actor)."""

    node: str


class Look(Message, frozen=True):
    """To the asker: publish these retiring keys' asks unless the router holds them, and read their answers."""

    keys: frozenset[str]


class Decided(Message, frozen=True):
    """To the asker: the router decided something; read the record of every retiring key that waits for one."""


class Resync(Message, frozen=True):
    """Forget nothing, trust nothing: judge everything this actor owns again from the bus."""


class Crash(Message, frozen=True):
    """Die as a crash would (the chaos API): the supervisor restarts the actor."""


class Status(Message, frozen=True):
    """Ask the supervisor how it is: answered with a `SeatStatus`."""


class Stop(Message, frozen=True):
    """Ask the supervisor to stop its own actors."""


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
    """How a supervisor is: its children, how many restarts each had, and whether it failed."""

    children: dict[str, bool]
    restarts: dict[str, int]
    failed: str = ""
    in_flight: int = 0
