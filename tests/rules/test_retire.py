"""Contract 5.4: retiring is asked (the seeds' `ask`, `retiringAsk`, `Decide` and `retired`)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from mesh import NOW, Mesh, ask_id, keeper, settle

from mesh_provisioner.contract import ASK_RECORDS, ASK_SUBJECT, DECIDED_SUBJECT, PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.retire import (
    Outgoing,
    act,
    act_digest,
    ask_of,
    check_ask,
    decide,
    outgoing,
    raise_ask,
    retiring_ask,
    retiring_keys,
)

KEY = "bee.app.postgres-database"
UNIX = int(NOW.timestamp())
ASK = ask_id(KEY, UNIX)
LATER = NOW + timedelta(hours=2)


def digest(key: str, ask: str, option: str) -> str:
    """The act digest, computed here from the contract's words alone."""
    body = (
        '{"ask":"' + ask + '","option":"' + option + '","provision":"' + key + '","verb":"mesh-provisioner.retire"}'
    )
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()


def retiring() -> Mesh:
    """app on bee no longer needs postgres on ace, which keeps its outcomes in its entries: its key is retiring."""
    m = Mesh()
    keeper(m, "postgres", "postgres-database")
    m.module("app", "1", requires=["postgres-database"])
    m.place("ace", "postgres")
    m.place("bee", "app")
    m.bound("postgres", KEY, state="provided", vault_name="v/pg", generation=1)
    settle(m.view)
    m.place("bee")
    settle(m.view)
    p = m.provision(KEY)
    assert (p.state, p.ask, p.warrant) == ("retiring", ASK, None)
    return m


def the_ask(m: Mesh) -> r.Ask:
    ask = ask_of(KEY, m.provision(KEY))
    assert ask is not None
    return ask


def warrant(outcome: str = "chosen", option: str = "yes", asker: str = "mesh-provisioner", ask: str = ASK) -> r.Warrant:
    return r.Warrant(asker=asker, ask=ask, outcome=outcome, option=option,
                     by=r.Identity(who="operator", kind="person", identity="alice"), at=LATER)


def answer(m: Mesh, w: r.Warrant, ask: r.Ask | None = None, state: str = "decided") -> None:
    m.record(ASK, state, ask or the_ask(m), w)


# ---- the ask ----------------------------------------------------------------------------------------------------


def test_5_4_ask_id_format() -> None:
    key = "bee.app.postgres-database.main"
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    assert k.ask_id(key, 1796274000) == f"retire-bee-app-postgres-database-main-1796274000-{digest}"
    assert k.ask_raised_at(k.ask_id(key, 1796274000)) == 1796274000
    assert k.ask_raised_at("retire-bee-app-postgres-database-main-1796274000") is None  # no hash: not an ask id
    assert k.ask_raised_at(f"retire-bee-app-postgres-database-main-{digest}") is None
    assert retiring().provision(KEY).ask == ASK


def test_5_4_ask_ids_of_keys_that_differ_only_in_dots_and_dashes_never_collide() -> None:
    mine, other = k.ask_id("ace.my-app.db", 1796274000), k.ask_id("ace.my.app-db", 1796274000)
    assert mine != other
    assert (mine, other) == (ask_id("ace.my-app.db", 1796274000), ask_id("ace.my.app-db", 1796274000))
    # The ask of one is never the other's, made again from the key.
    p = r.Provision(provision="db", consumer=r.End("my-app", "ace"), provider=r.End("pg", "ace"), state="retiring",
                    ask=mine)
    assert ask_of("ace.my-app.db", p) is not None
    assert ask_of("ace.my.app-db", p) is None


def test_5_4_subjects() -> None:
    assert (ASK_SUBJECT, DECIDED_SUBJECT) == ("asks.ask.mesh-provisioner", "asks.decided.mesh-provisioner")


