"""deploy/nats-server.conf on a real nats-server: the seat does all it does as its user, and only that.

The shipped configuration is started as it is (its passwords from the environment; port and store from the command
line, which override the file's). Another module (`controller`) loads the sample mesh into the buckets the seat reads
(contract section 2); the seat runs as `seat` until it settles and writes its states (section 4), publishes its ask
(5.4) and serves its verb (9). The seat must cause no permissions violation. Then each user tries what it may not:
the controller writing the seat's states, the seat writing the controller's.

A violation is seen as the client sees it, whatever the server's version writes in its log: the server answers it
with a protocol error (`-ERR 'Permissions Violation for ...'`), which nats-py hands to the connection's error callback.
Every client of this process is watched that way (`refusals`); a seat run as a process of its own is watched through
its log, where its connection warns of every error the server sends it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nats
import nats.errors
import pytest
from helpers import wait_until
from nats.aio.client import Client
from nats.protocol.parser import PERMISSIONS_ERR

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import connect_config, ensure_buckets
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import load_states, router_stream
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.verb import serve_verb
from mesh_provisioner.config import Config
from mesh_provisioner.contract import OWN, PLACEMENT, PROVISIONS, VERB_SUBJECT, bucket
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.samples import sample_mesh

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats-server.conf"
SEAT_PASSWORD = "seat-test-password"
CONTROLLER_PASSWORD = "controller-test-password"


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedServer]:
    """The shipped configuration on a free port with a store of its own; passwords from the environment.

    The copy leaves out the file's store directory: the embedded server names its own on the command line, and
    nats-server refuses a store directory given twice. Everything else is the file as shipped.
    """
    conf = tmp_path / "nats-server.conf"
    shipped = CONF.read_text()
    assert shipped.count("store_dir:") == 1
    conf.write_text("\n".join(line for line in shipped.splitlines() if "store_dir:" not in line) + "\n")
    monkeypatch.setenv("MESH_PROVISIONER_PASSWORD", SEAT_PASSWORD)
    monkeypatch.setenv("MESH_CONTROLLER_PASSWORD", CONTROLLER_PASSWORD)
    with EmbeddedServer(store=tmp_path / "store", config=conf) as running:
        yield running


class Refusals:
    """Every error the server sent any client of this process, by the client's user: nats-py hands each to the
    error callback the client was given, and this wraps every such callback (a client given none gets one)."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, Exception]] = []
        self.users: list[str] = []  # the user of each client watched, one entry a connection

    def of(self, user: str) -> list[str]:
        """Every error the server sent a user's clients."""
        return [str(err) for who, err in self.errors if who == user]

    def violations(self, user: str) -> list[str]:
        """The permissions violations among them: the errors nats-py itself takes for one (it keeps the connection
        open on those alone)."""
        return [e for e in self.of(user) if PERMISSIONS_ERR in e.lower()]


@pytest.fixture
def refusals(monkeypatch: pytest.MonkeyPatch) -> Refusals:
    """The errors the server sends this process's clients from now on, the seat's among them."""
    seen = Refusals()
    connect = Client.connect

    async def watched(self: Client, servers: str | list[str] = "nats://localhost:4222", **options: Any) -> None:
        first = servers if isinstance(servers, str) else servers[0]
        user = options.get("user") or urlparse(first.split(",")[0]).username or ""
        theirs: Callable[[Exception], Awaitable[None]] | None = options.get("error_cb")
        seen.users.append(user)

        async def error(err: Exception) -> None:
            seen.errors.append((user, err))
            if theirs is not None:
                await theirs(err)

        await connect(self, servers, **{**options, "error_cb": error})

    monkeypatch.setattr(Client, "connect", watched)
    return seen


def connection_warnings(stderr: str) -> list[str]:
    """The warnings (and worse) of a seat process's NATS connection, from its JSON log: the connection warns of every
    error the server sends it, a permissions violation among them."""
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [r["message"] for r in records
            if r["logger"] == "mesh_provisioner.bus.connection" and r["level"] in ("WARNING", "ERROR", "CRITICAL")]


def as_user(server: EmbeddedServer, user: str, password: str) -> str:
    """The server's URL with a user's credentials in it."""
    return server.url.replace("nats://", f"nats://{user}:{password}@")


