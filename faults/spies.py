"""Spies on a seat: every write it sends to its own buckets, and every composition of a node.

- `CasSpy` wraps a seat's connection: every request to one of the seat's own buckets is counted, and one that
  carries no expected revision (a blind put) or goes out as a plain publish is named. With `held`, it also names
  each write sent while the process does not hold the seat's lease (contract 8: a holder that cannot renew stops
  writing at once). Each write it sees is kept as an `Intent` (meshcheck/history.py: who sent a compare-and-set on
  which revision of which key), and with `sink` also written there as a line before the write goes out, so that a
  process killed a moment later has logged every write it sent.
- `ComposeSpy` stands in for the node actors' `compose_node` and counts compositions of one node at once.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from nats.aio.client import Client

from mesh_provisioner import seat as seat_module
from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.bus import attachment as attachment_module
from mesh_provisioner.bus.connection import subject_of
from mesh_provisioner.bus.link import SeatClient
from mesh_provisioner.bus.store import Applied, Store
from mesh_provisioner.config import Config
from mesh_provisioner.messages.writes import Write
from meshcheck.history import EXPECTED, Intent

_IN_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar("in_request", default=False)


class CasSpy:
    """Every write a seat's connection sends to one of the seat's own buckets, and those with no expected revision.

    A write goes out as a request (nats-py's key-value calls) or as a publish with a reply subject (a batch's); one
    without `Nats-Expected-Last-Subject-Sequence` is blind. The lease's own bucket (`_seat`) is the lease's business.
    """

    PREFIX = "$KV.mesh-provisioner_"
    LEASE = "$KV.mesh-provisioner_seat."

    def __init__(self, held: Callable[[], bool] | None = None, *, sink: TextIO | None = None) -> None:
        self.writes = 0
        self.blind: list[str] = []
        self.unheld: list[str] = []
        self.held = held
        self.intents: list[Intent] = []
        self.sink = sink
        self.pid = os.getpid()

    def wrap(self, nc: Client) -> Client:
        """Spy on a connection from now on; answers it."""
        request, publish = nc.request, nc.publish

        def seen(subject: str, headers: Any) -> None:
            if subject.startswith(self.PREFIX) and not subject.startswith(self.LEASE):
                self.writes += 1
                expected = (headers or {}).get(EXPECTED)
                if expected is None:
                    self.blind.append(f"{subject} {headers}")
                else:
                    intent = Intent(self.pid, subject, int(expected), time.time())
                    self.intents.append(intent)
                    if self.sink is not None:
                        self.sink.write(intent.line())
                        self.sink.flush()  # in the kernel's hands before the write goes out: a SIGKILL keeps it
                if self.held is not None and not self.held():
                    self.unheld.append(f"{time.monotonic():.3f} {subject}")

        async def spied_request(subject: str, payload: bytes = b"", *args: Any, **kwargs: Any) -> Any:
            seen(subject, kwargs.get("headers") or (args[3] if len(args) > 3 else None))
            token = _IN_REQUEST.set(True)
            try:
                return await request(subject, payload, *args, **kwargs)
            finally:
                _IN_REQUEST.reset(token)

        async def spied_publish(subject: str, payload: bytes = b"", *args: Any, **kwargs: Any) -> None:
            # A publish of a request was seen as the request; any other is a write of its own (a batch's).
            if not _IN_REQUEST.get():
                seen(subject, kwargs.get("headers") or (args[1] if len(args) > 1 else None))
            await publish(subject, payload, *args, **kwargs)

        nc.request = spied_request  # type: ignore[method-assign]
        nc.publish = spied_publish  # type: ignore[method-assign]
        return nc

    def stored(self, subject: str, expected: int, revision: int) -> None:
        """The server acknowledged a write of this process at `revision`: logged, so it names its writer outright."""
        intent = Intent(self.pid, subject, expected, time.time(), revision)
        self.intents.append(intent)
        if self.sink is not None:
            self.sink.write(intent.line())
            self.sink.flush()

    def problems(self) -> list[str]:
        """Each write that was not a compare-and-set, or was sent without the lease."""
        out = [f"a write was not a compare-and-set: {b}" for b in self.blind[:10]]
        out += [f"a write was sent while the process did not hold the seat's lease: {u}" for u in self.unheld[:10]]
        return out


@contextmanager
def spied_runtimes(spy: CasSpy) -> Iterator[CasSpy]:
    """Every runtime started in the block on a connection of its own, and every seat (`Seat`, as `serve` runs it),
    has that connection spied on. Blocks nest: what is in place when one begins (another block's spy) is what its
    spy calls, and what it puts back."""
    # Each replaced where it is looked up: in the modules that imported it by name.
    real, real_bus = attachment_module.connect_config, seat_module.open_bus  # type: ignore[attr-defined]

    async def connect_spied(config: Config, client: SeatClient | None = None, **options: Any) -> SeatClient:
        nc = await real(config, client, **options)
        spy.wrap(nc)
        return nc

    async def open_spied(config: Config, within: float, said: Callable[[str], None] | None = None,
                         **options: Any) -> Client:
        return spy.wrap(await real_bus(config, within, said, **options))

    async def apply_spied(self: Store, writes: Iterable[Write]) -> Applied:
        applied = await real_apply(self, writes)
        for write, revision in applied.done:
            spy.stored(subject_of(write.state, write.key), write.revision, revision)
        return applied

    real_apply = Store.apply
    attachment_module.connect_config = connect_spied  # type: ignore[attr-defined]
    seat_module.open_bus = open_spied  # type: ignore[attr-defined]
    Store.apply = apply_spied  # type: ignore[method-assign]
    try:
        yield spy
    finally:
        attachment_module.connect_config = real  # type: ignore[attr-defined]
        seat_module.open_bus = real_bus  # type: ignore[attr-defined]
        Store.apply = real_apply  # type: ignore[method-assign]


class ComposeSpy:
    """Counts concurrent compositions of each node of each seat (a seat's nodes are told apart by its view)."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.lock = threading.Lock()
        self.running: Counter[tuple[int, str]] = Counter()
        self.most = 0
        self.count = 0

    def __call__(self, view: Any, node: str, now: Any, writes_on: Any = None) -> Any:
        who = (id(view), node)
        with self.lock:
            self.running[who] += 1
            self.count += 1
            self.most = max(self.most, self.running[who])
        try:
            return self.real(view, node, now, writes_on)
        finally:
            with self.lock:
                self.running[who] -= 1

    def problems(self) -> list[str]:
        """A node composed twice at once, named."""
        return [f"a node was composed {self.most} times at once"] if self.most > 1 else []


@contextmanager
def spied_compositions() -> Iterator[ComposeSpy]:
    """Every node actor's compositions counted while the block runs (what is in place when it begins, counted)."""
    spy = ComposeSpy(node_actor.compose_node)  # type: ignore[attr-defined]  # where the node actors look it up
    node_actor.compose_node = spy  # type: ignore[attr-defined]
    try:
        yield spy
    finally:
        node_actor.compose_node = spy.real  # type: ignore[attr-defined]
