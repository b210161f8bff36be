"""The seat process's life (contract section 8): wait for the lease, run the actors while holding it, let go.

Only the holder writes the seat's states. A standby waits and takes the lease once it is gone; a holder whose
renewal fails stops its actors at once and goes back to waiting; a clean exit gives the lease back so a standby
takes over without waiting for it to age out.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Collection
from typing import Final

from nats.aio.client import Client
from nats.micro.service import Service

from mesh_provisioner.bus.connection import (
    closed_for_good,
    config_buckets_wait,
    connect_config,
    ensure_config_buckets,
    open_bus,
)
from mesh_provisioner.bus.lease import SeatLease
from mesh_provisioner.bus.loop import Abandoned, EventLoopThread
from mesh_provisioner.bus.shards import ShardLeases
from mesh_provisioner.bus.verb import serve_verb
from mesh_provisioner.collector import Freezer
from mesh_provisioner.config import Config
from mesh_provisioner.metrics import HttpEndpoint, Metrics
from mesh_provisioner.rules.shards import in_shards
from mesh_provisioner.runtime import Runtime

log = logging.getLogger("mesh_provisioner.seat")


LEASE_CONNECTION: Final = "mesh-provisioner-lease"
# How often a lease that lapsed for want of an answer is asked for again.
AGAIN_WHEN_LAPSED: Final = 0.5
# How often holding looks whether it must end: asked to stop, the lease lost, the supervisor given up.
WATCH_EVERY: Final = 0.1
# How often a process starting to hold shards looks whether it holds its whole share yet (`_await_share`).
SHARE_EVERY: Final = 0.01


class LeaseKeeper:
    """Renews a seat's lease a quarter of the lease time apart, on a thread of its own, until stopped or the lease
    is lost (contract 8): the one place a held lease is renewed.

    A renewal may take until the lease would lapse (the bus loop may be busy with a large mesh's changes); one that
    fails or takes longer stops every write at once. Holding ends when the lease is found another process's or gone;
    one that met no answer is asked for again until it is renewed (the key still this process's) or found lost.
    """

    def __init__(self, seat: Seat) -> None:
        self.seat = seat
        self.lost = threading.Event()
        self.why = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="mesh-provisioner-lease", daemon=True)

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the lease is given back, or let go); returns once no renewal runs."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _renew(self) -> None:
        lease = self.seat.lease
        every = lease.renew_every
        # Lapsed for want of an answer (a cluster electing the lease stream's leader), the lease is asked for again
        # often: the next renewal that finds the key still this process's writes again at once.
        while not self._stop.wait(every if lease.held else min(every, AGAIN_WHEN_LAPSED)):
            try:
                if self.seat.lease_loop.run(lease.renew(), max(lease.left(), every)):
                    continue
                if not lease.taken_over:
                    continue  # no answer: writes wait (the guard says so), holding goes on
                self.why = "the seat's lease could not be renewed: it is another process's now, or aged out"
            except TimeoutError:
                lease.lapse()  # the renewal's own wait ran out: no answer either
                continue
            except Exception as err:  # the loop gone (closing): no renewal can be made, and no write either
                lease.lapse()
                self.why = f"the seat's lease could not be renewed: {err}"
            log.warning("%s: this process stops writing", self.why)
            self.lost.set()
            return


class Seat:
    """One seat process: a connection, its lease, and a supervisor while the lease is held."""

    def __init__(self, config: Config, *, on_hold: Callable[[Runtime | None], None] | None = None,
                 connect_within: float | None = None) -> None:
        """Serve metrics and health (when configured), then connect: for `connect_within` seconds at most
        (math.inf: until it connects or a signal's handler interrupts; None: three request timeouts)."""
        self._closing = threading.Lock()
        self._closed = False  # `close` is done
        self.config = config
        self.freezer = Freezer()
        self.supervisor: Runtime | None = None
        self.on_hold = on_hold or (lambda _: None)
        self.metrics = Metrics()
        self.connected = False
        self.waiting = f"connecting to {', '.join(config.servers())}"
        self.nc: Client
        self.lease_nc: Client
        self.lease: SeatLease
        self.metrics.seat_held.set_function(lambda: 1.0 if self.connected and self.lease.held else 0.0)
        # Served from the start: a process still connecting is alive (/healthz) and says what it waits for (/readyz).
        self.http: HttpEndpoint | None = None
        self.loop: EventLoopThread
        self.lease_loop: EventLoopThread
        try:
            if config.metrics_addr:
                self.http = HttpEndpoint(config.metrics_addr, self.metrics.registry, healthy=self.healthy,
                                         ready=self.ready)
            self.loop = EventLoopThread()
            self.lease_loop = EventLoopThread(LEASE_CONNECTION)
            self.metrics.count_tasks("bus", self.loop.loop)
            self.metrics.count_tasks("lease", self.lease_loop.loop)
            within = config.request_timeout * 3 if connect_within is None else connect_within
            wait = None if math.isinf(within) else within + config.request_timeout
            self.nc = self.loop.run(open_bus(config, within, self._said), wait)
            self.waiting = f"creating the seat's buckets on {', '.join(config.servers())}"
            self.loop.run(ensure_config_buckets(self.nc, config), config_buckets_wait(config))
            # The lease is kept on a connection and an event loop of its own: on the seat's, a renewal's answer waits
            # behind every change the server is sending the cache (a large mesh's first load is seconds of them), past
            # a short lease.
            self.lease_nc = self.lease_loop.run(connect_config(config, name=LEASE_CONNECTION),
                                                config.request_timeout * 3)
            self.lease = (ShardLeases(self.lease_nc, config.shards, config.lease_seconds) if config.shards > 1
                          else SeatLease(self.lease_nc, config.lease_seconds))
            changed = self.lease_loop.run(self.lease.ensure_age(), config.request_timeout)
            if changed:
                log.warning("%s", changed)
            self.connected = True
        except BaseException:
            self.close()
            raise

    def _said(self, why: str) -> None:
        """What connecting last met, for /readyz."""
        self.waiting = f"connecting to {', '.join(self.config.servers())}: {why}"

    def healthy(self) -> str:
        """Why this process is not alive and well ("" when it is): its supervisor gave up, or its connection is closed
        for good (a standby's too: it would wait for the lease for ever). A process still connecting is alive."""
        if not self.connected:
            return ""
        sup = self.supervisor
        if sup is not None and sup.failed.done() and sup.failed.result():
            return sup.failed.result()
        return self.closed()

    def closed(self) -> str:
        """Why a connection of this process is closed for good ("" while neither is): nothing brings it back."""
        return closed_for_good(self.nc) or closed_for_good(self.lease_nc)

    def ready(self) -> str:
        """Why this process is not doing the seat's work ("" when it is): connected, lease held, cache synced."""
        if not self.connected:
            return self.waiting
        if not self.lease.held:
            return self.lease.waiting_for()
        sup = self.supervisor
        if sup is None or not sup.cache.synced:
            return "the cache is not synchronised yet"
        return ""

    def take(self, stop: threading.Event, timeout: float | None = None) -> bool:
        """Wait until this process holds the lease (True), or stop is set, the timeout passes or the connection is
        closed for good (False)."""
        waited = 0.0
        every = self.lease.poll_every
        announced = False
        while not stop.is_set() and not self.closed():
            try:
                if self.lease_loop.run(self.lease.take(), self.config.request_timeout):
                    return True
            except Exception as err:  # the bus may be out of reach: keep waiting, as a standby does
                log.warning("the seat's lease cannot be asked for: %s", err)
            if timeout is not None and waited >= timeout:
                return False
            if not announced:
                log.info("%s", self.lease.waiting_for())
                announced = True
            # A partitioned seat's shards freed meanwhile are taken as they are freed (bus/shards.py `_follow`):
            # whether it holds any is looked at often, the bus asked every `every`.
            for _ in range(max(1, round(every / WATCH_EVERY))):
                if stop.wait(WATCH_EVERY) or self.lease.held:
                    break
            waited += every
        return False

    def hold(self, stop: threading.Event, within: float | None = None) -> tuple[str, bool]:
        """Run the actors while the lease is renewed; answers why holding ended ("" when stop was set) and
        whether it ended because the supervisor gave up (past its restart intensity). `within`: the seconds the
        actors' start may take at most, the cache's first load with it (None: as long as the load makes headway).

        `serve` and `reconcile` both hold the seat here, so the lease is kept one way: renewed from the moment it is
        taken (the cache's first load of a large mesh outlasts a short lease), and a lease lost ends holding at once.
        """
        keeper = LeaseKeeper(self)
        shards = self.lease if isinstance(self.lease, ShardLeases) else None
        try:
            keeper.start()
            if shards is not None:
                self._await_share(shards, stop)
            if stop.is_set():  # a signal while the lease was taken, or the rest of the share waited for
                keeper.stop()
                return "", False
            # Every shard held now is loaded and composed from the start; one taken later, once `took` read it. Memory
            # is read anew: shards no longer held before now are nothing to let go of.
            self.lease.taken()
            if shards is not None:
                shards.dropped()
                self._ready(shards.mine())
            sup = Runtime.start(
                self.config, nc=self.nc, loop=self.loop.loop, guard=self.lease.guard, unanswered=self.lease.unanswered,
                owns=shards.owns if shards is not None else None, holds=shards.holds if shards is not None else None,
                metrics=self.metrics, within=within, abandon=lambda: stop.is_set() or keeper.lost.is_set(),
            )
        except Abandoned:  # a stop, or the lease lost, while the cache's first load went on
            keeper.stop()
            return ("" if stop.is_set() else keeper.why), False
        except TimeoutError as err:  # the bus gone quiet as the seat started (its load made no headway, say)
            keeper.stop()
            return f"the seat could not start: {err}", False
        except BaseException:
            keeper.stop()
            raise
        why, gave_up = "", False
        verb: Service | None = None
        try:
            self.supervisor = sup
            self.on_hold(sup)
            # The verb answers from the holder's cache (contract 9); a standby has none, so it serves no verb.
            try:
                verb = self.loop.run(serve_verb(self.nc, sup.view, held=sup.holds_all,
                                                timeout=self.config.request_timeout), self.config.request_timeout)
            except Exception as err:  # the connection closed meanwhile: the supervisor fails for it, said below
                log.warning("the verb is not served: %s", err or type(err).__name__)
            while not stop.wait(min(self.config.lease_seconds / 4, WATCH_EVERY)):
                if sup.failed.done():
                    why, gave_up = sup.failed.result() or "the supervisor stopped", True
                    break
                if keeper.lost.is_set():
                    why = keeper.why
                    break
                taken = self.lease.taken()
                if taken:
                    ready = functools.partial(self._ready, taken) if shards is not None else (lambda: None)
                    try:
                        # Reading the taken shards' keys again takes minutes at 100,000 nodes: a stop, a lease lost or
                        # the supervisor given up meanwhile ends it, and holding with it (said at the loop's head).
                        sup.took(in_shards(taken, self.lease.shards), ready,
                                 abandon=lambda: stop.is_set() or keeper.lost.is_set() or sup.failed.done())
                    except Abandoned:
                        continue
                    except TimeoutError as err:  # the bus gone quiet while the taken shards were read and handed over
                        why = f"the shards taken were not taken over: {err}"
                        break
                if shards is not None and shards.dropped():
                    sup.gave()
                self.freezer.tick(sup.quiet)
        finally:
            if verb is not None:
                with contextlib.suppress(Exception):  # a bus that is gone has no service left to stop
                    self.loop.run(verb.stop(), self.config.request_timeout)
            sup.stop()
            keeper.stop()  # kept while the actors stop, so that a clean exit still has a lease to give back
            self.supervisor = None
            self.on_hold(None)
        return why, gave_up

    def _await_share(self, shards: ShardLeases, stop: threading.Event) -> None:
        """Wait a look at most for the rest of this process's fair share while other processes hold it (one handing it
        over, or one gone whose leases have not aged out yet; contract 8.1): a shard taken once the runtime started is
        read again whole and its nodes composed late (`took`), and the other processes meanwhile compose their consumers
        of its providers, to compose them again once those are."""
        deadline = time.monotonic() + shards.renew_every
        while shards.missing and time.monotonic() < deadline and not stop.wait(SHARE_EVERY):
            pass

    def _ready(self, shards: Collection[int]) -> None:
        """Tell the lease that what is kept of the shards' nodes is read: they are composed from now on (8.1)."""
        self.lease_loop.run(self.lease.ready(shards), self.config.request_timeout)

    def serve(self, stop: threading.Event) -> int:
        """Hold the seat whenever this process can, until stop is set; 1 when the supervisor gave up or the
        connection is closed for good."""
        try:
            while not stop.is_set():
                if not self.take(stop):
                    break
                why, gave_up = self.hold(stop)
                if gave_up:
                    log.error("%s", why)
                    return 1
                if why:
                    log.warning("%s: back to waiting for the seat", why)
            lost = self.closed()
            if lost:
                # Nothing brings a closed connection back: a process that stays would never hold the seat again.
                log.error("%s", lost)
                return 1
            return 0
        finally:
            stop.set()  # the seat stops, whatever ended it: a signal from now on lets it finish (cli/process.py)
            self.close()

    def close(self) -> None:
        """Give the lease back, close the connection, stop serving metrics; once (`serve` closes the seat it served,
        and its host may too): a close asked while another is under way returns once that one is done, and one cut
        short (a signal's Interrupted) is finished by the next."""
        with self._closing:
            if not self._closed:
                self._close()
                self._closed = True

    def _close(self) -> None:
        """`close`'s work, each step on its own: the metrics endpoint, the lease, the connections, their loops."""
        if self.http is not None:
            self.http.stop()
            self.http = None
        # Each step on its own: on a bus that is gone one fails, and the others are still owed.
        if self.connected:
            try:
                self.lease_loop.run(self.lease.give_back(), self.config.request_timeout)
            except Exception as err:  # nothing left to give back
                log.debug("the lease was not given back: %s", err)
        # Each connection exists only once its loop does (a start cut short made neither, or only the loops).
        connections = ((getattr(self, "lease_nc", None), getattr(self, "lease_loop", None)),
                       (getattr(self, "nc", None), getattr(self, "loop", None)))
        for nc, loop in connections:
            if nc is not None and loop is not None:
                try:
                    loop.run(nc.close(), self.config.request_timeout)
                except Exception as err:
                    log.debug("the NATS connection %s did not close cleanly: %s", nc.options.get("name"), err)
        self.connected = False
        # What a start cut short made (a signal's Interrupted, a port taken): only that is there to stop.
        for thread in (getattr(self, "lease_loop", None), getattr(self, "loop", None)):
            if thread is not None:
                thread.stop()