def test_5_4_act_digest_exact_value() -> None:
    expected = digest(KEY, ASK, "yes")
    assert act(KEY, ASK, "yes") == {"verb": "mesh-provisioner.retire", "provision": KEY, "ask": ASK, "option": "yes"}
    assert act_digest(act(KEY, ASK, "yes")) == expected
    assert expected == "sha256:" + hashlib.sha256(
        json.dumps(act(KEY, ASK, "yes"), sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert act_digest(act(KEY, ASK, "no")) != expected


def test_5_4_ask_wording_options_and_expiry() -> None:
    p = retiring().provision(KEY)
    at = datetime.fromtimestamp(UNIX, UTC)
    ask = retiring_ask(KEY, p, at, ASK)
    assert ask == r.Ask(
        id=ASK,
        headline="Remove app's postgres-database access?",
        explanation=(
            "Nothing wanted or placed on bee needs postgres-database any more. On Approve, postgres removes app's "
            "access to postgres-database on ace, for app on bee: what it owns is handed to the resource's owner and "
            "its credential goes; the resource and its data stay."
        ),
        who="operator",
        expires=at + timedelta(hours=23, minutes=50),
        on_expiry="nothing is removed; it is asked again when it changes",
        about=f"provision.{KEY}",
        details=f"The provision {KEY} of mesh-provisioner's state provisions.",
        options=(
            r.Option(id="yes", label="Remove",
                     does="the provider removes the credential; the resource and its data stay",
                     level="approve", binds=digest(KEY, ASK, "yes")),
            r.Option(id="no", label="Keep",
                     does="nothing is removed, and it is not asked again while nothing changes",
                     level="approve", binds=digest(KEY, ASK, "no")),
        ),
    )
    encoded = json.loads(r.encode(ask))
    assert list(encoded) == ["id", "headline", "explanation", "who", "expires", "on-expiry", "about", "details",
                             "options"]
    assert encoded["expires"] == "2026-12-04T04:50:00Z"
    assert list(encoded["options"][0]) == ["id", "label", "does", "level", "binds"]


def test_5_4_ask_made_again_from_the_key_alone() -> None:
    m = retiring()
    p = m.provision(KEY)
    again = ask_of(KEY, p)
    assert again == retiring_ask(KEY, p, datetime.fromtimestamp(UNIX, UTC), ASK)
    assert ask_of(KEY, msgspec.structs.replace(p, at=LATER, why="something else")) == again
    assert ask_of(KEY, msgspec.structs.replace(p, ask="")) is None
    assert ask_of(KEY, msgspec.structs.replace(p, ask="retire-bee-app-postgres-database")) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"id": ""}, "the ask has no id"),
        ({"headline": ""}, f"the ask {ASK} has no headline"),
        ({"who": ""}, f"the ask {ASK} says no one to ask"),
        ({"expires": None}, f"the ask {ASK} expires before it is asked"),
        ({"expires": NOW}, f"the ask {ASK} expires before it is asked"),
        ({"options": ()}, f"the ask {ASK} offers no option"),
        ({"options": (r.Option(id="yes", binds="b"), r.Option(id="yes", binds="c"))},
         f"the ask {ASK} has options without distinct ids"),
        ({"options": (r.Option(id="", binds="b"),)}, f"the ask {ASK} has options without distinct ids"),
        ({"options": (r.Option(id="yes", binds="b"), r.Option(id="no"))},
         f"the ask {ASK} has an option bound to no act"),
    ],
    ids=["no-id", "no-headline", "no-who", "no-expiry", "expires-now", "no-option", "same-ids", "empty-id", "no-binds"],
)
def test_5_4_check_ask_refusals(change: dict[str, object], why: str) -> None:
    ask = retiring_ask(KEY, r.Provision(provision="postgres-database"), NOW, ASK)
    assert check_ask(ask, NOW) == ""
    assert check_ask(msgspec.structs.replace(ask, **change), NOW) == why


def test_5_4_raise_ask_keeps_one_raised() -> None:
    p = r.Provision(provision="postgres-database", state="retiring", ask="retire-x-1")
    assert raise_ask(KEY, p, NOW) == (p, "")
    raised, why = raise_ask(KEY, msgspec.structs.replace(p, ask=""), NOW)
    assert (raised.ask, why) == (ASK, "")


