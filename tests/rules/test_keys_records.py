"""Contract sections 1 and 2 to 4's records: tokens and keys, and how the records decode and encode."""

from __future__ import annotations

import gc
import json
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest

from mesh_provisioner.contract import MANIFESTS, PROVISIONS, WANTS, bucket
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.memory_view import MemoryView

# ---- section 1: tokens and keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["ace", "mesh-vault", "postgres_db", "A9", "-", "_", "0"])
def test_1_keys_token(word: str) -> None:
    assert k.is_token(word)


@pytest.mark.parametrize("word", ["", "a.b", "a b", "é", "ace\n", "a/b", "a*", ">", "a:b", "\u0660"])
def test_1_keys_not_a_token(word: str) -> None:
    assert not k.is_token(word)


def test_1_keys_bucket_of_a_state() -> None:
    assert bucket("mesh-provisioner.plans") == "mesh-provisioner_plans"
    assert bucket("postgres.bound") == "postgres_bound"


def test_1_keys_join_and_build() -> None:
    assert k.join("ace", "app", "pg", "") == "ace.app.pg"
    assert k.plan_key("ace", "app") == "ace.app"
    assert k.provision_key("ace", "app", "pg") == "ace.app.pg"
    assert k.provision_key("ace", "app", "pg", "main") == "ace.app.pg.main"
    assert k.want_key("ace", "app") == "want.ace.app"
    assert k.node_of("ace.app.pg") == "ace"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: k.join("ace", "a.b"), "'a.b' is not a token ([A-Za-z0-9_-]+)"),
        (lambda: k.plan_key("", "app"), "a key needs every token, and one of ['', 'app'] is empty"),
        (lambda: k.plan_key("ace", "a b"), "'a b' is not a token ([A-Za-z0-9_-]+)"),
        (lambda: k.provision_key("ace", "", "pg"), "a key needs every token, and one of ['ace', '', 'pg'] is empty"),
        (lambda: k.provision_key("ace", "app", "pg", "m.n"), "'m.n' is not a token ([A-Za-z0-9_-]+)"),
    ],
)
def test_1_keys_bad_tokens_raise_bad_key(make: object, message: str) -> None:
    with pytest.raises(k.BadKey) as err:
        make()  # type: ignore[operator]
    assert str(err.value) == message


def test_1_keys_parse() -> None:
    assert k.parse_provision_key("ace.app.pg") == ("ace", "app", "pg", "")
    assert k.parse_provision_key("ace.app.pg.main") == ("ace", "app", "pg", "main")
    assert k.parse_plan_key("ace.app") == ("ace", "app")
    assert k.parse_want_key("want.ace.app") == ("ace", "app")
    assert k.parse_have_key("ace.app") == ("ace", "app")
    assert k.parse_have_key("ace") == ("ace", "")
    assert k.parse_build_key("app.f00d") == ("app", "f00d")
    assert k.parse_token_key("m-app-1", "a manifest id") == "m-app-1"


@pytest.mark.parametrize(
    ("parse", "key", "message"),
    [
        (k.parse_provision_key, "ace.app", "'ace.app' is not a provision key: 3 or 4 tokens joined by dots"),
        (k.parse_provision_key, "a.b.c.d.e", "'a.b.c.d.e' is not a provision key: 3 or 4 tokens joined by dots"),
        (k.parse_provision_key, "ace..pg", "'ace..pg' is not a provision key: 3 or 4 tokens joined by dots"),
        (k.parse_provision_key, "ace.app.p g", "'ace.app.p g' is not a provision key: 3 or 4 tokens joined by dots"),
        (k.parse_plan_key, "ace", "'ace' is not a node and a module: 2 tokens joined by dots"),
        (k.parse_want_key, "ace.app", "'ace.app' is not a want key: 3 tokens joined by dots"),
        (k.parse_want_key, "wish.ace.app", "'wish.ace.app' is not a want key: it does not start with want."),
        (k.parse_have_key, "a.b.c", "'a.b.c' is not a have key: 1 or 2 tokens joined by dots"),
        (k.parse_have_key, "", "'' is not a have key: 1 or 2 tokens joined by dots"),
        (k.parse_build_key, "app", "'app' is not a build key: 2 tokens joined by dots"),
    ],
)
def test_1_keys_bad_keys_raise_bad_key_naming_them(parse: object, key: str, message: str) -> None:
    with pytest.raises(k.BadKey) as err:
        parse(key)  # type: ignore[operator]
    assert str(err.value) == message


