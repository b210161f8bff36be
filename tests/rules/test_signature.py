"""Contract 5.4 with a router key: a warrant is taken only with the router's ed25519 signature over it."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from mesh_provisioner.contract import ASK_RECORDS, MODULE, PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.retire import decide, retiring_ask
from mesh_provisioner.rules.signature import make_verify, signed_bytes, warrant_signature_why

NOW = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
LATER = NOW + timedelta(hours=2)
KEY = "bee.app.postgres-database"
ASK = k.ask_id(KEY, int(NOW.timestamp()))

ROUTER = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()


def public_b64(private: Ed25519PrivateKey) -> str:
    """A private key's public half as the configuration gives it: base64 of its 32 raw bytes."""
    return base64.b64encode(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


KEY_B64 = public_b64(ROUTER)


def unsigned(option: str = "yes") -> r.Warrant:
    return r.Warrant(asker=MODULE, ask=ASK, outcome="chosen", option=option,
                     by=r.Identity(who="operator", kind="person", identity="alice"), at=LATER)


def signed(w: r.Warrant, by: Ed25519PrivateKey = ROUTER) -> r.Warrant:
    """The warrant with the signature a router holding `by` makes, computed from the contract's words alone."""
    body = json.loads(r.encode(w))
    body.pop("sig", None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return msgspec.structs.replace(w, sig=base64.b64encode(by.sign(canonical)).decode())


def test_the_signed_form_is_the_warrant_as_sorted_compact_json_without_sig() -> None:
    w = signed(unsigned())
    assert signed_bytes(w) == (
        b'{"ask":"' + ASK.encode() + b'","asker":"mesh-provisioner","at":"2026-12-03T07:00:00Z",'
        b'"by":{"identity":"alice","kind":"person","who":"operator"},"option":"yes","outcome":"chosen"}'
    )
    assert signed_bytes(w) == signed_bytes(unsigned())


def test_a_valid_signature_is_taken_with_the_key_in_base64_or_hex() -> None:
    w = signed(unsigned())
    assert warrant_signature_why(w, KEY_B64) == ""
    assert warrant_signature_why(w, base64.b64decode(KEY_B64).hex()) == ""
    assert warrant_signature_why(w, KEY_B64.rstrip("=")) == ""
    assert make_verify(KEY_B64)(w) == ""


def test_a_warrant_the_router_kept_on_the_bus_verifies_after_decoding() -> None:
    w = signed(unsigned())
    again = r.decode(r.Warrant, r.encode(w), state=ASK_RECORDS, key=ASK)
    assert warrant_signature_why(again, KEY_B64) == ""


@pytest.mark.parametrize(
    ("warrant", "why"),
    [
        (signed(unsigned(), by=OTHER),
         "the warrant's signature does not verify with the router's key: the router did not sign it, "
         "or it was changed since"),
        (msgspec.structs.replace(signed(unsigned("no")), option="yes"),
         "the warrant's signature does not verify with the router's key: the router did not sign it, "
         "or it was changed since"),
        (unsigned(), "the warrant is not signed, and the seat takes only warrants the router signed"),
        (msgspec.structs.replace(unsigned(), sig="not base64 at all!"), "the warrant's signature is not base64"),
        (msgspec.structs.replace(unsigned(), sig=base64.b64encode(b"short").decode()),
         "the warrant's signature is 5 bytes, not the 64 of an ed25519 signature"),
    ],
    ids=["forged", "tampered", "missing", "garbage", "short"],
)
def test_a_warrant_not_signed_by_the_router_is_refused_with_why(warrant: r.Warrant, why: str) -> None:
    assert warrant_signature_why(warrant, KEY_B64) == why
    assert make_verify(KEY_B64)(warrant) == why


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "the router's key is not valid: the router's key is empty"),
        ("%%%", "the router's key is not valid: the router's key is neither base64 nor hex"),
        (base64.b64encode(b"x" * 16).decode(),
         "the router's key is not valid: the router's key is 16 bytes, not the 32 of an ed25519 public key"),
    ],
    ids=["empty", "garbage", "short"],
)
def test_a_router_key_that_is_not_valid_refuses_every_warrant(key: str, why: str) -> None:
    w = signed(unsigned())
    assert warrant_signature_why(w, key) == why
    assert make_verify(key)(w) == why


# ---- through the answer of a retiring key (rules.retire.decide) ---------------------------------------------------


def retiring_view(w: r.Warrant) -> MemoryView:
    """A retiring key whose ask the router has decided with warrant `w`."""
    view = MemoryView()
    p = r.Provision(provision="postgres-database", consumer=r.End(module="app", node="bee"),
                    provider=r.End(module="postgres", node="ace"), state=r.RETIRING, ask=ASK, at=NOW, v=1)
    view.put(PROVISIONS, KEY, r.encode(p), 7)
    record = r.AskRecord(state="decided", ask=retiring_ask(KEY, p, NOW, ASK), warrant=w)
    view.put(ASK_RECORDS, ASK, r.encode(record), 3)
    return view


def test_decide_refuses_a_forged_warrant_and_writes_nothing() -> None:
    view = retiring_view(signed(unsigned(), by=OTHER))
    d = decide(view, KEY, LATER, verify=lambda w: warrant_signature_why(w, KEY_B64))
    assert d.writes == []
    assert d.said == (
        f"{KEY}: the answer is refused: the warrant's signature does not verify with the router's key: "
        "the router did not sign it, or it was changed since"
    )


def test_decide_refuses_an_unsigned_warrant_when_a_key_is_configured() -> None:
    view = retiring_view(unsigned())
    d = decide(view, KEY, LATER, verify=make_verify(KEY_B64))
    assert d.writes == []
    assert "the warrant is not signed" in d.said


def test_decide_takes_a_valid_signature_and_writes_the_warrant() -> None:
    view = retiring_view(signed(unsigned()))
    d = decide(view, KEY, LATER, verify=lambda w: warrant_signature_why(w, KEY_B64))
    assert d.said == f"{KEY}: yes by the operator, as person identity alice"
    assert [(w.state, w.key, w.revision) for w in d.writes] == [(PROVISIONS, KEY, 7)]
    written = d.writes[0]
    assert isinstance(written, Put)
    p = r.decode(r.Provision, written.value, state=PROVISIONS, key=KEY)
    assert p.warrant == r.ProvisionWarrant(ask=ASK, option="yes", by="the operator, as person identity alice",
                                           at=LATER)


def test_decide_verifies_the_warrant_as_the_router_wrote_it() -> None:
    # A router's warrant may carry a field this seat does not know, and write its time another way: the signature
    # covers what it wrote, so the check reads the warrant object of the record, not the seat's re-encoding of it.
    view = retiring_view(unsigned())
    record = json.loads(view.get(ASK_RECORDS, ASK).raw)  # type: ignore[union-attr]
    warrant = {**record["warrant"], "at": "2026-12-03T07:00:00.000Z", "router-shard": "eu-1"}
    payload = json.dumps(warrant, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    warrant["sig"] = base64.b64encode(ROUTER.sign(payload)).decode()
    view.put(ASK_RECORDS, ASK, json.dumps({**record, "warrant": warrant}).encode(), 4)
    d = decide(view, KEY, LATER, verify=make_verify(KEY_B64))
    assert d.said == f"{KEY}: yes by the operator, as person identity alice"
    # The same warrant with its unknown field changed no longer verifies.
    view.put(ASK_RECORDS, ASK, json.dumps({**record, "warrant": {**warrant, "router-shard": "us-1"}}).encode(), 5)
    assert "does not verify" in decide(view, KEY, LATER, verify=make_verify(KEY_B64)).said
