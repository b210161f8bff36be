"""The seat as an operator runs it (contract section 8, the production issue): held once, observable, stopped cleanly.

Each test runs `python -m mesh_provisioner` as real processes against a real nats-server on loopback.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.js.errors
import pytest
from helpers import NatsServer, free_port, stop, wait_until
from prometheus_client import CollectorRegistry

from mesh_provisioner import metrics
from mesh_provisioner import seat as seat_module
from mesh_provisioner.bus.connection import ensure_buckets
from mesh_provisioner.bus.lease import SeatLease
from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.store import Store
from mesh_provisioner.config import Config
from mesh_provisioner.contract import HOLDER_KEY, NEEDS, PLANS, PROVISIONS, SEAT, bucket
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.shards import shard_key
from mesh_provisioner.samples import sample_mesh
from mesh_provisioner.seat import Seat

LEASE = 2.0


@pytest.fixture
def bus(nats_server: NatsServer) -> Iterator[tuple[NatsServer, EventLoopThread]]:
    """A server loaded with the sample mesh, and a loop to read it from."""
    with EventLoopThread() as loop:
        loop.run(load_states(nats_server.url, sample_mesh()), 30)
        yield nats_server, loop


def seat(url: str, *args: str, metrics: int = 0) -> subprocess.Popen[bytes]:
    """A seat process serving on the bus, with a short lease."""
    extra = ["--metrics-addr", f"127.0.0.1:{metrics}"] if metrics else []
    cmd = [sys.executable, "-m", "mesh_provisioner", "--nats", url, "--lease-seconds", str(LEASE), *extra, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def holder(loop: EventLoopThread, url: str, key: str = HOLDER_KEY) -> r.Lease | None:
    """The lease record on the bus now (of the whole seat, or of another lease key), None when no one holds it."""

    async def read() -> r.Lease | None:
        nc = await nats.connect(url)
        try:
            try:
                kv = await nc.jetstream().key_value(bucket(SEAT))
            except nats.js.errors.BucketNotFoundError:
                return None
            try:
                entry = await kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return None
            return r.decode(r.Lease, entry.value or b"")
        finally:
            await nc.close()

    return loop.run(read(), 10)


def revisions(loop: EventLoopThread, url: str) -> dict[str, int]:
    """The last revision of each of the seat's written buckets."""

    async def read() -> dict[str, int]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            return {s: (await js.stream_info(f"KV_{bucket(s)}")).state.last_seq for s in (PLANS, PROVISIONS)}
        finally:
            await nc.close()

    return loop.run(read(), 10)


