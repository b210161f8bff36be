"""Contract 9 on a real nats-server: the verb as a NATS micro service, answered from the watched cache."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import NatsServer, seed_buckets, wait_until
from nats.aio.client import Client
from nats.micro.service import Service

from mesh_provisioner.bus.cache import Cache
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.bus.verb import serve_verb, version
from mesh_provisioner.contract import (
    APPLIED,
    COLLECT,
    NEEDS,
    PLANS,
    PROVISIONS,
    REFUSED,
    REGISTRY,
    VERB_SERVICE,
    VERB_SUBJECT,
    bucket,
)
from mesh_provisioner.rules.memory_view import MemoryView

STATES = (PLANS, PROVISIONS, REFUSED, REGISTRY, NEEDS, APPLIED, COLLECT)

VALUES: dict[str, dict[str, Any]] = {
    PLANS: {
        "ace.gitea": {"node": "ace", "module": "gitea", "plan": {"provisions": [
            {"provision": "postgres-database", "local": "main", "provider": "ace", "provider-module": "postgres"}]}},
        "bee.webapp": {"node": "bee", "module": "webapp", "plan": {"provisions": []}},
    },
    PROVISIONS: {
        "ace.gitea.postgres-database.main": {"provision": "postgres-database", "local": "main", "state": "provided",
                                             "consumer": {"module": "gitea", "node": "ace"},
                                             "provider": {"module": "postgres", "node": "ace"}, "v": 1},
        "bee.webapp.oidc-client": {"provision": "oidc-client", "state": "asked",
                                   "consumer": {"module": "webapp", "node": "bee"},
                                   "provider": {"module": "keycloak", "node": "ace"}, "v": 1},
    },
    REFUSED: {"bee.reports": {"node": "bee", "module": "reports", "why": "no placed module provides object-storage"}},
    REGISTRY: {"default": {"kind": "default", "domain": "example.org"}},
    NEEDS: {"bee.webapp": {"old": True}},
    APPLIED: {"ace.gitea": {"at": "2026-12-02T17:42:55Z"}},
    COLLECT: {"dns.ace.gitea": {"items": ["git.example"]}, "tls.bee.webapp": {"items": ["app.example"]}},
}


def put(loop: EventLoopThread, client: Client, state: str, key: str, value: Any) -> None:
    async def go() -> None:
        kv = await client.jetstream().key_value(bucket(state))
        await kv.put(key, json.dumps(value).encode())

    loop.run(go(), 10)


class Served:
    """A seat's cache of the verb's states and the verb served from it; requests as another module makes them."""

    def __init__(self, loop: EventLoopThread, nc: Client, other: Client) -> None:
        self.loop, self.other = loop, other
        self.cache = Cache(nc, states=STATES)
        loop.run(self.cache.start(), 10)
        loop.run(self.cache.wait_synced(10), 15)
        self.service: Service = loop.run(serve_verb(nc, self.cache.view), 10)

    def raw(self, subject: str, data: bytes) -> tuple[dict[str, Any], dict[str, str]]:
        msg = self.loop.run(self.other.request(subject, data, timeout=5), 10)
        body: dict[str, Any] = json.loads(msg.data)
        return body, dict(msg.headers or {})

    def ask(self, request: Any) -> dict[str, Any]:
        return self.raw(VERB_SUBJECT, json.dumps(request).encode())[0]

    def keys(self, request: Any) -> list[str]:
        reply = self.ask(request)
        assert "error" not in reply, reply
        return [e["key"] for e in reply["entries"]]

    def stop(self) -> None:
        self.loop.run(self.service.stop(), 10)
        self.loop.run(self.cache.stop(), 10)


@pytest.fixture
def served(loop: EventLoopThread, nats_server: NatsServer, nc: Client, other: Client) -> Iterator[Served]:
    seed_buckets(nats_server.url, STATES)
    for state, kv in VALUES.items():
        for key, value in kv.items():
            put(loop, other, state, key, value)
    s = Served(loop, nc, other)
    yield s
    s.stop()


def test_each_what_answers_its_state_with_values_as_json(served: Served) -> None:
    reply = served.ask({})
    assert [e["key"] for e in reply["entries"]] == ["ace.gitea.postgres-database.main", "bee.webapp.oidc-client"]
    assert reply["entries"][0]["value"] == VALUES[PROVISIONS]["ace.gitea.postgres-database.main"]
    assert served.keys({"what": "plans"}) == ["ace.gitea", "bee.webapp"]
    assert served.keys({"what": "refused"}) == ["bee.reports"]
    assert served.ask({"what": "applied"}) == {"entries": [{"key": "ace.gitea", "value": VALUES[APPLIED]["ace.gitea"]}]}
    assert served.keys({"what": "collect"}) == ["dns.ace.gitea", "tls.bee.webapp"]
    assert served.ask({"what": "registry"}) == {"entries": [{"key": "default", "value": VALUES[REGISTRY]["default"]}]}
    assert served.ask({"what": "needs"}) == {"entries": [{"key": "bee.webapp", "value": VALUES[NEEDS]["bee.webapp"]}]}


def test_filters(served: Served) -> None:
    assert served.keys({"node": "bee"}) == ["bee.webapp.oidc-client"]
    assert served.keys({"what": "provisions", "node": "ace", "module": "gitea"}) == ["ace.gitea.postgres-database.main"]
    assert served.keys({"what": "plans", "module": "webapp"}) == ["bee.webapp"]
    assert served.keys({"what": "collect", "collection": "tls"}) == ["tls.bee.webapp"]
    assert served.keys({"what": "collect", "node": "ace", "module": "gitea"}) == ["dns.ace.gitea"]
    assert served.keys({"what": "applied", "node": "bee"}) == []


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"plans please", "the request is not JSON"),
        (b'{"what": "secrets"}', "the request asks for 'secrets', which is none of"),
        (b'{"node": "ace.>"}', "the request's node 'ace.>' is not a token"),
    ],
)
def test_errors_are_answered_with_why(served: Served, data: bytes, error: str) -> None:
    body, headers = served.raw(VERB_SUBJECT, data)
    assert list(body) == ["error"]
    assert body["error"].startswith(error)
    assert headers["Nats-Service-Error-Code"] == "400"


def test_answers_follow_the_bus(served: Served, loop: EventLoopThread, other: Client) -> None:
    put(loop, other, APPLIED, "bee.webapp", {"at": "2026-12-02T18:00:00Z"})
    wait_until(lambda: served.keys({"what": "applied"}) == ["ace.gitea", "bee.webapp"], what="the new key answered")


def test_discoverable_by_ping_and_info(served: Served) -> None:
    ping, _ = served.raw(f"$SRV.PING.{VERB_SERVICE}", b"")
    assert (ping["type"], ping["name"], ping["version"], ping["id"]) == (
        "io.nats.micro.v1.ping_response", "mesh-provisioner", version(), served.service.id)
    everyone, _ = served.raw("$SRV.PING", b"")
    assert everyone["name"] == "mesh-provisioner"
    info, _ = served.raw(f"$SRV.INFO.{VERB_SERVICE}", b"")
    assert info["type"] == "io.nats.micro.v1.info_response"
    assert [(e["name"], e["subject"]) for e in info["endpoints"]] == [("provisioning", "mesh-provisioner.provisioning")]
    assert "contract 9" in info["description"]
    served.ask({"what": "plans"})
    stats, _ = served.raw(f"$SRV.STATS.{VERB_SERVICE}.{served.service.id}", b"")
    assert stats["endpoints"][0]["num_requests"] >= 1


def test_a_view_given_as_a_callable_is_read_at_each_request(loop: EventLoopThread, nc: Client, other: Client) -> None:
    views = [MemoryView()]
    service = loop.run(serve_verb(nc, lambda: views[-1], service_version="1.2.3"), 10)
    try:
        msg = loop.run(other.request(VERB_SUBJECT, b'{"what": "plans"}', timeout=5), 10)
        assert json.loads(msg.data) == {"entries": []}
        fresh = MemoryView()
        fresh.put(PLANS, "ace.gitea", json.dumps(VALUES[PLANS]["ace.gitea"]).encode(), 1)
        views.append(fresh)
        msg = loop.run(other.request(VERB_SUBJECT, b'{"what": "plans"}', timeout=5), 10)
        assert [e["key"] for e in json.loads(msg.data)["entries"]] == ["ace.gitea"]
        ping = loop.run(other.request(f"$SRV.PING.{VERB_SERVICE}", b"", timeout=5), 10)
        assert json.loads(ping.data)["version"] == "1.2.3"
    finally:
        loop.run(service.stop(), 10)


def test_8_1_a_state_a_partitioned_seat_keeps_in_part_is_answered_from_the_bus(
    loop: EventLoopThread, nats_server: NatsServer, nc: Client, other: Client
) -> None:
    # A partitioned seat's memory holds of plans, provisions and refusals only what its judgments read (8.1); the
    # verb answers every node's all the same (9), reading those from the bus: a node's keys alone when the request
    # names one. The view here holds nothing at all: the states it holds whole, and the nodes whose keys it holds all
    # of, are answered from it.
    seed_buckets(nats_server.url, STATES)
    for state, kv in VALUES.items():
        for key, value in kv.items():
            put(loop, other, state, key, value)
    many = [f"cat.webapp.oidc-client.n{i}" for i in range(300)]  # another node's: not read for bee's

    async def more() -> None:
        kv = await other.jetstream().key_value(bucket(PROVISIONS))
        for key in many:
            await kv.put(key, json.dumps(VALUES[PROVISIONS]["bee.webapp.oidc-client"]).encode())
        await kv.put("bee.webapp.gone", b"{}")
        await kv.delete("bee.webapp.gone")
        await kv.put("bee", b"{}")  # no key of the contract's (one token), but answered for bee as from memory

    loop.run(more(), 30)
    def held(state: str, node: str) -> bool:
        return state not in (PLANS, PROVISIONS, REFUSED) or node == "ace"

    service = loop.run(serve_verb(nc, MemoryView(), held=held), 10)
    try:
        def keys(request: dict[str, str]) -> list[str]:
            msg = loop.run(other.request(VERB_SUBJECT, json.dumps(request).encode(), timeout=5), 10)
            return [e["key"] for e in json.loads(msg.data)["entries"]]

        assert keys({}) == sorted(["bee", *VALUES[PROVISIONS], *many])
        received = nc.stats["in_msgs"]
        assert keys({"node": "bee"}) == ["bee", "bee.webapp.oidc-client"], "a key deleted is no key"
        # The request, the stream's subjects under bee (2: one deleted), each of them and bee itself: not the bucket's
        # 303 keys.
        assert nc.stats["in_msgs"] - received <= 5
        assert keys({"what": "plans", "node": "bee"}) == ["bee.webapp"]
        assert keys({"what": "plans", "node": "dog"}) == []
        assert keys({"what": "refused"}) == ["bee.reports"]
        assert keys({"what": "applied"}) == [], "a state the view holds whole is answered from the view"
        assert keys({"what": "plans", "node": "ace"}) == [], "a node's keys the view holds all of are answered from it"
    finally:
        loop.run(service.stop(), 10)
