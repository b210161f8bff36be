"""The runtime: the one seat object that `serve`, `reconcile`, `demo`, the chaos tests and embedders start, wait on
and stop (design.md, "The shape").

It joins the three parts of the seat: the bus (the watched cache, compare-and-set writes, the operator's channel),
the dispatcher (actors/dispatch.py: each change of the cache wakes the judgments whose last reads it touched) and
the supervisor (supervisor.py: the actors, started and restarted). The actors work through it: it is their `Workplace`
(actors/base.py). Usable from a larger runtime: it can run on the host's NATS connection and event loop, stops only
its own actors, installs no signal handler and configures no logging, and answers a host's actors' `ComposeNode`,
`Status` and `Stop` at `ref`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from concurrent.futures import Future
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pykka
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from mesh_provisioner.actors.asker import AskerActor
from mesh_provisioner.actors.base import InFlight, stop_actor
from mesh_provisioner.actors.bound import BoundActor
from mesh_provisioner.actors.dispatch import Dispatcher, Judgment
from mesh_provisioner.actors.host import HostActor
from mesh_provisioner.actors.node import NodeActor
from mesh_provisioner.actors.routing import ASKER, Router
from mesh_provisioner.actors.turns import Turns
from mesh_provisioner.backoff import backoff
from mesh_provisioner.bus.asks import Asks
from mesh_provisioner.bus.attachment import Attachment
from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import STREAM_CREATED, closed_for_good, config_buckets_wait, ensure_config_buckets
from mesh_provisioner.bus.link import link
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.registry import RegistryWriter
from mesh_provisioner.bus.store import Applied, Store
from mesh_provisioner.bus.unanswered import Unanswered
from mesh_provisioner.config import Config
from mesh_provisioner.contract import NEEDS, REGISTRY
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.protocol import (
    ChildExited,
    ComposeNode,
    Decided,
    Message,
    Resync,
    SeatStatus,
    Tick,
)
from mesh_provisioner.messages.writes import Put, Write
from mesh_provisioner.metrics import Metrics
from mesh_provisioner.rules.kept import Kept, kept_states
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.order import providers_first
from mesh_provisioner.rules.reads import Reads, known_nodes
from mesh_provisioner.rules.retire import retire_needs
from mesh_provisioner.rules.signature import make_verify
from mesh_provisioner.rules.view import Entry, not_nodes
from mesh_provisioner.supervisor import Supervisor

log = logging.getLogger("mesh_provisioner.runtime")


class Runtime:
    """One seat: its bus, its dispatcher, its supervised actors, and the API a host, a test or a chaos tool uses."""

    attachment: Attachment  # its client and loop, own or a host's (set by `start`)

    def __init__(
        self, config: Config, loop: EventLoopThread, nc: Client, *, owns_nc: bool, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.loop = loop
        self.nc = nc
        self.owns_nc = owns_nc
        self.in_flight = InFlight()
        self.dispatcher = Dispatcher(self._kick)
        self.router = Router(self.dispatcher, lambda: self.cache.view, config.bound_reads)
        self.metrics = metrics or Metrics()
        self.metrics.cache_keys.set_function(lambda: len(self.cache.view))
        self.metrics.count_tasks("bus", loop.loop)  # the seat's loop, or the host's it runs on
        self.cache = Cache(nc, bound_reads=config.bound_reads, on_change=self._changed, on_resync=self._resynced,
                           request_timeout=config.request_timeout)
        self.store = Store(nc, self.cache, timeout=config.request_timeout)
        self.asks = Asks(nc, timeout=config.request_timeout)
        self.supervisor = Supervisor(
            config, self.in_flight, on_started=self._started, on_exited=self.dispatcher.release,
            on_restart=lambda kind: self.metrics.restarts.labels(kind).inc(),
        )
        # Why the seat stopped ("": asked to), once all of it has: its actors, and its bus.
        self.failed: Future[str] = Future()
        self.supervisor.failed.add_done_callback(self._gave_up)
        # Changes are routed only once the children run: each resyncs at start with what was loaded before.
        self._routing = False
        self._turns = Turns(config.max_parallel) if config.max_parallel > 0 else None
        self._priority: dict[str, int] = {}  # each node's place in the order of composing (rules/order.py)
        self._node_lock = threading.Lock()
        self._clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        # It answers only its router: a warrant is taken only with its valid signature.
        self._verify = make_verify(config.router_key) if config.router_key else None
        self._subs: list[Subscription] = []  # on the connection, for the router: dropped when this stops
        self._registry: RegistryWriter | None = None  # the operator's registry file, read when the seat is taken
        self._registry_done = False  # written (and the needs retired) once this holds the shard that writes them
        self.writes_on: Callable[[str], bool] | None = None  # the nodes this seat composes; None: all (`scope`)
        # The states a partitioned seat keeps only some keys of, by the nodes it holds (`scope`, rules/kept.py).
        self._by_node = kept_states(config.bound_reads)
        self._kept: Kept | None = None  # what memory keeps of them (`scope`); None: everything
        self._closed = False
        link(nc).on_closed(self._connection_closed)
        self.ref = HostActor.start(self)

    # ---- starting and stopping ------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        config: Config,
        *,
        nc: Client | None = None,
        loop: Any = None,
        clock: Callable[[], datetime] | None = None,
        guard: Callable[[Write], str] | None = None,
        unanswered: Unanswered | None = None,
        owns: Callable[[str], bool] | None = None,
        holds: Callable[[str], bool] | None = None,
        metrics: Metrics | None = None,
        within: float | None = None,
        abandon: Callable[[], bool] | None = None,
    ) -> Runtime:
        """Connect (or take the host's connection and loop), fill the cache, and start every actor.

        `nc` comes with the `loop` that runs it, or is refused at once; `bus/attachment.py` says what each makes and
        what `stop` undoes. `guard` says why this process may not make a write now ("" when it may): the seat's lease
        (contract 8), or its key's shard's (8.1); `unanswered` counts the writes sent under it and not yet answered,
        which a lease given back waits for (bus/unanswered.py). `owns` says which nodes this process composes, a
        partitioned seat's (8.1); None: every node. `holds` says the nodes whose judgments' reads memory keeps
        (rules/kept.py; default: those it composes); a node held and not yet composed is handed over by `took`.
        The cache's first load is waited for as long as it makes headway (`Config.load_stall`), `within` seconds at
        most when given: TimeoutError past either; and until `abandon` answers True (the holding ended meanwhile: a
        stop, a lease lost), `Abandoned` then raised.
        """
        attached = Attachment.open(config, nc=nc, loop=loop)
        thread, nc = attached.loop, attached.nc
        try:
            seat = cls(config, thread, nc, owns_nc=attached.owns_nc, metrics=metrics)
        except BaseException:
            attached.close(config.request_timeout)
            raise
        seat.attachment = attached
        if clock is not None:
            seat._clock = clock
        seat.store.guard, seat.store.unanswered = guard, unanswered
        seat.scope(owns, holds)
        try:
            thread.run(ensure_config_buckets(nc, config), config_buckets_wait(config))
            thread.run(seat.cache.start(), config.request_timeout)
            # However long a large mesh's load takes while it makes headway: given up only once it makes none.
            thread.run(seat.cache.wait_loaded(stall=config.load_stall), within, abandon=abandon)
            seat._first_shard()
            for key in not_nodes(seat.view):
                seat.router.no_node(key)
            seat._subs.append(thread.run(seat.asks.subscribe_decided(seat._decided), config.request_timeout))
            seat._subs.append(thread.run(nc.subscribe(STREAM_CREATED, cb=seat._stream_created),
                                         config.request_timeout))
            seat._start_actors()
        except BaseException:
            seat.stop()
            raise
        return seat

    def scope(self, owns: Callable[[str], bool] | None, holds: Callable[[str], bool] | None = None) -> None:
        """Compose only the nodes `owns` says (a partitioned seat's shards, contract 8.1), and keep in memory only
        what the judgments of the nodes `holds` says (default: `owns`) read (rules/kept.py); None: every node."""
        self.writes_on = owns
        self.router.writes_on = owns
        self.dispatcher.scope = None if owns is None else (lambda j: owns(j[1].partition(".")[0]))
        holds = holds or owns
        self.cache.memory.keeping = self._kept = None if holds is None else Kept(self.view, holds)

    def holds_all(self, state: str, node: str = "") -> bool:
        """Whether memory holds every key of a state, or of a node's when `node` is given (a partitioned seat keeps
        all of the nodes it composes, read once taken, and of others only what their judgments read: rules/kept.py)."""
        owns = self.writes_on
        return self._kept is None or state not in self._by_node or (bool(node) and owns is not None and owns(node))

    def took(
        self, nodes: Callable[[str], bool], ready: Callable[[], None] = lambda: None, *,
        abandon: Callable[[], bool] | None = None,
    ) -> None:
        """Shards were taken (contract 8.1): what is kept of their nodes is read again (what came before they were
        taken was not kept), `ready` is told so (from then on `owns` says their nodes: composed before, they would be
        judged from what memory missed and written wrong), then the nodes `nodes` says are composed and their keys
        judged from the bus, as a restart would; the registry and the retired needs are written when the first shard
        is among them. Reading them again is waited for while it makes headway (TimeoutError once it makes none for
        `Config.load_stall`): some 4 million provisions at 100,000 nodes take minutes. Once `abandon` answers True
        (the holding ended meanwhile), the read is cancelled and `Abandoned` raised, nothing handed over."""
        if self.writes_on is not None:
            self.loop.run(self.cache.reload(self._by_node, stall=self.config.load_stall), None, abandon=abandon)
        ready()
        self._first_shard()
        for name in self.supervisor.children():
            if not name.startswith("node:"):
                self.tell(name, Resync())
        for node in sorted(known_nodes(self.view)):
            if nodes(node):
                name = f"node:{node}"
                if self.supervisor.has(name):
                    self.tell(name, Resync())
                else:
                    self._node(node)

    def gave(self) -> None:
        """Shards were given back, lapsed or lost (contract 8.1): memory lets go of what only their nodes' judgments
        read (rules/kept.py), so that a process holding half the shards keeps about what one started with them would.
        Their nodes are not composed any more (`owns`); taken again, they are read again (`took`)."""
        if self._kept is None:
            return
        try:
            dropped = self.loop.run(self.cache.let_go(self._by_node), self.config.request_timeout * 6)
        except TimeoutError as err:  # only memory is saved: what is left goes as its keys change
            log.warning("memory did not let go of what no judgment of this process reads any more: %s", err)
            return
        log.info("memory let go of %d key(s) no judgment of this process reads any more", dropped)

    def _first_shard(self) -> None:
        """The registry and the retired needs, written by the holder of shard 0 alone (contract 8.1), once a holding."""
        if self._registry_done or not self._may_write(NEEDS):
            return
        self._registry_done = True
        self._retire_needs()
        if self.config.registry:  # no file: the registry is left as it is (4.1)
            self._registry = RegistryWriter(self.config.registry, self.store, self.view)
            self.loop.run(self._registry.write(), self.config.work_timeout)

    def _may_write(self, state: str) -> bool:
        """Whether the guard lets a write of a state through now (its shard's lease held, 8.1)."""
        guard = self.store.guard
        return guard is None or not guard(Put(state, "default", b"", 0))

    def _retire_needs(self) -> None:
        """`needs` is retired: every key of it is deleted when the seat is taken, and the count logged (4.1)."""
        writes = retire_needs(self.view)
        if writes:
            applied = self.apply(writes, {})
            log.info("deleted %d key(s) of the retired needs", len(applied.done))
            if not applied.ok:
                log.warning("the retired needs are not all deleted: %s", applied.error)

    def _start_actors(self) -> None:
        """Start every actor, then route changes, then tell each to resynchronise.

        All are started before any works: a thread started while others compose waits for the interpreter lock
        at every step of its start, so starting a thousand node actors among compositions takes many seconds.
        Changes are routed before the first resync, so no write of a composition wakes nothing. Nodes start in the
        order they compose in (rules/order.py).
        """
        retries = self.config.conflict_retries
        started = [ASKER]
        self.supervisor.add(ASKER, lambda: AskerActor.start(self, self.in_flight, retries=retries), started=False)
        for provider in self.config.bound_reads:
            started.append(f"bound:{provider}")
            self.supervisor.add(f"bound:{provider}", partial(BoundActor.start, provider, self, self.in_flight,
                                                               retries=retries), started=False)
        owns = self.writes_on or (lambda _: True)
        order = providers_first(self.view, {n for n in known_nodes(self.view) if owns(n)})
        self._priority = {node: i for i, node in enumerate(order)}
        for node in order:
            started.append(self._node(node, started=False))
        self._routing = True
        for name in started:
            self._started(name)
        for node in sorted(known_nodes(self.view)):  # a node that appeared while the others started
            if owns(node):
                self._node(node)

    def _node(self, node: str, *, started: bool = True) -> str:
        """The name of a node's actor, started (and told to resynchronise, unless not `started`) when it has none."""
        name = f"node:{node}"
        if self.supervisor.has(name):
            return name  # the common case, on the loop for each change: no lock
        with self._node_lock:
            self.supervisor.add(name, lambda: NodeActor.start(
                node, self, self.in_flight, retries=self.config.conflict_retries, turns=self._turns,
                priority=self._priority.get(node, len(self._priority)),
            ), started=started)
        return name

    def _started(self, name: str) -> None:
        """A started actor (a restarted one too) judges all it owns from the bus, never from memory, and hears of
        what waits for it. Told here, so the message is counted in flight before `start` returns to anyone waiting."""
        self.supervisor.tell(name, Resync())
        self.dispatcher.restarted(name)

    def _gave_up(self, failed: Future[str]) -> None:
        """The supervisor gave up (past its restart intensity): the bus is let go too, off the thread that said so."""
        if failed.result() and not self._closed:  # closed: the runtime's own stop said why, and lets the bus go
            threading.Thread(target=self._shut_down, args=(10.0, failed.result()), daemon=True).start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop this seat's own actors, in reverse order of start, and its connection if it made it; each within
        `timeout`. Returns once the seat is stopped."""
        self._shut_down(timeout, why="")

    def _shut_down(self, timeout: float, why: str) -> None:
        """Stop every actor in reverse order and the connection this made; then `failed` says why ("": asked to).

        Once: a stop asked while another is under way (a host's `Stop`, the supervisor giving up, the connection
        closed for good) returns when that one has, which its own timeouts bound."""
        with self._node_lock:
            first, self._closed = not self._closed, True
        if not first:
            futures.wait([self.failed])
            return
        try:
            self.supervisor.stop(timeout, why)
            # Off its thread: a host's `Stop` is done on a thread of its own (actors/host.py).
            stop_actor(self.ref, timeout)
        finally:
            # The bus is let go whatever cut the actors' stop short (a signal's Interrupted, in a process's main
            # thread): a later stop only waits for this one.
            try:
                link(self.nc).remove_listener(self._connection_closed)
                try:
                    self.loop.run(self.cache.stop(), timeout)
                except Exception as err:  # the bus may be gone already: the actors are stopped, which is what counts
                    log.debug("the cache did not stop cleanly: %s", err)
                # On a host's connection nothing of this seat stays subscribed: a seat started again on it (a standby
                # taking the lease back) would hear the router twice, and this one would be kept alive.
                self.attachment.close(timeout, self._subs)
            finally:
                if not self.failed.done():
                    failed = self.supervisor.failed
                    self.failed.set_result(failed.result() if failed.done() else why)

    # ---- the seat the actors work in ------------------------------------------------------------------------

    @property
    def view(self) -> MemoryView:
        """The cache the rules read."""
        return self.cache.view

    def apply(self, writes: list[Write], writers: Mapping[tuple[str, str], Judgment]) -> Applied:
        """Apply writes by compare-and-set on the bus, in order, stopping at the first conflict; `writers` names the
        judgment that made each write, which the write does not wake."""
        self.dispatcher.writing(writers)
        try:
            applied = self.loop.run(self.store.apply(writes), self.config.work_timeout)
        finally:
            self.dispatcher.written(writers)
        self.metrics.observe_writes((w.state for w, _ in applied.done), applied.conflict is not None)
        return applied

    def refresh(self, write: Write) -> bool:
        """Read a conflicting key's current value from the bus into the cache; False when the bus did not answer."""
        return self.loop.run(self.cache.refresh(write.state, write.key), self.config.work_timeout)

    def now(self) -> datetime:
        """The time writes are stamped with."""
        return self._clock()

    def reads(self) -> Reads:
        """A view over the cache that records what a judgment reads, stamped with the changes it holds already."""
        memory = self.cache.memory
        # A C-level getter, not a lambda over the cache's property: it is read at each token a judgment first reads.
        return Reads(memory.view, memory.changes, partial(getattr, memory, "changes"))

    def publish(self, ask: r.Ask) -> bool:
        """Publish an ask on the operator's channel, de-duplicated by its id; answers whether it is out for the first
        time (False: JetStream kept the first, from this process or the one that held the seat before)."""
        ack = self.loop.run(self.asks.publish(ask), self.config.work_timeout)
        return not ack.duplicate

    def verify(self, warrant: r.Warrant | Mapping[str, Any]) -> str:
        """Why a warrant's signature is refused; with no router key configured, none is required."""
        return self._verify(warrant) if self._verify is not None else ""

    def retry(self, name: str, message: Message, attempt: int) -> None:
        """Tell an actor a message again after a backoff (as restarts back off), counted in flight meanwhile."""
        delay = backoff(attempt, self.config.backoff_first, self.config.backoff_max)
        log.info("%s tries its failed write again in %.2f s", name, delay)
        token = f"retry:{name}:{id(message)}"
        self.in_flight.sent(token)

        def due() -> None:
            try:
                if not self.supervisor.stopping:
                    self.tell(name, message)
            finally:
                self.in_flight.done(token)

        timer = threading.Timer(delay, due)
        timer.daemon = True
        timer.start()

    def killed(self, urn: str) -> bool:
        """Whether an actor instance was killed through the chaos API."""
        return self.supervisor.killed(urn)

    def tell(self, name: str, message: Message) -> bool:
        """Tell an actor by name, counting the message in flight; False when it cannot hear it now."""
        return self.supervisor.tell(name, message)

    def exited(self, message: ChildExited) -> None:
        """An actor stopped: its supervisor decides what follows."""
        self.supervisor.exited(message)

    def _kick(self, name: str) -> bool:
        """Tell an actor to take its queue; a node's actor is started when it has none."""
        if self.supervisor.stopping:
            return False
        if name.startswith("node:"):
            self._node(name.removeprefix("node:"), started=False)
        return self.tell(name, Tick())

    # ---- from changes to judgments (contract section 6) -----------------------------------------------------

    def _changed(self, state: str, key: str, old: Entry | None, new: Entry | None, ours: bool) -> None:
        """Wake every judgment that read what one change of the cache touched (`ours`: the seat's own write), and
        start the judgments a new node or key needs. Runs on the event loop: it never blocks."""
        if state == REGISTRY and not ours and self._registry is not None and not self.supervisor.stopping:
            again = self._registry.again()  # another writer changed it: the file's word goes back (4.1)
            if again is not None:
                self.in_flight.sent(REGISTRY)
                again.add_done_callback(lambda _: self.in_flight.done(REGISTRY))
        if self.supervisor.stopping or not self._routing:
            return
        self.router.changed(state, key, old, new, ours, self.cache.changes)

    async def _stream_created(self, msg: Msg) -> None:
        """A stream was created: if it is the router's, the asks not published for want of one go out now (5.4).

        An ask that found no stream to take it is otherwise published only at its key's next change.
        """
        self._decided()

    def _decided(self) -> None:
        self.tell(ASKER, Decided())

    def _resynced(self) -> None:
        """After the connection came back and the cache caught up: every actor judges all it owns again."""
        log.info("the bus is back: every actor resynchronises")
        for name in self.supervisor.children():
            self.tell(name, Resync())

    def _connection_closed(self) -> None:
        """The connection is closed for good, and not by this seat's stop: no write can land and no change come any
        more, so the seat fails as past its restart intensity, and its owner is told why."""
        if self.supervisor.stopping:
            return
        why = f"{closed_for_good(self.nc) or 'the NATS connection is closed for good'}; the supervisor stops"
        log.error("%s", why)
        threading.Thread(target=self._shut_down, args=(10.0, why), daemon=True).start()

    # ---- the API of hosts, tests and chaos tools ------------------------------------------------------------

    def compose(self, node: str) -> pykka.Future[r.Composed]:
        """Compose a node now; answers a future of its `Composed`."""
        ref, down = self.supervisor.ref_of(self._node(node))
        # A child down and waiting for its restart answers ActorDeadError: nothing of it is in flight (its restart
        # composes the node anyway), and counting it would keep `wait_settled` waiting for ever.
        if not down:
            self.in_flight.sent(ref.actor_urn)
        return ref.ask(ComposeNode(node), block=False)

    def children(self) -> dict[str, pykka.ActorRef[Any]]:
        """Each actor's name (`node:<node>`, `bound:<provider>`, `asker`) and its current ref."""
        return self.supervisor.children()

    def kill(self, name: str) -> None:
        """Make an actor die as a crash would, at its next message; its supervisor restarts it."""
        self.supervisor.kill(name)

    def quiet(self) -> bool:
        """Whether nothing is being worked on now (no mailbox holds work, no write pends), without asking the bus
        whether changes are on their way (`wait_settled` does)."""
        return self.cache.synced and self.in_flight.total() == 0 and self.dispatcher.idle()

    def wait_settled(self, timeout: float = 30.0) -> bool:
        """True once every change on the bus has reached the cache, every mailbox is empty and no write pends."""
        deadline = time.monotonic() + timeout
        calm = 0
        while time.monotonic() < deadline and not self.supervisor.stopping:
            self.supervisor.notice_dead()
            if not self.in_flight.wait_idle(max(deadline - time.monotonic(), 0)):
                return False
            try:
                caught_up = self.loop.run(self.cache.caught_up(), max(deadline - time.monotonic(), 0.1))
            except TimeoutError:
                return False  # the bus did not answer by the deadline (a paused or dead server): not settled
            calm = calm + 1 if caught_up and self.quiet() else 0
            if calm >= 2:
                return True
        return False

    def status(self) -> SeatStatus:
        """The actors, their restarts, and whether the seat failed."""
        children = {n: ref.is_alive() for n, ref in self.children().items()}
        failed = self.failed.result() if self.failed.done() else ""
        return SeatStatus(children, self.supervisor.restarts(), failed, self.in_flight.total())
