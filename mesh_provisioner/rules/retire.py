"""Retiring is asked (contract 5.4; the seeds' clause 5): the ask, its act digest, its check, and the answer.

A key no longer needed turns `retiring`, and one approve ask under mesh-provisioner's name says what goes from which
provider on which node. The ask id is kept in the key before the ask is published, and the whole ask is made again
from the key alone, so a seat that crashed in between publishes the very same ask (same `Nats-Msg-Id`), never a
second one (design.md, property 4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from mesh_provisioner.contract import ASK_RECORDS, MODULE, NEEDS, RETIRE_VERB, bound
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.judge import keeps_entries
from mesh_provisioner.rules.view import View
from mesh_provisioner.rules.writing import Writes, provision_of, utc

# The approving option is "yes": a provider lets its entry go only on it (the seeds, review of 2026-10-30).
OPTION_APPROVE: Final = "yes"
OPTION_DECLINE: Final = "no"
ASK_LASTS: Final = timedelta(hours=23, minutes=50)
OPERATOR: Final = "operator"
APPROVE_LEVEL: Final = "approve"

_OPTIONS: Final = (
    (OPTION_APPROVE, "Remove", "the provider removes the credential; the resource and its data stay"),
    (OPTION_DECLINE, "Keep", "nothing is removed, and it is not asked again while nothing changes"),
)


def act(key: str, ask: str, option: str) -> dict[str, str]:
    """The act an option of a retiring ask performs."""
    return {"verb": RETIRE_VERB, "provision": key, "ask": ask, "option": option}


def act_digest(an_act: dict[str, str]) -> str:
    """`sha256:` and the hex SHA-256 of the act as JSON with sorted keys, no spaces, UTF-8 (section 5.4)."""
    return "sha256:" + hashlib.sha256(r.canonical_json(an_act)).hexdigest()


def retiring_ask(key: str, p: r.Provision, at: datetime, ask_id: str) -> r.Ask:
    """The ask of one retiring provision, composed from the key alone, worded as the seeds word it."""
    what = (
        f"{p.consumer.module}'s access to {p.provision} on {p.provider.node}, "
        f"for {p.consumer.module} on {p.consumer.node}"
    )
    return r.Ask(
        id=ask_id,
        headline=f"Remove {p.consumer.module}'s {p.provision} access?",
        explanation=(
            f"Nothing wanted or placed on {p.consumer.node} needs {p.provision} any more. On Approve, "
            f"{p.provider.module} removes {what}: what it owns is handed to the resource's owner and its credential "
            "goes; the resource and its data stay."
        ),
        who=OPERATOR,
        expires=at + ASK_LASTS,
        on_expiry="nothing is removed; it is asked again when it changes",
        about="provision." + key,
        details=f"The provision {key} of mesh-provisioner's state provisions.",
        options=tuple(
            r.Option(id=o, label=label, does=does, level=APPROVE_LEVEL, binds=act_digest(act(key, ask_id, o)))
            for o, label, does in _OPTIONS
        ),
    )


def ask_of(key: str, p: r.Provision) -> r.Ask | None:
    """The ask a retiring key names, made again from the key: the same ask after any restart.

    None when the key names no ask, or an id this key does not make (`keys.ask_id`: another key's, or forged).
    """
    raised = k.ask_raised_at(p.ask)
    if not p.ask or raised is None or k.ask_id(key, raised) != p.ask:
        return None
    try:
        return retiring_ask(key, p, datetime.fromtimestamp(raised, UTC), p.ask)
    except (OverflowError, ValueError):  # a time so late its expiry is past the last a datetime holds
        return None


def check_ask(ask: r.Ask, now: datetime) -> str:
    """Why an ask may not be published ("" when it may): the checks the operator's channel makes."""
    if not ask.id:
        return "the ask has no id"
    if not ask.headline:
        return f"the ask {ask.id} has no headline"
    if not ask.who:
        return f"the ask {ask.id} says no one to ask"
    if ask.expires is None or ask.expires <= now:
        return f"the ask {ask.id} expires before it is asked"
    if not ask.options:
        return f"the ask {ask.id} offers no option"
    ids = [o.id for o in ask.options]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        return f"the ask {ask.id} has options without distinct ids"
    if any(not o.binds for o in ask.options):
        return f"the ask {ask.id} has an option bound to no act"
    return ""


def retiring_why(node: str, p: r.Provision) -> str:
    """Why a key of a node is retiring: nothing composed on the node needs it any more (5.2)."""
    return (
        f"no build wanted or placed on {node} requires {p.provision} of {p.provider.module} on {p.provider.node} "
        "any more"
    )


def raise_ask(key: str, p: r.Provision, now: datetime) -> tuple[r.Provision, str]:
    """A retiring key with its ask named, or unchanged and why the ask may not be raised. One raised stands."""
    if p.ask:
        return p, ""
    return new_ask(key, p, now)


def new_ask(key: str, p: r.Provision, now: datetime) -> tuple[r.Provision, str]:
    """A retiring key with a new ask named in place of any it had, raised now; or unchanged and why it may not be.

    The new ask is raised a second after the one it replaces at the earliest: the same id would be a duplicate
    message JetStream drops, and the router's record of the old ask would answer it (5.4).
    """
    unix = int(now.timestamp())
    before = k.ask_raised_at(p.ask) if p.ask else None
    if before is not None and before >= unix:
        unix = before + 1
    ask_id = k.ask_id(key, unix)
    try:
        why = check_ask(retiring_ask(key, p, datetime.fromtimestamp(unix, UTC), ask_id), now)
    except (OverflowError, ValueError):  # a time so late its expiry is past the last a datetime holds
        why = f"the ask {ask_id} expires past the last time a datetime holds"
    if why:
        return p, f"the retiring ask of {key} is not raised: {why}"
    return msgspec.structs.replace(p, ask=ask_id), ""


def retired(view: View, key: str, p: r.Provision) -> str:
    """Why an approved retiring key is retired: its provider removed its entry; "" while it is not."""
    if p.warrant is None or p.warrant.option != OPTION_APPROVE:
        return ""
    keeps, why = keeps_entries(view, p.provider.module, p.provision)
    if why or not keeps or p.provider.module not in view.bound_reads:
        return ""
    if view.get(bound(p.provider.module), key) is not None:
        return ""
    return "its provider removed its credential on the operator's warrant"


Verify = Callable[[r.Warrant | Mapping[str, Any]], str]
"""Checks a warrant's signature, over the warrant as the router wrote it when that is at hand: why it is refused,
"" when it holds."""


class Decision(msgspec.Struct, frozen=True):
    """What reading one retiring key's answer said, and the writes it asks for."""

    said: str = ""
    writes: list[Write] = []


def decide(view: View, key: str, now: datetime, verify: Verify | None = None) -> Decision:
    """Read the router's record of a retiring key's ask and write the warrant into the key (the seeds' Decide).

    A chosen option is taken only when the warrant is this module's, for this ask, the option is one the ask
    offered, and its binds is the digest of the act for this key, ask and option; anything else is refused with a
    why. An ask that ended with no choice is replaced in the key by a new one, which the asker publishes.
    """
    p, _ = provision_of(view, key)
    if p is None or p.state != r.RETIRING or not p.ask or p.warrant is not None:
        return Decision()
    e = view.get(ASK_RECORDS, p.ask)
    if e is None:
        return Decision()
    rec = e.get(r.AskRecord)
    if rec is None:
        return Decision(f"{key}: the router's record of {p.ask} is not readable: {e.error}")
    if rec.state in ("", "open"):
        return Decision()
    refused = _refusal(key, p.ask, rec, verify, _written_warrant(e.raw))
    if refused:
        return Decision(f"{key}: the answer is refused: {refused}")
    assert rec.warrant is not None
    w = rec.warrant
    if w.outcome != "chosen":
        # An ask that ended with no choice is cleared from the key and the key is asked again at once, with a new
        # ask (5.4; the seeds' Decide clears it and their retiring rule raises one for a key without an ask): a
        # key that waited for the next change of its node would wait for ever, and never retire.
        return _ask_again(view, key, p, now, f"the ask {p.ask} {w.outcome} with no choice")
    writes = Writes(view)
    by = "the operator"
    if w.by is not None:
        by = f"the {w.by.who}, as {w.by.kind} identity {w.by.identity}"
    warrant = r.ProvisionWarrant(ask=p.ask, option=w.option, by=by, at=utc(w.at) if w.at is not None else None)
    writes.provision(key, msgspec.structs.replace(p, warrant=warrant), now)
    return Decision(f"{key}: {w.option} by {by}", writes.done())


class Outgoing(msgspec.Struct, frozen=True):
    """A retiring key's ask as it is about to be published: the ask, or none and what is said and written instead."""

    ask: r.Ask | None = None
    said: str = ""
    writes: list[Write] = []


def outgoing(view: View, key: str, now: datetime) -> Outgoing:
    """The ask a retiring key names, checked just before it is published, not only when it was made (5.4).

    One whose expiry passed in between (no router took it for a day, say), or that the key does not make again
    (an id of another form), is made again: the key is written with a new ask, which goes out in its place. One
    that fails another check is not published, and why is said.
    """
    p, _ = provision_of(view, key)
    if p is None or p.state != r.RETIRING or not p.ask or p.warrant is not None:
        return Outgoing()
    ask = ask_of(key, p)
    if ask is None:
        again = _ask_again(view, key, p, now, f"its ask {p.ask!r} is not one this key makes")
        return Outgoing(None, again.said, again.writes)
    if ask.expires is not None and ask.expires <= now:
        again = _ask_again(view, key, p, now, f"the ask {p.ask} expired before it went out")
        return Outgoing(None, again.said, again.writes)
    why = check_ask(ask, now)
    if why:
        return Outgoing(None, f"{key}: the ask is not published: {why}")
    return Outgoing(ask)


def _ask_again(view: View, key: str, p: r.Provision, now: datetime, because: str) -> Decision:
    """The key written with a new ask in place of its dead one, and why (5.4); only cleared of the dead one when no
    new one may be raised, which its node's composition then says."""
    asked, why = new_ask(key, p, now)
    if why:
        asked = msgspec.structs.replace(p, ask="")
    # The why the key had when it turned retiring (an earlier seat wrote another here).
    asked = msgspec.structs.replace(asked, why=retiring_why(k.node_of(key), p))
    writes = Writes(view)
    writes.provision(key, asked, now)
    if why:
        return Decision(f"{key}: {because}, and {why}", writes.done())
    return Decision(f"{key}: {because}; asked again as {asked.ask}", writes.done())


def _written_warrant(raw: bytes) -> Mapping[str, Any] | None:
    """The warrant object as the router wrote it in its record, None when the record holds none."""
    try:
        record = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    warrant = record.get("warrant") if isinstance(record, dict) else None
    return warrant if isinstance(warrant, dict) else None


def _refusal(
    key: str, ask_id: str, rec: r.AskRecord, verify: Verify | None, written: Mapping[str, Any] | None
) -> str:
    """Why a decided record's answer may not be taken for a key's ask; "" when it may."""
    w, ask = rec.warrant, rec.ask
    if w is None or ask is None:
        return f"the router's record of {ask_id} is {rec.state} but holds no ask and warrant"
    if w.asker != MODULE:
        return f"the warrant is {w.asker or 'nobody'}'s, not {MODULE}'s"
    if w.ask != ask_id:
        return f"the warrant answers the ask {w.ask or 'none'}, not {ask_id}"
    if ask.id != ask_id:
        return f"the warrant answers the ask {ask.id or 'none'}, not {ask_id}"
    if verify is not None:
        why = verify(written if written is not None else w)
        if why:
            return why
    if w.outcome in ("expired", "withdrawn"):
        return ""
    if w.outcome != "chosen":
        return f"the warrant's outcome {w.outcome!r} is none of chosen, expired or withdrawn"
    option = next((o for o in ask.options if o.id == w.option), None)
    if option is None or w.option not in (o for o, _, _ in _OPTIONS):
        return f"the option {w.option!r} is not one the ask {ask_id} offered"
    if option.binds != act_digest(act(key, ask_id, w.option)):
        return f"the option {w.option} binds another act than retiring {key} on the ask {ask_id}"
    return ""


def retire_needs(view: View) -> list[Write]:
    """Delete every key of the retired state `needs`, which the clients no longer write (section 4)."""
    writes = Writes(view)
    for key in view.keys(NEEDS):
        writes.delete(NEEDS, key)
    return writes.done()


def retiring_keys(view: View) -> list[str]:
    """Every retiring key that waits for its ask's answer.

    Read from the keys naming an ask (`View.asking`), not every provision: each decided notice asks for them, and a
    1,000-node mesh holds some 42,000 provisions.
    """
    out = []
    for key in view.asking():
        p, _ = provision_of(view, key)
        if p is not None and p.state == r.RETIRING and p.ask and p.warrant is None:
            out.append(key)
    return sorted(out)