def test_5_4_retiring_when_no_longer_needed_and_asked_once() -> None:
    m = retiring()
    p = m.provision(KEY)
    assert p.why == "no build wanted or placed on bee requires postgres-database of postgres on ace any more"
    assert p.reference == r.Reference(id="v/pg", generation=1)
    assert retiring_keys(m.view) == [KEY]
    res = compose_node(m.view, "bee", LATER)
    assert (res.writes, res.composed.retiring_asked) == ([], [])
    assert settle(m.view, LATER).writes == []
    assert m.provision(KEY).ask == ASK


# ---- the answer -------------------------------------------------------------------------------------------------


def test_5_4_decide_nothing_while_open_or_unrecorded() -> None:
    m = retiring()
    d = decide(m.view, KEY, LATER)
    assert (d.said, d.writes) == ("", [])
    m.record(ASK, "open", the_ask(m))
    d = decide(m.view, KEY, LATER)
    assert (d.said, d.writes) == ("", [])


def test_5_4_decide_chosen_yes_writes_warrant() -> None:
    m = retiring()
    answer(m, warrant())
    d = decide(m.view, KEY, LATER)
    assert d.said == f"{KEY}: yes by the operator, as person identity alice"
    assert [(w.state, w.key) for w in d.writes] == [(PROVISIONS, KEY)]
    settle(m.view, LATER)
    p = m.provision(KEY)
    assert (p.state, p.ask) == ("retiring", ASK)
    assert p.warrant == r.ProvisionWarrant(ask=ASK, option="yes", by="the operator, as person identity alice", at=LATER)
    assert decide(m.view, KEY, LATER).writes == []


def test_5_4_decide_warrant_with_no_identity_is_the_operators() -> None:
    m = retiring()
    answer(m, msgspec.structs.replace(warrant(), by=None))
    assert decide(m.view, KEY, LATER).said == f"{KEY}: yes by the operator"


def refused(m: Mesh) -> str:
    d = decide(m.view, KEY, LATER)
    assert d.writes == []
    prefix = f"{KEY}: the answer is refused: "
    assert d.said.startswith(prefix), d.said
    return d.said.removeprefix(prefix)


def test_5_4_decide_refuses_warrant_of_another_asker() -> None:
    m = retiring()
    answer(m, warrant(asker="mesh-controller"))
    assert refused(m) == "the warrant is mesh-controller's, not mesh-provisioner's"
    answer(m, warrant(asker=""))
    assert refused(m) == "the warrant is nobody's, not mesh-provisioner's"


def test_5_4_decide_refuses_warrant_of_another_ask() -> None:
    m = retiring()
    answer(m, warrant(ask="retire-bee-app-x-1"))
    assert refused(m) == f"the warrant answers the ask retire-bee-app-x-1, not {ASK}"


def test_5_4_decide_refuses_record_whose_ask_is_another_and_names_it() -> None:
    m = retiring()
    answer(m, warrant(), msgspec.structs.replace(the_ask(m), id="retire-bee-app-x-1"))
    assert refused(m) == f"the warrant answers the ask retire-bee-app-x-1, not {ASK}"


def test_5_4_decide_refuses_unknown_option() -> None:
    m = retiring()
    answer(m, warrant(option="maybe"))
    assert refused(m) == f"the option 'maybe' is not one the ask {ASK} offered"
    # An option the record's ask offers but a retiring ask never does.
    later = r.Option(id="later", level="approve", binds=digest(KEY, ASK, "later"))
    answer(m, warrant(option="later"), msgspec.structs.replace(the_ask(m), options=(*the_ask(m).options, later)))
    assert refused(m) == f"the option 'later' is not one the ask {ASK} offered"


def test_5_4_decide_refuses_binds_of_another_act() -> None:
    m = retiring()
    ask = the_ask(m)
    other = msgspec.structs.replace(ask.options[0], binds=digest("bee.app.other", ASK, "yes"))
    answer(m, warrant(), msgspec.structs.replace(ask, options=(other, ask.options[1])))
    assert refused(m) == f"the option yes binds another act than retiring {KEY} on the ask {ASK}"


