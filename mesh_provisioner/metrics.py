"""What the seat counts, for Prometheus, and the HTTP endpoint that serves it with `/healthz` and `/readyz`.

Each supervisor has a registry of its own, so that two seats embedded in one process never share a counter.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

log = logging.getLogger("mesh_provisioner.metrics")

# What the HTTP endpoint serves; any other path is 404.
PATHS = ("/metrics", "/healthz", "/readyz")
# From a change on the bus to the write it causes: the seat aims at well under 100 ms.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The seat's counters, gauges and histogram, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.compositions = Counter("mesh_provisioner_compositions", "Node compositions made", registry=r)
        self.writes = Counter("mesh_provisioner_writes", "Compare-and-set writes made", ["state"], registry=r)
        self.conflicts = Counter("mesh_provisioner_conflicts", "Compare-and-set writes that conflicted", registry=r)
        self.restarts = Counter("mesh_provisioner_restarts", "Actors restarted", ["kind"], registry=r)
        self.asks_raised = Counter("mesh_provisioner_asks_raised", "Retiring asks published", registry=r)
        self.asks_decided = Counter("mesh_provisioner_asks_decided", "Answers taken into keys", registry=r)
        self.change_to_write = Histogram(
            "mesh_provisioner_change_to_write_seconds", "From a change on the bus to the write it causes",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.cache_keys = Gauge("mesh_provisioner_cache_keys", "Keys held in the cache", registry=r)
        self.seat_held = Gauge("mesh_provisioner_seat_held", "1 while this process holds the seat", registry=r)
        self.loop_tasks = Gauge("mesh_provisioner_loop_tasks", "Asyncio tasks not done on the seat's event loops",
                                ["loop"], registry=r)

    def count_tasks(self, name: str, loop: asyncio.AbstractEventLoop) -> None:
        """Count the tasks of `loop` as `mesh_provisioner_loop_tasks{loop=name}`, read when scraped.

        `asyncio.all_tasks` may be called from another thread (the scrape's): it copies the set of tasks first.
        """
        self.loop_tasks.labels(name).set_function(lambda: len(asyncio.all_tasks(loop)))

    def observe_writes(self, states: Iterable[str], conflict: bool) -> None:
        """Count a batch's writes by state, and its conflict."""
        for state, n in collections.Counter(states).items():
            self.writes.labels(state).inc(n)
        if conflict:
            self.conflicts.inc()


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class HttpEndpoint:
    """`/metrics` from a registry, `/healthz` (alive) and `/readyz` (ready to do the seat's work)."""

    def __init__(self, addr: str, registry: CollectorRegistry, *, healthy: Callable[[], str],
                 ready: Callable[[], str]) -> None:
        host, _, port = addr.rpartition(":")
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics_app(environ, start_response)  # type: ignore[no-any-return]
            check = {"/healthz": healthy, "/readyz": ready}.get(path)
            if check is None:
                # A probe or scraper pointed at a wrong path is told so, not given 200 and the metrics.
                start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
                return [f"no such path {path}: this serves {', '.join(PATHS)}\n".encode()]
            why = check()
            status = "503 Service Unavailable" if why else "200 OK"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [(why or "ok").encode() + b"\n"]

        try:
            self.server = make_server(host or "127.0.0.1", int(port), app, _ThreadingWSGIServer, _QuietHandler)
        except OSError as err:
            raise RuntimeError(f"cannot serve metrics on {addr}: {err.strerror or err}") from None
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, name="mesh-provisioner-http", daemon=True)
        try:
            self.thread.start()
            log.info("metrics and health on http://%s:%d", host or "127.0.0.1", self.port)
        except BaseException:
            # Interrupted as it started (a signal's handler raises in the package's code): nothing else holds it.
            self.stop()
            raise

    def stop(self) -> None:
        """Stop serving; returns once the port is closed and the serving thread is done."""
        if self.thread.ident is not None:  # shutdown waits for serve_forever, which only a started thread runs
            self.server.shutdown()
            self.thread.join(5.0)
        self.server.server_close()
