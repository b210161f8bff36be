"""The supervisor: spawns and restarts the seat's actors, and routes every bus change to the actors it wakes.

pykka has no supervision, so this adds what an OTP supervisor gives (design.md, "Supervision"): a child spec per
child, one-for-one restarts with exponential backoff, a restart intensity past which every child is stopped in
reverse order and the owner is told, and death noticed however it comes. A restarted child resynchronises from the
bus, never from memory. Usable from a larger runtime: it can run on the host's NATS connection and event loop,
stops only its own actors, installs no signal handler and configures no logging.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pykka
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from mesh_provisioner.actors.asker import AskerActor
from mesh_provisioner.actors.base import InFlight
from mesh_provisioner.actors.bound import BoundActor
from mesh_provisioner.actors.node import NodeActor
from mesh_provisioner.bus.asks import Asks
from mesh_provisioner.bus.attachment import Attachment
from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import closed_for_good, config_buckets_wait, ensure_config_buckets
from mesh_provisioner.bus.link import link
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.store import Applied, Store
from mesh_provisioner.config import Config
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import (
    Changed,
    ChildExited,
    ComposeNode,
    Crash,
    Decided,
    Look,
    Message,
    Rejudge,
    Restart,
    Resync,
    SeatStatus,
    Status,
    Stop,
)
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.metrics import Metrics
from mesh_provisioner.rules.keys import is_token
from mesh_provisioner.rules.retire import retire_needs
from mesh_provisioner.rules.signature import make_verify
from mesh_provisioner.rules.view import Entry, MemoryView
from mesh_provisioner.rules.wakes import known_nodes, woken_by

log = logging.getLogger("mesh_provisioner.supervisor")

ASKER = "asker"
# JetStream's advisory of a stream created: the router's, which takes asks, may be one (contract 5.4).
STREAM_CREATED = "$JS.EVENT.ADVISORY.STREAM.CREATED.*"


@dataclass
class ChildSpec:
    """How to start one child, and its restarts so far."""

    name: str
    start: Callable[[], pykka.ActorRef[Any]]
    restarts: deque[float] = field(default_factory=deque)
    total_restarts: int = 0


class SupervisorFailed(RuntimeError):
    """A child restarted more often than the restart intensity allows: the supervisor stopped."""


class Supervisor:
    """One seat: its bus, its children, and the API a host, a test or a chaos tool uses."""

    attachment: Attachment  # its client and loop, own or a host's (set by `start`)

    def __init__(
        self, config: Config, loop: EventLoopThread, nc: Client, *, owns_nc: bool, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.loop = loop
        self.nc = nc
        self.owns_nc = owns_nc
        self.in_flight = InFlight()
        self.metrics = metrics or Metrics()
        self.metrics.cache_keys.set_function(lambda: len(self.cache.view))
        self.cache = Cache(nc, bound_reads=config.bound_reads, on_change=self._changed, on_resync=self._resynced,
                           request_timeout=config.request_timeout)
        self.store = Store(nc, self.cache, timeout=config.request_timeout)
        self.asks = Asks(nc, timeout=config.request_timeout)
        self._lock = threading.RLock()
        self._specs: dict[str, ChildSpec] = {}
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._order: list[str] = []
        self._waiting: set[str] = set()  # children dead and waiting for their restart
        self._killed: set[str] = set()  # urns of instances killed through the chaos API
        self._stopping = False
        # Changes are routed only once the children run: each resyncs at start with what was loaded before.
        self._routing = False
        self.failed: Future[str] = Future()
        self._parallel = threading.BoundedSemaphore(config.max_parallel) if config.max_parallel > 0 else None
        self._clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        # It answers only its router: a warrant is taken only with its valid signature.
        self._verify = make_verify(config.router_key) if config.router_key else None
        self._subs: list[Subscription] = []  # on the connection, for the router: dropped when this stops
        link(nc).on_closed(self._connection_closed)
        self.ref = _SupervisorActor.start(self)

    # ---- starting and stopping ------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        config: Config,
        *,
        nc: Client | None = None,
        loop: Any = None,
        clock: Callable[[], datetime] | None = None,
        guard: Callable[[], str] | None = None,
        metrics: Metrics | None = None,
    ) -> Supervisor:
        """Connect (or take the host's connection and loop), fill the cache, and start every child.

        `nc` comes with the `loop` that runs it, or is refused at once; `bus/attachment.py` says what each makes
        and what `stop` undoes. `guard` says why this process may not write now ("" when it may): the seat's
        lease (contract 8).
        """
        attached = Attachment.open(config, nc=nc, loop=loop)
        thread, nc = attached.loop, attached.nc
        try:
            sup = cls(config, thread, nc, owns_nc=attached.owns_nc, metrics=metrics)
        except BaseException:
            attached.close(config.request_timeout)
            raise
        sup.attachment = attached
        if clock is not None:
            sup._clock = clock
        sup.store.guard = guard
        try:
            thread.run(ensure_config_buckets(nc, config), config_buckets_wait(config))
            thread.run(sup.cache.start(), config.request_timeout)
            thread.run(sup.cache.wait_synced(), config.request_timeout * 6)
            sup._retire_needs()
            sup._subs.append(thread.run(sup.asks.subscribe_decided(sup._decided), config.request_timeout))
            sup._subs.append(thread.run(nc.subscribe(STREAM_CREATED, cb=sup._stream_created), config.request_timeout))
            sup._start_children()
        except BaseException:
            sup.stop()
            raise
        return sup

    def _retire_needs(self) -> None:
        """`needs` is retired: every key of it is deleted when the seat starts (section 4)."""
        writes = retire_needs(self.view)
        if writes:
            self.apply(writes)
            log.info("deleted %d key(s) of the retired needs", len(writes))

    def _start_children(self) -> None:
        """Start every child, then route changes, then tell each to resynchronise.

        All are started before any works: a thread started while others compose waits for the interpreter lock
        at every step of its start, so starting a thousand node actors among compositions takes many seconds.
        Changes are routed before the first resync, so no write of a composition wakes nothing.
        """
        started = [ASKER]
        self._spec(ASKER, lambda: AskerActor.start(self, self.in_flight, retries=self.config.conflict_retries),
                   resync=False)
        for provider in self.config.bound_reads:
            started.append(f"bound:{provider}")
            self._spec(
                f"bound:{provider}",
                partial(BoundActor.start, provider, self, self.in_flight, retries=self.config.conflict_retries),
                resync=False,
            )
        for node in sorted(known_nodes(self.view)):
            started.append(self._node(node, resync=False))
        self._routing = True
        for name in started:
            self._resync(name)
        for node in sorted(known_nodes(self.view)):  # a node that appeared while the others started
            self._node(node)

    def _node(self, node: str, *, resync: bool = True) -> str:
        """The name of a node's actor, started (and told to resynchronise, unless not `resync`) when it has none."""
        name = f"node:{node}"
        if name in self._specs:
            # The common case, on the loop for each change: no lock, which an actor thread may hold while it
            # waits for the interpreter.
            return name
        with self._lock:
            if name not in self._specs and not self._stopping:
                self._spec(
                    name,
                    lambda: NodeActor.start(
                        node, self, self.in_flight, retries=self.config.conflict_retries, parallel=self._parallel
                    ),
                    resync=resync,
                )
        return name

    def _spec(self, name: str, start: Callable[[], pykka.ActorRef[Any]], *, resync: bool = True) -> None:
        with self._lock:
            self._specs[name] = ChildSpec(name, start)
            self._order.append(name)
            self._refs[name] = start()
        if resync:
            self._resync(name)

    def _resync(self, name: str) -> None:
        """A started child (a restarted one too) judges all it owns from the bus, never from memory.

        The supervisor tells it, so the message is counted in flight before `start` returns to anyone waiting.
        """
        self.tell(name, Resync())

    def stop(self, timeout: float = 10.0) -> None:
        """Stop this supervisor's own actors, in reverse order of start, and its connection if it made it."""
        self._shut_down(timeout, why="")

    def _shut_down(self, timeout: float, why: str) -> None:
        """Stop every child in reverse order and the connection this made; then `failed` says why ("": asked to)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            refs = [self._refs[n] for n in reversed(self._order) if n in self._refs]
        for ref in refs:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                ref.stop(block=True, timeout=timeout)
        if self.ref.is_alive():
            self.ref.stop(block=False)
        link(self.nc).remove_listener(self._connection_closed)
        try:
            self.loop.run(self.cache.stop(), timeout)
        except Exception as err:  # the bus may be gone already: the actors are stopped, which is what counts
            log.debug("the cache did not stop cleanly: %s", err)
        # On a host's connection nothing of this seat stays subscribed: a seat started again on it (a standby
        # taking the lease back) would hear the router twice, and this one would be kept alive.
        self.attachment.close(timeout, self._subs)
        if not self.failed.done():
            self.failed.set_result(why)

    # ---- the seat the actors work in ------------------------------------------------------------------------

    @property
    def view(self) -> MemoryView:
        """The cache the rules read."""
        return self.cache.view

    def apply(self, writes: list[Write]) -> Applied:
        """Apply writes by compare-and-set on the bus, in order, stopping at the first conflict."""
        applied = self.loop.run(self.store.apply(writes), self.config.work_timeout)
        self.metrics.observe_writes((w.state for w, _ in applied.done), applied.conflict is not None)
        return applied

    def refresh(self, write: Write) -> bool:
        """Read a conflicting key's current value from the bus into the cache; False when the bus did not answer."""
        return self.loop.run(self.cache.refresh(write.state, write.key), self.config.work_timeout)

    def now(self) -> datetime:
        """The time writes are stamped with."""
        return self._clock()

    def publish(self, ask: r.Ask) -> None:
        """Publish an ask on the operator's channel, de-duplicated by its id."""
        self.loop.run(self.asks.publish(ask), self.config.work_timeout)

    def verify(self, warrant: r.Warrant | Mapping[str, Any]) -> str:
        """Why a warrant's signature is refused; with no router key configured, none is required."""
        return self._verify(warrant) if self._verify is not None else ""

    def retry(self, name: str, message: Message, attempt: int) -> None:
        """Tell a child a message again after a backoff (50 ms doubling to 5 s, as restarts), counted in flight."""
        delay = min(self.config.backoff_first * 2 ** (attempt - 1), self.config.backoff_max)
        token = f"retry:{name}:{id(message)}"
        self.in_flight.sent(token)
        log.info("%s tries its failed write again in %.2f s", name, delay)

        def due() -> None:
            try:
                if not self._stopping:
                    self.tell(name, message)
            finally:
                self.in_flight.done(token)

        timer = threading.Timer(delay, due)
        timer.daemon = True
        timer.start()

    def killed(self, urn: str) -> bool:
        """Whether an actor instance was killed through the chaos API."""
        return urn in self._killed

    def tell(self, name: str, message: Message) -> None:
        """Tell a child by name, counting the message as in flight; a dead child's restart resyncs instead."""
        # No lock: called on the loop for each change, it must not wait for an actor thread. A child that dies
        # meanwhile is forgotten by `in_flight`, which then counts nothing for it (its successor resyncs).
        ref = self._refs.get(name)
        if ref is None or name in self._waiting:
            return
        urn = ref.actor_urn
        self.in_flight.sent(urn)
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            self.in_flight.done(urn)

    def exited(self, message: ChildExited) -> None:
        """A child stopped: the supervisor actor decides what follows."""
        if not self._stopping:
            self.in_flight.sent(self.ref.actor_urn)
            self.ref.tell(message)

    # ---- routing (contract section 6) -----------------------------------------------------------------------

    def _changed(self, state: str, key: str, old: Entry | None, new: Entry | None, ours: bool) -> None:
        """Route one change of the cache (`ours`: the seat's own write) to every actor it wakes. Runs on the event
        loop: it never blocks."""
        if self._stopping or not self._routing:
            return
        woken = woken_by(self.view, state, key, old, new, another_writer=not ours)
        at = time.monotonic()
        changed = Changed(at, state, key, new.revision) if new is not None else Changed(at)
        for node in woken.nodes:
            if not is_token(node):
                # Section 7: a key whose node is not a token is bad input; it gets no actor of its own, as at start.
                log.warning("%s %s names no node (%r is not a token): nothing is composed for it", state, key, node)
                continue
            self.tell(self._node(node), changed)
        if woken.keys:
            # The keys one change wakes are judged together, in one batch of writes, by one actor where they can be:
            # a provider's bound actor, or the node actor `judged_on` names. Writes are compare-and-set, so the actor
            # need not own them (design.md, "Parallel, not shared"). A shared credential's change told each of its
            # dependents' hundreds of node actors instead: each woke, took the interpreter from the bus loop and
            # waited on it for one write, and the loop fell half a second behind.
            if state.endswith(".bound"):
                self.tell(f"bound:{state.removesuffix('.bound')}", Rejudge(woken.keys, at))
            elif is_token(woken.judged_on):
                self.tell(self._node(woken.judged_on), Rejudge(woken.keys, at))
            else:
                by_node: dict[str, set[str]] = {}
                for k in woken.keys:
                    by_node.setdefault(k.split(".", 1)[0], set()).add(k)
                for node, keys in by_node.items():
                    if is_token(node):
                        self.tell(self._node(node), Rejudge(frozenset(keys), at))
        if woken.decide:
            self.tell(ASKER, Look(woken.decide))

    async def _stream_created(self, msg: Msg) -> None:
        """A stream was created: if it is the router's, the asks not published for want of one go out now (5.4).

        An ask that found no stream to take it is otherwise published only at its key's next change.
        """
        self._decided()

    def _decided(self) -> None:
        self.tell(ASKER, Decided())

    def _resynced(self) -> None:
        """After the connection came back and the cache caught up: every child judges all it owns again."""
        log.info("the bus is back: every actor resynchronises")
        with self._lock:
            names = list(self._refs)
        for name in names:
            self.tell(name, Resync())

    # ---- supervision ----------------------------------------------------------------------------------------

    def _on_exit(self, message: ChildExited) -> None:
        """One-for-one: restart the child that stopped after its backoff, unless past the restart intensity."""
        with self._lock:
            ref = self._refs.get(message.name)
            spec = self._specs.get(message.name)
            stale = ref is None or ref.actor_urn != message.urn or message.name in self._waiting
            if self._stopping or spec is None or stale:
                return
            self.in_flight.forget(message.urn)
            self._killed.discard(message.urn)
            self._waiting.add(message.name)
            now = time.monotonic()
            while spec.restarts and spec.restarts[0] < now - self.config.restart_period:
                spec.restarts.popleft()
            spec.restarts.append(now)
            spec.total_restarts += 1
            self.metrics.restarts.labels(message.name.split(":", 1)[0]).inc()
            if len(spec.restarts) > self.config.restart_intensity:
                why = (
                    f"{message.name} stopped {len(spec.restarts)} times within {self.config.restart_period:g} s "
                    f"(last: {message.why}); the supervisor stops"
                )
                log.error("%s", why)
                threading.Thread(target=self._fail, args=(why,), daemon=True).start()
                return
            delay = min(self.config.backoff_first * 2 ** (len(spec.restarts) - 1), self.config.backoff_max)
        log.info("%s %s; restarting it in %.2f s", message.name, "crashed" if message.failed else "stopped", delay)
        self.in_flight.sent("restart:" + message.name)
        timer = threading.Timer(delay, self._restart_due, args=(message.name,))
        timer.daemon = True
        timer.start()

    def _restart_due(self, name: str) -> None:
        if self.ref.is_alive() and not self._stopping:
            self.ref.tell(Restart(name))
        else:
            self.in_flight.done("restart:" + name)

    def _restart(self, name: str) -> None:
        with self._lock:
            spec = self._specs.get(name)
            restarted = spec is not None and not self._stopping
            if spec is not None and restarted:
                self._refs[name] = spec.start()
                self._waiting.discard(name)
        if restarted:
            self._resync(name)
        self.in_flight.done("restart:" + name)

    def _connection_closed(self) -> None:
        """The connection is closed for good, and not by this supervisor's stop: no write can land and no change
        come any more, so the supervisor fails as past its restart intensity, and its owner is told why."""
        if self._stopping:
            return
        why = f"{closed_for_good(self.nc) or 'the NATS connection is closed for good'}; the supervisor stops"
        log.error("%s", why)
        threading.Thread(target=self._fail, args=(why,), daemon=True).start()

    def _fail(self, why: str) -> None:
        """Past the restart intensity: stop every child, then tell the owner why (a plain stop would say "")."""
        self._shut_down(10.0, why=why)

    # ---- the API of hosts, tests and chaos tools ------------------------------------------------------------

    def compose(self, node: str) -> pykka.Future[r.Composed]:
        """Compose a node now; answers a future of its `Composed`."""
        name = self._node(node)
        with self._lock:
            ref = self._refs[name]
            # A child down and waiting for its restart answers ActorDeadError: nothing of it is in flight (its
            # restart composes the node anyway), and counting it would keep `wait_settled` waiting for ever.
            if name not in self._waiting:
                self.in_flight.sent(ref.actor_urn)
        return ref.ask(ComposeNode(node), block=False)

    def children(self) -> dict[str, pykka.ActorRef[Any]]:
        """Each child's name (`node:<node>`, `bound:<provider>`, `asker`) and its current ref."""
        with self._lock:
            return {n: self._refs[n] for n in self._order if n in self._refs}

    def kill(self, name: str) -> None:
        """Make a child die as a crash would, at its next message; the supervisor restarts it."""
        with self._lock:
            ref = self._refs.get(name)
            if ref is None:
                raise KeyError(f"no child is named {name}")
            self._killed.add(ref.actor_urn)
        self.tell(name, Crash())

    def wait_settled(self, timeout: float = 30.0) -> bool:
        """True once every change on the bus has reached the cache, every mailbox is empty and no write pends."""
        deadline = time.monotonic() + timeout
        calm = 0
        while time.monotonic() < deadline and not self._stopping:
            self._notice_dead()
            left = deadline - time.monotonic()
            if not self.in_flight.wait_idle(max(left, 0)):
                return False
            try:
                caught_up = self.loop.run(self.cache.caught_up(), max(deadline - time.monotonic(), 0.1))
            except TimeoutError:
                return False  # the bus did not answer by the deadline (a paused or dead server): not settled
            calm = calm + 1 if caught_up and self.in_flight.total() == 0 else 0
            if calm >= 2:
                return True
        return False

    def _notice_dead(self) -> None:
        """A child whose thread is gone without a word is handled as one that stopped."""
        with self._lock:
            gone = [(n, ref) for n, ref in self._refs.items() if n not in self._waiting and not ref.is_alive()]
        for name, ref in gone:
            self.exited(ChildExited(name, ref.actor_urn, failed=True, why="its thread is gone"))

    def status(self) -> SeatStatus:
        """The children, their restarts, and whether the supervisor failed."""
        with self._lock:
            children = {n: self._refs[n].is_alive() for n in self._order if n in self._refs}
            restarts = {n: s.total_restarts for n, s in self._specs.items() if s.total_restarts}
        failed = self.failed.result() if self.failed.done() else ""
        return SeatStatus(children, restarts, failed, self.in_flight.total())


class _SupervisorActor(pykka.ThreadingActor):
    """The supervisor's own mailbox: child exits and restarts in order, and a host's `ComposeNode`, `Status`, `Stop`."""

    def __init__(self, sup: Supervisor) -> None:
        super().__init__()
        self.sup = sup

    def on_receive(self, message: Any) -> Any:
        """Handle one message; counted in flight when it came from a child."""
        try:
            if isinstance(message, ChildExited):
                self.sup._on_exit(message)
            elif isinstance(message, Restart):
                self.sup._restart(message.name)
            elif isinstance(message, ComposeNode):
                return self.sup.compose(message.node).get(timeout=self.sup.config.request_timeout * 6)
            elif isinstance(message, Status):
                return self.sup.status()
            elif isinstance(message, Stop):
                threading.Thread(target=self.sup.stop, daemon=True).start()
            return None
        finally:
            if isinstance(message, ChildExited):
                self.sup.in_flight.done(self.actor_urn)