def test_5_4_decide_refuses_unknown_outcome() -> None:
    m = retiring()
    answer(m, warrant(outcome="maybe"))
    assert refused(m) == "the warrant's outcome 'maybe' is none of chosen, expired or withdrawn"


def test_5_4_decide_refuses_record_without_warrant() -> None:
    m = retiring()
    m.record(ASK, "decided", the_ask(m), None)
    assert refused(m) == f"the router's record of {ASK} is decided but holds no ask and warrant"


def test_5_4_decide_record_unreadable_is_said() -> None:
    m = retiring()
    m.raw("asks.records", ASK, b'{"state": "decided", "warrant": "yes"}')
    d = decide(m.view, KEY, LATER)
    assert d.writes == []
    assert d.said.startswith(
        f"{KEY}: the router's record of {ASK} is not readable: asks.records {ASK} does not decode: "
    )


def test_5_4_decide_refuses_what_verify_refuses() -> None:
    m = retiring()
    answer(m, warrant())
    d = decide(m.view, KEY, LATER, verify=lambda w: "the signature does not hold")
    assert (d.said, d.writes) == (f"{KEY}: the answer is refused: the signature does not hold", [])
    assert decide(m.view, KEY, LATER, verify=lambda w: "").writes != []


@pytest.mark.parametrize("outcome", ["expired", "withdrawn"])
def test_5_4_ask_ended_undecided_is_asked_again(outcome: str) -> None:
    m = retiring()
    answer(m, warrant(outcome=outcome, option=""), state=outcome)
    again = ask_id(KEY, int(LATER.timestamp()))
    d = decide(m.view, KEY, LATER)
    assert d.said == f"{KEY}: the ask {ASK} {outcome} with no choice; asked again as {again}"
    [put] = d.writes
    assert (put.state, put.key) == (PROVISIONS, KEY)
    settled = settle(m.view, LATER)
    p = m.provision(KEY)
    # The dead ask is cleared from the key and a new one named in its place: a new id and a new expiry.
    assert (p.state, p.ask, p.warrant) == ("retiring", again, None)
    assert p.why == "no build wanted or placed on bee requires postgres-database of postgres on ace any more"
    ask = ask_of(KEY, p)
    assert ask is not None and ask.expires == LATER + timedelta(hours=23, minutes=50)
    assert settled.written() == [f"{PROVISIONS} {KEY}"]
    # Settled: no retiring key names an ask that ended undecided, and nothing more is written.
    assert retiring_keys(m.view) == [KEY]
    assert m.view.get(ASK_RECORDS, again) is None
    assert settle(m.view, LATER + timedelta(days=3)).writes == []


def test_5_4_ask_ended_undecided_in_the_second_it_was_raised_gets_another_id() -> None:
    m = retiring()
    answer(m, warrant(outcome="withdrawn", option=""), state="withdrawn")
    settle(m.view, NOW)
    # Raised again in the same second, the id would be the dead ask's: JetStream would drop it as a duplicate.
    assert m.provision(KEY).ask == ask_id(KEY, UNIX + 1)


def test_5_4_ask_ended_undecided_on_a_key_that_names_another_why_restores_its_why() -> None:
    m = retiring()
    stale = "the ask expired with no choice; it is asked again when it changes"
    m.put(PROVISIONS, KEY, msgspec.structs.replace(m.provision(KEY), why=stale))
    answer(m, warrant(outcome="expired", option=""), state="expired")
    settle(m.view, LATER)
    assert m.provision(KEY).why == (
        "no build wanted or placed on bee requires postgres-database of postgres on ace any more"
    )