def test_1_keys_bad_token_key_names_what_it_should_be() -> None:
    with pytest.raises(k.BadKey, match=r"^'a\.b' is not a module: "):
        k.parse_token_key("a.b", "a module")


def test_4_credential_keys() -> None:
    consumer, provider = r.End("gitea", "ace"), r.End("postgres", "bee")
    assert k.credential_key("own", consumer, provider, "pg", "main") == "ace.gitea.pg-credential.main"
    assert k.credential_key("own", consumer, provider, "pg", "") == "ace.gitea.pg-credential"
    assert k.credential_key("shared", consumer, provider, "pg", "main") == "bee.postgres.pg-credential"
    assert k.credential_key("", consumer, provider, "pg", "main") is None
    assert k.credential_key("mine", consumer, provider, "pg", "main") is None


# ---- section 2 to 4: records ------------------------------------------------------------------------------------


def test_2_records_decode_unknown_fields_ignored() -> None:
    raw = (b'{"provision": "pg", "colour": "blue", "consumer": {"module": "app", "node": "ace", "rack": 3},'
           b' "state": "asked", "v": 1, "future": {"a": [1, 2]}}')
    p = r.decode(r.Provision, raw)
    assert p == r.Provision(provision="pg", consumer=r.End("app", "ace"), state="asked", v=1)


def test_2_records_decode_missing_optional_fields() -> None:
    assert r.decode(r.BoundEntry, b"{}") == r.BoundEntry()
    assert r.decode(r.Want, b'{"fp": "f"}').wanted == "f"
    assert r.decode(r.Want, b'{"fp": "f", "removed": true}').wanted == ""
    assert r.decode(r.Want, b'{"removed": false}').wanted == ""


def test_2_records_decode_wrong_type_error_names_state_and_key() -> None:
    with pytest.raises(r.BadValue) as err:
        r.decode(r.Want, b'{"fp": 3}', state=WANTS, key="want.ace.app")
    assert str(err.value) == "mesh-assigner.wants want.ace.app does not decode: Expected `str`, got `int` - at `$.fp`"
    with pytest.raises(r.BadValue, match=r"^mesh-assigner.wants want.ace.app does not decode: "):
        r.decode(r.Want, b"\xff\xfe", state=WANTS, key="want.ace.app")
    with pytest.raises(r.BadValue, match=r"^Want does not decode: "):
        r.decode(r.Want, b"[]")


def test_2_records_decode_kept_with_why_in_the_view() -> None:
    view = MemoryView()
    e = view.put(WANTS, "want.ace.app", b'{"fp": ["x"]}', 3)
    assert (e.revision, e.value, e.get(r.Want)) == (3, None, None)
    assert e.error == "mesh-assigner.wants want.ace.app does not decode: Expected `str`, got `array` - at `$.fp`"
    assert view.get(WANTS, "want.ace.app") == e


def test_2_records_decoded_into_the_cache_are_not_tracked_by_the_cycle_collector() -> None:
    # The cache holds an entry and a record for nearly every key: tracked, each full collection walked them all.
    view = MemoryView()
    raw = json.dumps({
        "provision": "pg", "state": "provided", "depends-on": ["ace.app.pg.credential"],
        "reference": {"vault-name": "v", "generation": 2}, "at": "2026-12-02T17:42:55Z",
    }).encode()
    e = view.put(PROVISIONS, "ace.app.pg", raw, 3)
    m = view.put(MANIFESTS, "gitea-1", json.dumps({
        "name": "gitea", "requires": [{"provision": "postgres-database", "local": "main", "credential": "own"}],
        "provides": ["forge-account"], "state": ["bound"],
    }).encode(), 4)
    assert isinstance(e.value, r.Provision) and isinstance(m.value, r.Manifest)
    assert not any(gc.is_tracked(x) for x in (e, e.value, m, m.value.requires[0]))
    # A manifest keeps its offers and states once made, in a `__dict__` the collector must see; manifests are few
    # (69 in the 1,000-node benchmark mesh, against 140,000 entries).
    assert m.value.offers() is m.value.offers() and m.value.states() is m.value.states()