def test_8_standby_takes_over_within_twice_the_lease_after_sigkill(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, loop = bus
    a = seat(server.url, "serve")
    try:
        wait_until(lambda: (h := holder(loop, server.url)) is not None and h.pid == a.pid, 30, 0.05, "a holds")
        b = seat(server.url, "serve")
        try:
            # b waits as a standby while a holds: it never takes the lease from a live holder.
            wait_until(lambda: b.poll() is None and getattr(holder(loop, server.url), "pid", 0) == a.pid, 5, 0.2,
                       "b waits")
            a.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            wait_until(lambda: (h := holder(loop, server.url)) is not None and h.pid == b.pid, 2 * LEASE + 5,
                       0.05, "b takes over")
            took = time.monotonic() - killed
            print(f"takeover after SIGKILL: {took:.2f} s with a lease of {LEASE:g} s")  # noqa: T201
            assert took < 2 * LEASE + 1
            assert stop(b) == 0
            # A clean exit gives the lease back.
            assert holder(loop, server.url) is None
        finally:
            stop(b)
    finally:
        stop(a)


def test_8_a_holder_that_cannot_renew_stops_writing_at_once(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, loop = bus

    async def scenario() -> tuple[str, str]:
        nc = await nats.connect(server.url, max_reconnect_attempts=-1)
        try:
            await ensure_buckets(nc.jetstream(), lease=LEASE)
            lease = SeatLease(nc, LEASE)
            assert await lease.take()
            store = Store(nc, timeout=0.5)
            store.guard = lease.guard
            plan = b'{"node":"zed","module":"mod","plan":{"provisions":[]}}'
            held = await store.apply([Put(PLANS, "zed.mod", plan, 0)])
            assert held.ok
            server.pause()
            try:
                renewed = await lease.renew()
            finally:
                server.resume()
            assert not renewed
            # From the failed renewal on, every write is refused before it reaches the bus.
            refused = await store.apply([Put(PLANS, "zed.other", b"{}", 0)])
            return lease.guard(), refused.error
        finally:
            await nc.close()

    guard, error = loop.run(scenario(), 60)
    assert guard == "this process does not hold the seat's lease"
    assert "does not hold the seat's lease" in error


def test_8_a_connection_closed_for_good_makes_the_seat_unhealthy_and_serve_exit_1(
    bus: tuple[NatsServer, EventLoopThread],
) -> None:
    server, _ = bus
    held = Seat(Config(nats=server.url, lease_seconds=LEASE))
    exited: list[int] = []
    stopped = threading.Event()
    serving = threading.Thread(target=lambda: exited.append(held.serve(stopped)), daemon=True)
    serving.start()
    try:
        wait_until(lambda: held.ready() == "", 30, 0.05, "the seat holds")
        assert held.healthy() == ""
        # A server's error nats-py takes as final closes the connection for good (a subject past the control line):
        # it never comes back, so the process must say so on /healthz and exit, rather than wait for ever.
        held.loop.run(held.nc.publish("x" * 5000, b""), 5)
        why = wait_until(held.healthy, 30, 0.01, "the seat unhealthy")
        assert "closed for good" in why and "maximum control line exceeded" in why, why
        serving.join(30)
        assert exited == [1]
    finally:
        stopped.set()
        serving.join(30)


def test_8_reconcile_dry_run_needs_no_lease_and_writes_nothing(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, loop = bus
    a = seat(server.url, "serve")
    try:
        wait_until(lambda: (h := holder(loop, server.url)) is not None and h.pid == a.pid, 30, 0.05, "a holds")
        # A quiet seat: wait until the seat's buckets stop moving.
        before = wait_until(lambda: _quiet(loop, server.url), 30, 0.3, "the seat settles")
        dry = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "reconcile", "--dry-run"],
                             capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.strip().endswith("0 write(s) would be made")
        assert revisions(loop, server.url) == before
        # The holder is still a (a dry run takes no lease).
        assert holder(loop, server.url).pid == a.pid  # type: ignore[union-attr]
    finally:
        assert stop(a) == 0


def test_8_reconcile_waits_for_the_lease_and_gives_up_past_its_timeout(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, loop = bus
    a = seat(server.url, "serve")
    try:
        wait_until(lambda: (h := holder(loop, server.url)) is not None and h.pid == a.pid, 30, 0.05, "a holds")
        rec = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "--lease-seconds",
                              str(LEASE), "reconcile", "--wait", "--timeout", "1"], capture_output=True, text=True,
                             timeout=60)
        assert rec.returncode == 2
        assert f"another process holds the seat (pid {a.pid} on " in rec.stderr
        assert "still after 1 s" in rec.stderr
    finally:
        stop(a)


def test_8_1_reconcile_names_the_partitioned_seat_that_holds_the_mesh(bus: tuple[NatsServer, EventLoopThread]) -> None:
    # A partitioned seat holds `shard.<i>` keys, not `holder`: "another process holds the seat" named no one.
    server, loop = bus
    a = seat(server.url, "serve", "--shards", "4")
    try:
        wait_until(lambda: (h := holder(loop, server.url, shard_key(0))) is not None and h.pid == a.pid, 30, 0.05,
                   "a holds shard 0")
        rec = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "--lease-seconds",
                              str(LEASE), "reconcile"], capture_output=True, text=True, timeout=60)
        assert rec.returncode == 2
        assert f"process {a.pid} on " in rec.stderr and "holds shards of the seat (--shards 4)" in rec.stderr
        assert "nothing is reconciled" in rec.stderr
    finally:
        stop(a)