def test_5_4_ask_checked_just_before_it_is_published() -> None:
    m = retiring()
    out = outgoing(m.view, KEY, LATER)
    assert (out.ask, out.said, out.writes) == (the_ask(m), "", [])
    # Its expiry passed before it went out: it is made again, and the new one goes out in its place.
    late = NOW + timedelta(hours=23, minutes=50)
    out = outgoing(m.view, KEY, late)
    again = ask_id(KEY, int(late.timestamp()))
    assert out.ask is None
    assert out.said == f"{KEY}: the ask {ASK} expired before it went out; asked again as {again}"
    [put] = out.writes
    m.put(PROVISIONS, KEY, r.decode(r.Provision, put.value))
    out = outgoing(m.view, KEY, late)
    assert out.ask is not None and out.ask.id == again and out.ask.expires == late + timedelta(hours=23, minutes=50)
    assert check_ask(out.ask, late) == ""


@pytest.mark.parametrize("ask", ["retire-bee-app-postgres-database-1796274000", ask_id("bee.app.other", UNIX)])
def test_5_4_ask_the_key_does_not_make_is_made_again(ask: str) -> None:
    m = retiring()
    m.put(PROVISIONS, KEY, msgspec.structs.replace(m.provision(KEY), ask=ask))
    out = outgoing(m.view, KEY, LATER)
    assert out.ask is None
    again = ask_id(KEY, int(LATER.timestamp()))
    assert out.said == f"{KEY}: its ask {ask!r} is not one this key makes; asked again as {again}"
    assert len(out.writes) == 1


def test_5_4_outgoing_is_nothing_for_a_key_that_waits_for_no_ask() -> None:
    m = retiring()
    answer(m, warrant())
    settle(m.view, LATER)
    assert outgoing(m.view, KEY, LATER) == Outgoing()  # answered: its warrant is in the key
    assert outgoing(m.view, "bee.app.nothing", LATER) == Outgoing()


def test_5_4_declined_is_kept_and_not_asked_again() -> None:
    m = retiring()
    answer(m, warrant(option="no"))
    settle(m.view, LATER)
    m.unbind("postgres", KEY)
    assert settle(m.view, LATER + timedelta(days=3)).writes == []
    p = m.provision(KEY)
    assert (p.state, p.ask, p.warrant.option if p.warrant else None) == ("retiring", ASK, "no")


def test_5_4_retired_only_after_the_providers_entry_is_gone_with_a_yes_warrant() -> None:
    m = retiring()
    m.unbind("postgres", KEY)  # gone before any answer: nothing happens
    assert settle(m.view, LATER).writes == []
    m.bound("postgres", KEY, state="provided")
    answer(m, warrant())
    settle(m.view, LATER)
    assert rejudge(m.view, KEY, LATER).writes == []  # approved, the entry still there
    m.unbind("postgres", KEY)
    j = rejudge(m.view, KEY, LATER)
    assert j.said == f"{KEY} retired: its provider removed its credential on the operator's warrant"
    assert [(type(w).__name__, w.key) for w in j.writes] == [("Delete", KEY)]
    # The node's composition retires it just the same.
    res = compose_node(m.view, "bee", LATER)
    assert res.composed.provisions_changed == [
        f"{KEY} (retired: its provider removed its credential on the operator's warrant)"
    ]
    settle(m.view, LATER)
    assert m.states() == {}


def test_5_4_approved_key_of_a_provider_judged_by_its_have_stays() -> None:
    m = Mesh()
    m.module("postgres", "1", provides=["postgres-database"])
    m.module("app", "1", requires=["postgres-database"])
    m.place("ace", "postgres")
    m.place("bee", "app")
    settle(m.view)
    m.place("bee")
    settle(m.view)
    answer(m, warrant())
    settle(m.view, LATER)
    assert m.provision(KEY).warrant is not None
    assert m.states() == {KEY: "retiring"}


def test_5_4_retiring_key_needed_again_returns_to_its_outcome() -> None:
    m = retiring()
    answer(m, warrant())
    settle(m.view, LATER)
    m.place("bee", "app")
    settle(m.view, LATER)
    p = m.provision(KEY)
    assert (p.state, p.why, p.ask, p.warrant) == ("provided", "", "", None)
    assert p.reference == r.Reference(id="v/pg", generation=1)
