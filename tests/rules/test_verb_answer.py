"""Contract 9: the seat's verb answers what the seat keeps, narrowed by node, module and collection."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mesh_provisioner.contract import APPLIED, COLLECT, NEEDS, PLANS, PROVISIONS, REFUSED, REGISTRY
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.verb import answer

PLAN_ACE_GITEA = {"node": "ace", "module": "gitea", "plan": {"provisions": [
    {"provision": "postgres-database", "local": "main", "provider": "ace", "provider-module": "postgres",
     "credential": "own"}]}}
PLAN_BEE_WEBAPP = {"node": "bee", "module": "webapp", "plan": {"provisions": []}}


def provision(node: str, consumer: str, state: str) -> dict[str, Any]:
    return {"provision": "postgres-database", "consumer": {"module": consumer, "node": node},
            "provider": {"module": "postgres", "node": "ace"}, "state": state, "v": 1}


def view() -> MemoryView:
    """The seat's states and the clients' applied and collect, put in out of order."""
    v = MemoryView()
    values: dict[str, dict[str, Any]] = {
        PLANS: {"bee.webapp": PLAN_BEE_WEBAPP, "ace.gitea": PLAN_ACE_GITEA},
        PROVISIONS: {
            "bee.webapp.postgres-database": provision("bee", "webapp", "failed"),
            "ace.gitea.postgres-database.main": provision("ace", "gitea", "provided"),
            "ace.mailer.postgres-database.mail": provision("ace", "mailer", "asked"),
        },
        REFUSED: {"bee.reports": {"node": "bee", "module": "reports", "why": "no placed module provides storage"}},
        REGISTRY: {"forge": {"kind": "forge", "domain": "git.example.org"},
                   "default": {"kind": "default", "domain": "example.org"}},
        NEEDS: {"ace.gitea": {"old": True}},
        APPLIED: {"ace.gitea": {"at": "2026-12-02T17:42:55Z"}, "bee.webapp": {"at": "2026-12-02T18:00:00Z"}},
        COLLECT: {
            "dns.ace.gitea": {"items": ["git.example"]},
            "dns.bee.webapp": {"items": ["app.example"]},
            "tls.ace.gitea": {"items": ["git.example"]},
        },
    }
    revision = 0
    for state, kv in values.items():
        for key, value in kv.items():
            revision += 1
            v.put(state, key, json.dumps(value).encode(), revision)
    return v


def ask(request: Any, v: MemoryView | None = None) -> dict[str, Any]:
    raw = request if isinstance(request, bytes) else json.dumps(request).encode()
    reply: dict[str, Any] = json.loads(answer(view() if v is None else v, raw))
    return reply


def keys(reply: dict[str, Any]) -> list[str]:
    assert "error" not in reply, reply
    return [e["key"] for e in reply["entries"]]


def test_provisions_by_default_sorted_with_values_as_json() -> None:
    reply = ask({})
    assert keys(reply) == ["ace.gitea.postgres-database.main", "ace.mailer.postgres-database.mail",
                           "bee.webapp.postgres-database"]
    assert reply["entries"][0]["value"] == provision("ace", "gitea", "provided")
    assert ask({"what": "provisions"}) == reply


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("plans", ["ace.gitea", "bee.webapp"]),
        ("refused", ["bee.reports"]),
        ("applied", ["ace.gitea", "bee.webapp"]),
        ("collect", ["dns.ace.gitea", "dns.bee.webapp", "tls.ace.gitea"]),
    ],
)
def test_each_what_reads_its_state(what: str, expected: list[str]) -> None:
    assert keys(ask({"what": what})) == expected


def test_plan_values_are_the_stored_records() -> None:
    entries = ask({"what": "plans", "node": "ace"})["entries"]
    assert entries == [{"key": "ace.gitea", "value": PLAN_ACE_GITEA}]


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"node": "ace"}, ["ace.gitea.postgres-database.main", "ace.mailer.postgres-database.mail"]),
        ({"node": "ace", "module": "mailer"}, ["ace.mailer.postgres-database.mail"]),
        ({"module": "webapp"}, ["bee.webapp.postgres-database"]),
        ({"node": "cid"}, []),
        ({"what": "plans", "module": "gitea"}, ["ace.gitea"]),
        ({"what": "applied", "node": "bee"}, ["bee.webapp"]),
        ({"what": "refused", "node": "ace"}, []),
        ({"what": "collect", "collection": "dns"}, ["dns.ace.gitea", "dns.bee.webapp"]),
        ({"what": "collect", "node": "ace"}, ["dns.ace.gitea", "tls.ace.gitea"]),
        ({"what": "collect", "collection": "tls", "node": "ace", "module": "gitea"}, ["tls.ace.gitea"]),
        ({"what": "collect", "module": "webapp"}, ["dns.bee.webapp"]),
        ({"what": "plans", "collection": "dns"}, ["ace.gitea", "bee.webapp"]),
        ({"what": "provisions", "node": "ace", "flavour": "unknown fields are ignored"},
         ["ace.gitea.postgres-database.main", "ace.mailer.postgres-database.mail"]),
    ],
)
def test_filters_narrow_by_node_module_and_collection(request_: dict[str, str], expected: list[str]) -> None:
    assert keys(ask(request_)) == expected


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (b"what=plans", "the request is not JSON: "),
        (b"", "the request is not JSON: "),
        (b"[1, 2]", "the request is not an object of what, node, module and collection: Expected `object`"),
        (b'{"what": 3}', "the request is not an object of what, node, module and collection: Expected `str`"),
        ({"what": "secrets"}, "the request asks for 'secrets', which is none of plans, provisions, refused, "
                              "registry, needs, applied, collect"),
        ({"what": ""}, "the request asks for '', which is none of"),
        ({"node": "ace.gitea"}, "the request's node 'ace.gitea' is not a token ([A-Za-z0-9_-]+)"),
        ({"what": "plans", "module": "a b"}, "the request's module 'a b' is not a token"),
        ({"what": "collect", "collection": "dns.>"}, "the request's collection 'dns.>' is not a token"),
    ],
)
def test_bad_requests_get_an_error(request_: Any, error: str) -> None:
    reply = ask(request_)
    assert list(reply) == ["error"]
    assert reply["error"].startswith(error)


def test_a_stored_value_that_is_not_json_is_named_and_the_rest_answered() -> None:
    v = view()
    v.put(APPLIED, "ace.keycloak", b"{not json", 99)
    entries = ask({"what": "applied", "node": "ace"}, v)["entries"]
    assert [e["key"] for e in entries] == ["ace.gitea", "ace.keycloak"]
    assert entries[1]["value"] is None
    assert entries[1]["error"].startswith("mesh-provisioner.applied ace.keycloak is not JSON: ")
    assert "error" not in entries[0]


def test_an_empty_view_answers_no_entries() -> None:
    for what in ("plans", "provisions", "refused", "applied", "collect"):
        assert ask({"what": what}, MemoryView()) == {"entries": []}


def test_9_the_verb_answers_what_registry_and_what_needs() -> None:
    assert ask({"what": "registry"}) == {"entries": [
        {"key": "default", "value": {"kind": "default", "domain": "example.org"}},
        {"key": "forge", "value": {"kind": "forge", "domain": "git.example.org"}},
    ]}
    assert ask({"what": "needs"}) == {"entries": [{"key": "ace.gitea", "value": {"old": True}}]}
    assert ask({"what": "needs"}, MemoryView()) == {"entries": []}