class Connected:
    """A user's connection, and every error the server sent it (a permissions violation comes as one)."""

    def __init__(self) -> None:
        self.nc: Client | None = None
        self.errors: list[str] = []

    async def connect(self, server: EmbeddedServer, user: str, password: str) -> Client:
        async def error(err: Exception) -> None:
            self.errors.append(str(err))

        self.nc = await nats.connect(server.url, user=user, password=password, error_cb=error,
                                     max_reconnect_attempts=0)
        return self.nc

    def denied(self, subject: str) -> bool:
        """Whether the server told this connection it may not publish to a subject (nats-py says it lower-cased)."""
        return any(f"permissions violation for publish to {subject}".lower() in e.lower() for e in self.errors)


async def put(nc: Client, state: str, key: str, value: bytes, timeout: float = 1.0) -> int:
    kv = await nc.jetstream(timeout=timeout).key_value(bucket(state))
    return await kv.put(key, value)


def load_the_mesh(server: EmbeddedServer) -> None:
    """The sample mesh: other modules' states as the controller, the seat's one old provision as the seat."""
    mesh = sample_mesh()
    own = {state: values for state, values in mesh.items() if state in OWN}
    others = {state: values for state, values in mesh.items() if state not in OWN}
    controller = as_user(server, "controller", CONTROLLER_PASSWORD)
    asyncio.run(load_states(controller, others))
    asyncio.run(router_stream(controller))
    asyncio.run(load_states(as_user(server, "seat", SEAT_PASSWORD), own))


def test_the_seat_settles_and_serves_as_its_user_without_a_violation(server: EmbeddedServer,
                                                                     refusals: Refusals) -> None:
    load_the_mesh(server)
    sup = Runtime.start(Config(nats=server.url, user="seat", password=SEAT_PASSWORD))
    try:
        assert sup.wait_settled(60), "the seat did not settle under its permissions"
    finally:
        sup.stop()

    async def read() -> tuple[list[str], dict[str, str], int]:
        nc = await nats.connect(server.url, user="controller", password=CONTROLLER_PASSWORD)
        try:
            js = nc.jetstream()
            plans = sorted(await (await js.key_value("mesh-provisioner_plans")).keys())
            kv = await js.key_value(bucket(PROVISIONS))
            states = {key: json.loads((await kv.get(key)).value or b"{}")["state"] for key in await kv.keys()}
            asks = (await js.stream_info("asks")).state.messages
            return plans, states, asks
        finally:
            await nc.close()

    plans, states, asks = asyncio.run(read())
    assert plans == ["ace.gitea", "ace.keycloak", "ace.mesh-vault", "ace.postgres", "bee.mailer", "bee.webapp"]
    assert states["ace.gitea.postgres-database.main"] == "provided"
    assert states["bee.webapp.forge-account"] == "waits"
    assert states["bee.oldapp.postgres-database"] == "retiring"
    assert asks == 1, "the retiring ask was not published through JetStream"
    assert "seat" in refusals.users, "the seat's connections were not watched"
    assert refusals.of("seat") == []
    assert refusals.of("controller") == []