def reconcile_process(url: str, *args: str) -> subprocess.Popen[str]:
    """`reconcile` with a lease of 2 s, as a process of its own."""
    return subprocess.Popen([sys.executable, "-m", "mesh_provisioner", "--nats", url, "--lease-seconds", str(LEASE),
                             "reconcile", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_8_reconcile_keeps_its_lease_and_settles_1500_nodes_with_a_2_s_lease(nats_server: NatsServer) -> None:
    """Renewed as `serve` renews it, the lease outlasts a reconcile many times longer (contract 8)."""
    from benchmarks.mesh import generate, load

    with EventLoopThread() as loop:
        keys = loop.run(load(nats_server.url, generate(1500)), 120)
        started = time.monotonic()
        rec = reconcile_process(nats_server.url, "--timeout", "400")
        try:
            out, err = rec.communicate(timeout=450)
        finally:
            rec.kill()
        took = time.monotonic() - started
        print(f"reconcile of 1,500 nodes ({keys} keys) with a 2 s lease: exit {rec.returncode} in {took:.1f} s")  # noqa: T201
        assert rec.returncode == 0, err[-3000:]
        assert out.startswith("settled in "), out
        assert "could not be renewed" not in err
        assert revisions(loop, nats_server.url)[PLANS] > 1500
        assert holder(loop, nats_server.url) is None  # given back cleanly


def test_8_a_reconcile_that_loses_its_lease_says_so_and_exits_2_at_once(nats_server: NatsServer) -> None:
    from benchmarks.mesh import generate, load

    with EventLoopThread() as loop:
        loop.run(load(nats_server.url, generate(300)), 60)
        rec = reconcile_process(nats_server.url, "--timeout", "120")
        try:
            wait_until(lambda: (h := holder(loop, nats_server.url)) is not None and h.pid == rec.pid, 30, 0.02,
                       "the reconcile holds the seat")

            async def take_over() -> None:
                nc = await nats.connect(nats_server.url)
                try:
                    kv = await nc.jetstream().key_value(bucket(SEAT))
                    await kv.put(HOLDER_KEY, r.encode(r.Lease(holder="another", host="elsewhere", pid=1)))
                finally:
                    await nc.close()

            loop.run(take_over(), 10)
            taken = time.monotonic()
            _, err = rec.communicate(timeout=150)
            # At once: within its next renewal and the actors' stop, not at its timeout of 120 s.
            assert time.monotonic() - taken < 15, err[-3000:]
        finally:
            rec.kill()
        assert rec.returncode == 2
        said = "the seat's lease could not be renewed: it is another process's now, or aged out; the reconcile stops"
        assert said in err, err[-3000:]


_last: dict[str, int] = {}


def _quiet(loop: EventLoopThread, url: str) -> dict[str, int] | None:
    """The seat's revisions when they did not move since the last look, else None."""
    now = revisions(loop, url)
    same = now == _last.get(url)
    _last[url] = now  # type: ignore[assignment]
    return now if same and now[PLANS] > 0 else None


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except urllib.error.URLError:
        return 0, ""  # not listening yet


def test_4_metrics_and_health_scraped_over_http(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, _ = bus
    port_a, port_b = free_port(), free_port()
    a = seat(server.url, "serve", metrics=port_a)
    b = None
    try:
        wait_until(lambda: _get(f"http://127.0.0.1:{port_a}/readyz")[0] == 200, 30, 0.05, "a is ready")
        def composed() -> str | None:
            text = _get(f"http://127.0.0.1:{port_a}/metrics")[1]
            return text if _sample(text, "mesh_provisioner_compositions_total") > 0 else None

        metrics = wait_until(composed, 30, 0.1, "a composed")
        assert _sample(metrics, 'mesh_provisioner_writes_total{state="mesh-provisioner.plans"}') > 0
        assert _sample(metrics, "mesh_provisioner_seat_held") == 1.0
        assert _sample(metrics, "mesh_provisioner_cache_keys") > 0
        assert _sample(metrics, 'mesh_provisioner_loop_tasks{loop="bus"}') > 0
        assert _sample(metrics, 'mesh_provisioner_loop_tasks{loop="lease"}') >= 0
        assert _sample(metrics, "mesh_provisioner_change_to_write_seconds_count") >= 0
        assert _get(f"http://127.0.0.1:{port_a}/healthz")[0] == 200
        # A standby is alive but not ready, and says why.
        b = seat(server.url, "serve", metrics=port_b)
        wait_until(lambda: _get(f"http://127.0.0.1:{port_b}/healthz")[0] == 200, 30, 0.05, "b is alive")
        # Alive from the start, b says what it waits for: connecting, then the lease.
        def standby() -> tuple[int, str] | None:
            got = _get(f"http://127.0.0.1:{port_b}/readyz")
            return got if "standby" in got[1] else None

        status, _ = wait_until(standby, 30, 0.05, "b waits for the lease")
        assert status == 503
        assert _get(f"http://127.0.0.1:{port_b}/healthz")[0] == 200
        assert _sample(_get(f"http://127.0.0.1:{port_b}/metrics")[1], "mesh_provisioner_seat_held") == 0.0
    finally:
        if b is not None:
            stop(b)
        stop(a)


def _sample(text: str, name: str) -> float:
    """One sample's value from Prometheus text, -1 when it is not there."""
    for line in text.splitlines():
        if not line.startswith("#") and line.rsplit(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return -1.0


def test_4_json_logs_one_object_per_line(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, _ = bus
    rec = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "--log-format", "json",
                          "reconcile"], capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    lines = [json.loads(line) for line in rec.stderr.splitlines() if line.strip()]
    assert lines
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line["logger"] == "mesh_provisioner.actors.node" and "composed" in line["message"] for line in lines)


def test_9_the_serving_seat_answers_the_verb(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, loop = bus
    a = seat(server.url, "serve")

    async def ask() -> dict[str, object]:
        nc = await nats.connect(server.url)
        try:
            msg = await nc.request("mesh-provisioner.provisioning", b'{"what": "plans", "node": "ace"}', timeout=2)
            return json.loads(msg.data)  # type: ignore[no-any-return]
        finally:
            await nc.close()

    def answered() -> dict[str, object] | None:
        try:
            reply = loop.run(ask(), 5)
        except Exception:
            return None  # not serving yet
        return reply if reply.get("entries") else None

    try:
        reply = wait_until(answered, 30, 0.1, "the verb answers")
        keys = [e["key"] for e in reply["entries"]]  # type: ignore[attr-defined, union-attr]
        assert keys == ["ace.gitea", "ace.keycloak", "ace.mesh-vault", "ace.postgres"]
    finally:
        assert stop(a) == 0


def test_9_the_verb_answers_registry_and_needs_with_the_registry_file_from_the_environment(
    bus: tuple[NatsServer, EventLoopThread], tmp_path: Path
) -> None:
    server, loop = bus
    path = tmp_path / "registry.json"
    path.write_text('{"default": "example.org", "forge": "git.example.org"}')
    loop.run(load_states(server.url, {NEEDS: {"ace.gitea": b'{"old": true}'}}), 30)
    a = subprocess.Popen([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "--lease-seconds",
                          str(LEASE), "serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "MESH_PROVISIONER_REGISTRY": str(path)})

    async def ask(what: str) -> dict[str, object]:
        nc = await nats.connect(server.url)
        try:
            msg = await nc.request("mesh-provisioner.provisioning", json.dumps({"what": what}).encode(), timeout=2)
            return json.loads(msg.data)  # type: ignore[no-any-return]
        finally:
            await nc.close()

    def answered() -> dict[str, object] | None:
        try:
            reply = loop.run(ask("registry"), 5)
        except Exception:
            return None  # not serving yet
        return reply if reply.get("entries") else None

    try:
        reply = wait_until(answered, 30, 0.1, "the verb answers the registry")
        assert reply == {"entries": [
            {"key": "default", "value": {"kind": "default", "domain": "example.org"}},
            {"key": "forge", "value": {"kind": "forge", "domain": "git.example.org"}},
        ]}
        assert loop.run(ask("needs"), 5) == {"entries": []}  # emptied when the seat was taken
    finally:
        assert stop(a) == 0


def test_4_needs_retired_when_the_seat_starts(bus: tuple[NatsServer, EventLoopThread]) -> None:
    server, loop = bus
    loop.run(load_states(server.url, {NEEDS: {"ace.gitea": b'{"old": true}', "bee.webapp": b"{}"}}), 30)
    rec = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "reconcile"],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    assert "deleted 2 key(s) of the retired needs" in rec.stderr

    async def keys() -> list[str]:
        nc = await nats.connect(server.url)
        try:
            kv = await nc.jetstream().key_value(bucket(NEEDS))
            try:
                return await kv.keys()
            except nats.js.errors.NoKeysError:
                return []
        finally:
            await nc.close()

    assert loop.run(keys(), 10) == []


def test_8_the_lease_says_since_when_its_holder_took_the_seat_not_when_it_last_renewed(
    bus: tuple[NatsServer, EventLoopThread],
) -> None:
    server, loop = bus

    async def next_second(after: datetime | None) -> None:
        """Until the wall clock's second has moved past `after`, with a deadline."""
        deadline = time.monotonic() + 5
        while after is not None and datetime.now(UTC).replace(microsecond=0) <= after:
            assert time.monotonic() < deadline, "the clock did not move"
            await asyncio.sleep(0.05)

    async def scenario() -> tuple[r.Lease | None, r.Lease | None, r.Lease | None]:
        nc = await nats.connect(server.url)
        try:
            await ensure_buckets(nc.jetstream(), lease=LEASE)
            lease = SeatLease(nc, LEASE)
            assert await lease.take()
            taken = await lease.current()
            await next_second(taken.since if taken is not None else None)
            assert await lease.renew()  # a second or more later: `since` is written again, and must not move
            renewed = await lease.current()
            await lease.give_back()
            assert await lease.take()
            again = await lease.current()
            await lease.give_back()
            return taken, renewed, again
        finally:
            await nc.close()

    taken, renewed, again = loop.run(scenario(), 30)
    assert taken is not None and renewed is not None and again is not None
    assert taken.since is not None and renewed.since == taken.since
    assert again.since is not None and again.since > taken.since, "taken again: since then"


def test_8_a_start_cut_short_stops_what_it_made_already(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[EventLoopThread] = []

    def second_cut_short(*args: str) -> EventLoopThread:
        if made:
            raise KeyboardInterrupt  # as a signal's Interrupted, raised as the lease's loop is made
        made.append(EventLoopThread(*args))
        return made[0]

    monkeypatch.setattr(seat_module, "EventLoopThread", second_cut_short)
    port = free_port()
    with pytest.raises(KeyboardInterrupt):
        Seat(Config(nats=f"nats://127.0.0.1:{free_port()}", metrics_addr=f"127.0.0.1:{port}"))
    assert made and not made[0].loop.is_running()
    with socket.socket() as taken:  # the metrics endpoint no longer listens
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))


def test_8_a_metrics_endpoint_interrupted_as_it_starts_closes_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt  # as a signal's Interrupted, raised once its thread started

    monkeypatch.setattr(metrics.log, "info", interrupted)
    port = free_port()
    before = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        metrics.HttpEndpoint(f"127.0.0.1:{port}", CollectorRegistry(), healthy=str, ready=str)
    assert not [t for t in set(threading.enumerate()) - before if t.name == "mesh-provisioner-http"]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))


def test_8_a_connection_that_does_not_close_cleanly_leaves_the_other_to_be_closed(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = Seat(Config(nats=nats_server.url, lease_seconds=LEASE))

    async def fails() -> None:
        raise OSError("the socket is gone")

    monkeypatch.setattr(held.lease_nc, "close", fails)
    held.close()
    assert held.nc.is_closed


def test_8_a_seat_closed_twice_closes_once(nats_server: NatsServer) -> None:
    # `serve` closes the seat it served, and its host may close it too: the second close found the loops stopped and
    # left a coroutine never awaited (a RuntimeWarning) for each connection.
    held = Seat(Config(nats=nats_server.url, lease_seconds=LEASE))
    held.close()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        held.close()
        gc.collect()  # an un-awaited coroutine is said when it is collected
    assert [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)] == []
    assert held.nc.is_closed and held.lease_nc.is_closed