def test_2_records_decode_manifest_names_or_objects() -> None:
    m = r.decode(r.Manifest, json.dumps({
        "name": "gitea",
        "requires": [{"provision": "postgres-database", "local": "main", "credential": "own"}],
        "provides": [{"name": "forge-account", "answered-by": "helper"}, "npm-package-registry"],
        "state": ["bound", {"name": "repos"}],
        "reads": ["mesh-provisioner.plans"],
    }).encode())
    assert m.offers() == (r.Offer("forge-account", "helper"), r.Offer("npm-package-registry"))
    assert m.states() == ("bound", "repos")
    assert m.requires == (r.Requirement("postgres-database", "main", "own"),)


def test_2_records_decode_times_with_fractions_and_offsets() -> None:
    p = r.decode(r.Refusal, b'{"since": "2026-12-02T17:42:55.25Z"}')
    assert p.since == datetime(2026, 12, 2, 17, 42, 55, 250000, tzinfo=UTC)
    p = r.decode(r.Refusal, b'{"since": "2026-12-02T18:42:55+01:00"}')
    assert p.since == datetime(2026, 12, 2, 17, 42, 55, tzinfo=UTC)
    with pytest.raises(r.BadValue):
        r.decode(r.Refusal, b'{"since": "yesterday"}')


def test_2_records_encoding_kebab_case_and_empties_left_out() -> None:
    assert r.encode(r.Provision(provision="pg")) == b'{"provision":"pg"}'
    assert r.encode(r.BoundEntry(state="provided", vault_name="v", generation=2)) == (
        b'{"state":"provided","vault-name":"v","generation":2}'
    )
    assert r.encode(r.Offer("forge-account", "helper")) == b'{"name":"forge-account","answered-by":"helper"}'
    p = r.Provision(provision="pg", depends_on=("a.b.c",), at=datetime(2026, 12, 2, 17, 42, 55, tzinfo=UTC), v=1)
    assert r.encode(p) == b'{"provision":"pg","depends-on":["a.b.c"],"at":"2026-12-02T17:42:55Z","v":1}'
    assert r.encode(r.PlanProvision(provision="pg", provider="ace", provider_module="postgres")) == (
        b'{"provision":"pg","provider":"ace","provider-module":"postgres"}'
    )
    assert r.encode(r.Ask(id="a", on_expiry="x")) == b'{"id":"a","on-expiry":"x"}'


def test_2_records_times_encoded_in_utc_with_z() -> None:
    at = datetime(2026, 12, 2, 17, 42, 55, 500000, tzinfo=UTC)
    assert r.encode(r.Refusal(since=at)) == b'{"since":"2026-12-02T17:42:55.500000Z"}'
    # A time given in another zone is still the same instant once decoded.
    other = at.astimezone(timezone(timedelta(hours=2)))
    assert r.decode(r.Refusal, r.encode(r.Refusal(since=other))).since == at