def seat_process(server: EmbeddedServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m mesh_provisioner` as the seat's user, logging JSON."""
    return subprocess.run(
        [sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "--user", "seat", "--password", SEAT_PASSWORD,
         "--log-format", "json", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_reconcile_takes_the_lease_and_writes_as_the_seats_user(server: EmbeddedServer) -> None:
    load_the_mesh(server)
    done = seat_process(server, "reconcile", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert "gave the seat's lease back" in done.stderr
    assert connection_warnings(done.stderr) == []


def test_a_violation_by_the_seats_user_is_seen(server: EmbeddedServer, refusals: Refusals) -> None:
    """The checks above can fail: the seat's user publishing where it may not is seen both ways."""
    config = Config(nats=server.url, user="seat", password=SEAT_PASSWORD)
    with EventLoopThread("trespass") as loop:
        nc = loop.run(connect_config(config), 10)
        try:
            loop.run(nc.publish(f"$KV.{bucket(PLACEMENT)}.ace", b"{}"), 10)
            # The server's answer may come after the PONG of a flush: wait for it while the loop reads on.
            wait_until(lambda: refusals.violations("seat"), timeout=10,
                       what="the violation of a publish the seat's user may not make, seen")
        finally:
            loop.run(nc.close(), 10)
    assert f"$kv.{bucket(PLACEMENT)}.ace".lower() in refusals.violations("seat")[0].lower()
    # As a process: `load` writes other modules' states, which the seat's user may not.
    done = seat_process(server, "load", "--timeout", "5")
    assert done.returncode != 0
    assert any(PERMISSIONS_ERR in w.lower() for w in connection_warnings(done.stderr)), done.stderr


def test_the_seat_serves_its_verb_as_its_user(server: EmbeddedServer, refusals: Refusals) -> None:
    load_the_mesh(server)
    seat, controller = Connected(), Connected()
    with EventLoopThread("permissions") as loop:
        nc = loop.run(seat.connect(server, "seat", SEAT_PASSWORD), 10)
        other = loop.run(controller.connect(server, "controller", CONTROLLER_PASSWORD), 10)
        cache = Cache(nc, states=(*OWN, "mesh-provisioner.applied", "mesh-provisioner.collect"))
        loop.run(cache.start(), 10)
        loop.run(cache.wait_synced(10), 15)
        service = loop.run(serve_verb(nc, cache.view), 10)
        try:
            reply = loop.run(other.request(VERB_SUBJECT, b'{"what": "provisions"}', timeout=5), 10)
            assert [e["key"] for e in json.loads(reply.data)["entries"]] == ["bee.oldapp.postgres-database"]
            ping = loop.run(other.request("$SRV.PING.mesh-provisioner", b"", timeout=5), 10)
            assert json.loads(ping.data)["name"] == "mesh-provisioner"
            info = loop.run(other.request("$SRV.INFO", b"", timeout=5), 10)
            assert json.loads(info.data)["endpoints"][0]["subject"] == VERB_SUBJECT
        finally:
            loop.run(service.stop(), 10)
            loop.run(cache.stop(), 10)
            loop.run(nc.close(), 10)
            loop.run(other.close(), 10)
    assert seat.errors == []
    assert refusals.of("seat") == []


def test_the_controller_cannot_write_the_seats_states(server: EmbeddedServer, refusals: Refusals) -> None:
    controller = Connected()

    async def go() -> None:
        seat_nc = await nats.connect(server.url, user="seat", password=SEAT_PASSWORD)
        try:
            await ensure_buckets(seat_nc.jetstream())  # the seat's own buckets, made by the seat
        finally:
            await seat_nc.close()
        nc = await controller.connect(server, "controller", CONTROLLER_PASSWORD)
        try:
            with pytest.raises(nats.errors.TimeoutError):
                await put(nc, PROVISIONS, "ace.gitea.postgres-database", b'{"state": "provided"}')
            with pytest.raises(nats.errors.TimeoutError):
                await nc.jetstream(timeout=1).delete_key_value("mesh-provisioner_plans")
            # What the seat reads is the controller's to write.
            await nc.jetstream().create_key_value(bucket=bucket(PLACEMENT))
            assert await put(nc, PLACEMENT, "ace", b'{"node": "ace"}') > 0
        finally:
            await nc.close()

    asyncio.run(go())
    assert controller.denied('"$KV.mesh-provisioner_provisions.ace.gitea.postgres-database"')
    assert len(refusals.violations("controller")) == 2
    assert controller.denied('"$JS.API.STREAM.DELETE.KV_mesh-provisioner_plans"')


def test_the_seat_cannot_write_what_it_reads(server: EmbeddedServer, refusals: Refusals) -> None:
    seat = Connected()

    async def go() -> dict[str, Any]:
        controller = await nats.connect(server.url, user="controller", password=CONTROLLER_PASSWORD)
        try:
            await controller.jetstream().create_key_value(bucket=bucket(PLACEMENT))
            await put(controller, PLACEMENT, "ace", b'{"node": "ace", "modules": [{"module": "gitea"}]}')
        finally:
            await controller.close()
        nc = await seat.connect(server, "seat", SEAT_PASSWORD)
        try:
            with pytest.raises(nats.errors.TimeoutError):
                await put(nc, PLACEMENT, "ace", b'{"node": "ace", "modules": []}')
            with pytest.raises(nats.errors.TimeoutError):
                await nc.jetstream(timeout=1).create_key_value(bucket="mesh-controller_other")
            # It reads it, though.
            kv = await nc.jetstream().key_value(bucket(PLACEMENT))
            value: dict[str, Any] = json.loads((await kv.get("ace")).value or b"{}")
            return value
        finally:
            await nc.close()

    assert asyncio.run(go()) == {"node": "ace", "modules": [{"module": "gitea"}]}
    assert seat.denied('"$KV.mesh-controller_placement.ace"')
    assert seat.denied('"$JS.API.STREAM.CREATE.KV_mesh-controller_other"')
    assert len(refusals.violations("seat")) == 2
