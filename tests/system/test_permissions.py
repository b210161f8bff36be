"""deploy/nats-server.conf on a real nats-server: the seat does all it does as its user, and only that.

The shipped configuration is started as it is (its passwords from the environment; port and store from the command
line, which override the file's). Another module (`controller`) loads the sample mesh into the buckets the seat reads
(contract section 2); the seat runs as `seat` until it settles and writes its states (section 4), publishes its ask
(5.4) and serves its verb (9). The server logs every permissions violation: the seat must cause none. Then each user
tries what it may not: the controller writing the seat's states, the seat writing the controller's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.connection import ensure_buckets
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


def violations(server: EmbeddedServer, user: str) -> list[str]:
    """The server's log lines of permissions violations by a user."""
    lines = server.log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if "Violation" in line and f'/user:{user}"' in line]


def load_the_mesh(server: EmbeddedServer) -> None:
    """The sample mesh: other modules' states as the controller, the seat's one old provision as the seat."""
    mesh = sample_mesh()
    own = {state: values for state, values in mesh.items() if state in OWN}
    others = {state: values for state, values in mesh.items() if state not in OWN}
    controller = as_user(server, "controller", CONTROLLER_PASSWORD)
    asyncio.run(load_states(controller, others))
    asyncio.run(router_stream(controller))
    asyncio.run(load_states(as_user(server, "seat", SEAT_PASSWORD), own))


def test_the_seat_settles_and_serves_as_its_user_without_a_violation(server: EmbeddedServer) -> None:
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
    assert violations(server, "seat") == []
    assert violations(server, "controller") == []


def test_reconcile_takes_the_lease_and_writes_as_the_seats_user(server: EmbeddedServer) -> None:
    load_the_mesh(server)
    done = subprocess.run(
        [sys.executable, "-m", "mesh_provisioner", "--nats", server.url, "--user", "seat", "--password", SEAT_PASSWORD,
         "reconcile", "--timeout", "60"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "gave the seat's lease back" in done.stderr
    assert violations(server, "seat") == []


def test_the_seat_serves_its_verb_as_its_user(server: EmbeddedServer) -> None:
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
    assert violations(server, "seat") == []


def test_the_controller_cannot_write_the_seats_states(server: EmbeddedServer) -> None:
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
    assert len(violations(server, "controller")) == 2
    assert controller.denied('"$JS.API.STREAM.DELETE.KV_mesh-provisioner_plans"')


def test_the_seat_cannot_write_what_it_reads(server: EmbeddedServer) -> None:
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
    assert len(violations(server, "seat")) == 2