def test_2_records_plan_encoding_deterministic() -> None:
    provisions = (
        r.PlanProvision(provision="cache", provider="ace", provider_module="redis"),
        r.PlanProvision(provision="pg", local="main", provider="bee", provider_module="postgres", credential="own"),
    )
    a = r.PlanRecord(node="ace", module="app", plan=r.Plan(provisions=provisions))
    b = r.decode(r.PlanRecord, json.dumps({
        "plan": {"provisions": [
            {"credential": "own", "provider-module": "postgres", "provider": "bee", "local": "main", "provision": "pg"},
            {"provider-module": "redis", "provider": "ace", "provision": "cache"},
        ][::-1]},
        "module": "app", "node": "ace",
    }).encode())
    assert r.encode(a) == r.encode(b) == (
        b'{"node":"ace","module":"app","plan":{"provisions":['
        b'{"provision":"cache","provider":"ace","provider-module":"redis"},'
        b'{"provision":"pg","local":"main","provider":"bee","provider-module":"postgres","credential":"own"}]}}'
    )
    assert sorted(reversed(provisions)) == list(provisions)  # (provision, local) order



PLUS2 = datetime(2026, 12, 3, 7, 0, tzinfo=timezone(timedelta(hours=2)))


def test_1_times_stamped_in_utc_with_z() -> None:
    from mesh import Mesh, keeper

    from mesh_provisioner.messages.writes import Put
    from mesh_provisioner.rules.node import compose_node

    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("app", "1", requires=["postgres-database", "object-storage"])
    m.module("web", "1", requires=["postgres-database"])
    m.place("ace", "postgres", "app", "web")
    res = compose_node(m.view, "ace", PLUS2)
    stamped = [json.loads(w.value) for w in res.writes if isinstance(w, Put) and w.state != "mesh-provisioner.plans"]
    assert len(stamped) == 2
    assert {t for s in stamped for t in (s.get("at"), s.get("since")) if t} == {"2026-12-03T05:00:00Z"}


@pytest.mark.parametrize("at", ["2026-12-03T07:00:00+02:00", "2026-12-03T05:00:00"])
def test_1_warrant_time_kept_in_utc_with_z(at: str) -> None:
    from mesh import NOW, Mesh, keeper, settle

    from mesh_provisioner.messages.writes import Put
    from mesh_provisioner.rules.retire import ask_of, decide

    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("web", "1", requires=["postgres-database"])
    m.place("ace", "postgres", "web")
    settle(m.view)
    m.place("ace", "postgres")
    settle(m.view)
    key = "ace.web.postgres-database"
    p = r.decode(r.Provision, m.view.get("mesh-provisioner.provisions", key).raw)  # type: ignore[union-attr]
    ask = ask_of(key, p)
    assert ask is not None
    w = {"asker": "mesh-provisioner", "ask": p.ask, "outcome": "chosen", "option": "yes", "at": at}
    m.put("asks.records", p.ask, {"state": "decided", "ask": json.loads(r.encode(ask)), "warrant": w})
    [put] = decide(m.view, key, NOW).writes
    assert isinstance(put, Put)
    assert json.loads(put.value)["warrant"]["at"] == "2026-12-03T05:00:00Z"


def test_decoded_records_share_their_short_strings_and_equal_what_they_decode() -> None:
    # The cache's memory a key (design.md): the names records repeat are held once, whatever decodes them.
    from mesh_provisioner.messages.sharing import shared

    raw = (b'{"provision":"bucket","consumer":{"module":"app","node":"n1"},"provider":{"module":"store","node":"n2"},'
           b'"depends-on":["n2.store.bucket-credential"],"state":"asked","why":"' + b"w" * 200 + b'"}')
    a, b = r.decode(r.Provision, raw), r.decode(r.Provision, raw)
    assert a == msgspec.json.decode(raw, type=r.Provision)
    assert a.consumer.node is b.consumer.node and a.provider.module is b.provider.module
    assert a.depends_on[0] is b.depends_on[0] and a.state is b.state
    assert a.why == b.why and a.why is not b.why, "a long why is seldom repeated: not interned"
    plan = (b'{"node":"n1","module":"app","plan":{"provisions":[{"provision":"db","provider":"n2",'
            b'"provider-module":"pg"}]}}')
    c, d = r.decode(r.PlanRecord, plan), r.decode(r.PlanRecord, plan)
    assert c.plan.provisions[0].provider_module is d.plan.provisions[0].provider_module
    assert shared(c) is c, "shared in place"
