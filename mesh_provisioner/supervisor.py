"""The supervisor: starts the seat's actors and restarts them, and does nothing else (design.md, "Supervision").

pykka has no supervision, so this adds what an OTP supervisor gives: a child spec per child, one-for-one restarts
with exponential backoff, a restart intensity past which every child is stopped in reverse order and the owner is
told, and death noticed however it comes (a crash, a stop nobody asked for, a thread gone). It never routes, never
touches the bus and never waits on a child's work: its own mailbox holds only exits and restarts. What a restarted
child must do to recover (resynchronise from the bus) is its owner's, told through `on_started`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from typing import Any

import pykka

from mesh_provisioner.actors.base import InFlight, stop_actor
from mesh_provisioner.actors.supervisor_mailbox import SupervisorMailbox
from mesh_provisioner.config import Config
from mesh_provisioner.messages.protocol import ChildExited, Crash, Message, Restart
from mesh_provisioner.restarts import ChildSpec

log = logging.getLogger("mesh_provisioner.supervisor")


class Supervisor:
    """The seat's children: started, restarted one for one, stopped in reverse order."""

    def __init__(self, config: Config, in_flight: InFlight, *, on_started: Callable[[str], None],
                 on_exited: Callable[[str], None], on_restart: Callable[[str], None] = lambda _: None) -> None:
        """`on_started(name)` follows every start of a child, first or again; `on_exited(name)` every death, before
        its restart; `on_restart(kind)` counts restarts. `failed` answers why the supervisor gave up ("": asked to)."""
        self.config = config
        self.in_flight = in_flight
        self.failed: Future[str] = Future()
        self._on_started = on_started
        self._on_exited = on_exited
        self._on_restart = on_restart
        self._lock = threading.RLock()
        self._specs: dict[str, ChildSpec] = {}
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._order: list[str] = []
        self._waiting: set[str] = set()  # children dead and waiting for their restart
        self._killed: set[str] = set()  # urns of instances killed through the chaos API
        self.stopping = False
        self.ref = SupervisorMailbox.start(in_flight, self._on_exit, self._restart)

    # ---- children -------------------------------------------------------------------------------------------

    def add(self, name: str, start: Callable[[], pykka.ActorRef[Any]], *, started: bool = True) -> None:
        """Start a child once (a second add of a name does nothing); `started`: tell `on_started`."""
        with self._lock:
            if name in self._specs or self.stopping:
                return
            self._specs[name] = ChildSpec(name, start)
            self._order.append(name)
            self._refs[name] = start()
        if started:
            self._on_started(name)

    def has(self, name: str) -> bool:
        """Whether a child of that name was ever started (no lock: read on the loop for each change)."""
        return name in self._specs

    def tell(self, name: str, message: Message) -> bool:
        """Tell a child, counting the message in flight; False when it cannot hear it (gone, or its restart due)."""
        # No lock: called on the loop for each change, it must not wait for an actor thread. A child that dies
        # meanwhile is forgotten by `in_flight`, which then counts nothing for it (its successor resyncs).
        ref = self._refs.get(name)
        if ref is None or name in self._waiting:
            return False
        urn = ref.actor_urn
        self.in_flight.sent(urn)
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            self.in_flight.done(urn)
            return False
        return True

    def ref_of(self, name: str) -> tuple[pykka.ActorRef[Any], bool]:
        """A child's current ref, and whether it is down waiting for its restart."""
        with self._lock:
            return self._refs[name], name in self._waiting

    def children(self) -> dict[str, pykka.ActorRef[Any]]:
        """Each child's name and its current ref, in order of start."""
        with self._lock:
            return {n: self._refs[n] for n in self._order if n in self._refs}

    def restarts(self) -> dict[str, int]:
        """How many times each child restarted, those that did."""
        with self._lock:
            return {n: s.total_restarts for n, s in self._specs.items() if s.total_restarts}

    # ---- deaths and restarts --------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """Make a child die as a crash would, at its next message (the chaos API)."""
        with self._lock:
            ref = self._refs.get(name)
            if ref is None:
                raise KeyError(f"no child is named {name}")
            self._killed.add(ref.actor_urn)
        self.tell(name, Crash())

    def killed(self, urn: str) -> bool:
        """Whether an actor instance was killed through the chaos API."""
        return urn in self._killed

    def exited(self, message: ChildExited) -> None:
        """A child stopped: the supervisor's own mailbox decides what follows."""
        if not self.stopping:
            self.in_flight.sent(self.ref.actor_urn)
            self.ref.tell(message)

    def notice_dead(self) -> None:
        """A child whose thread is gone without a word is handled as one that stopped."""
        with self._lock:
            gone = [(n, ref) for n, ref in self._refs.items() if n not in self._waiting and not ref.is_alive()]
        for name, ref in gone:
            self.exited(ChildExited(name, ref.actor_urn, failed=True, why="its thread is gone"))

    def _on_exit(self, message: ChildExited) -> None:
        """One-for-one: restart the child that stopped after its backoff, unless past the restart intensity."""
        with self._lock:
            ref = self._refs.get(message.name)
            spec = self._specs.get(message.name)
            stale = ref is None or ref.actor_urn != message.urn or message.name in self._waiting
            if self.stopping or spec is None or stale:
                return
            self.in_flight.forget(message.urn)
            self._killed.discard(message.urn)
            self._waiting.add(message.name)
            delay = spec.restarted(time.monotonic(), self.config)
            if delay is None:
                why = (f"{message.name} stopped {len(spec.restarts)} times within {self.config.restart_period:g} s "
                       f"(last: {message.why}); the supervisor stops")
                log.error("%s", why)
                threading.Thread(target=self.stop, args=(10.0, why), daemon=True).start()
                return
        self._on_exited(message.name)
        self._on_restart(message.name.split(":", 1)[0])
        log.info("%s %s; restarting it in %.2f s", message.name, "crashed" if message.failed else "stopped", delay)
        # Counted in flight from now until the restarted child was told to resynchronise.
        self.in_flight.sent("restart:" + message.name)
        timer = threading.Timer(delay, self._restart_due, args=(message.name,))
        timer.daemon = True
        timer.start()

    def _restart_due(self, name: str) -> None:
        if self.ref.is_alive() and not self.stopping:
            self.ref.tell(Restart(name))
        else:
            self.in_flight.done("restart:" + name)

    def _restart(self, name: str) -> None:
        try:
            with self._lock:
                spec = self._specs.get(name)
                restarted = spec is not None and not self.stopping
                if spec is not None and restarted:
                    self._refs[name] = spec.start()
                    self._waiting.discard(name)
            if restarted:
                self._on_started(name)
        finally:
            self.in_flight.done("restart:" + name)

    # ---- stopping -------------------------------------------------------------------------------------------

    def stop(self, timeout: float = 10.0, why: str = "") -> bool:
        """Stop every child in reverse order of start, each within `timeout`, then `failed` says why ("": asked to).
        A stop asked while another is under way returns False once that one is done (it is bounded by its own
        timeouts: the giving up's reason stands)."""
        with self._lock:
            first, self.stopping = not self.stopping, True
            refs = [self._refs[n] for n in reversed(self._order) if n in self._refs]
        if not first:
            futures.wait([self.failed])
            return False
        try:
            for ref in refs:
                stop_actor(ref, timeout)
            # Its own mailbox last, off its thread: `_on_exit` gives up on a thread of its own.
            stop_actor(self.ref, timeout)
        finally:
            if not self.failed.done():
                self.failed.set_result(why)
        return True

