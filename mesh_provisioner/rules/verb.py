"""The seat's verb (contract 9): answering a request for what the seat keeps, from a view of the bus.

A request is `{"what": "plans"|"provisions"|"refused"|"registry"|"needs"|"applied"|"collect", "node"?, "module"?,
"collection"?}` (`what` defaults to `provisions`); the reply is `{"entries": [{"key", "value"}]}`, each value the
stored JSON value itself (not a string), entries sorted by key, or `{"error": W}` for a request that is not JSON,
names an unknown `what` or a filter that is not a token (section 1). Read only, and pure: the bus side
(`bus/verb.py`) serves it.

Filters: `node` is a key's first token (for `collect`, its second), `module` the module token after it (a
provision's consumer); `collection` narrows `collect` (the others ignore it), whose keys are
`<collection>.<node>.<module>`. A stored value that is not JSON (bad input, section 7) is answered with `value` null
and an `error` that says so, never dropped silently and never breaking the reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from mesh_provisioner.contract import APPLIED, COLLECT, NEEDS, PLANS, PROVISIONS, REFUSED, REGISTRY
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import View

# What a request may ask for, by the word of contract 9, and the state each reads.
STATES: Final = {
    "plans": PLANS,
    "provisions": PROVISIONS,
    "refused": REFUSED,
    "registry": REGISTRY,
    "needs": NEEDS,
    "applied": APPLIED,
    "collect": COLLECT,
}
DEFAULT_WHAT: Final = "provisions"


class Request(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """A request of the verb (contract 9); every field optional, unknown fields ignored (section 1)."""

    what: str = DEFAULT_WHAT
    node: str = ""
    module: str = ""
    collection: str = ""


class Item(msgspec.Struct, frozen=True):
    """One key and its stored JSON value; `error` (and a null value) only when the stored value is not JSON."""

    key: str
    value: msgspec.Raw
    error: str | msgspec.UnsetType = msgspec.UNSET


class Entries(msgspec.Struct, frozen=True):
    """The verb's answer: the entries asked for, sorted by key."""

    entries: list[Item]


class Error(msgspec.Struct, frozen=True):
    """The verb's refusal: why the request is not answered."""

    error: str


Reply = Entries | Error

_request: Final = msgspec.json.Decoder(Request)
_encoder: Final = msgspec.json.Encoder()
_any: Final = msgspec.json.Decoder()
_NULL: Final = msgspec.Raw(b"null")


def parse(request: bytes) -> Request | Error:
    """A request decoded and checked, or the error the verb answers (contract 9)."""
    try:
        req = _request.decode(request)
    except msgspec.ValidationError as err:
        return Error(f"the request is not an object of what, node, module and collection: {err}")
    except msgspec.DecodeError as err:
        return Error(f"the request is not JSON: {err}")
    except RecursionError:
        return Error("the request is nested too deeply")
    if req.what not in STATES:
        return Error(f"the request asks for {req.what!r}, which is none of {', '.join(STATES)}")
    for name in ("node", "module", "collection"):
        word = getattr(req, name)
        if word and not k.is_token(word):
            return Error(f"the request's {name} {word!r} is not a token ([A-Za-z0-9_-]+)")
    return req


def wanted(req: Request, key: str) -> bool:
    """Whether a key of the state asked for passes the request's filters."""
    parts = key.split(".")
    if req.what == "collect":
        if req.collection and parts[0] != req.collection:
            return False
        parts = parts[1:]
    if req.node and (not parts or parts[0] != req.node):
        return False
    return not req.module or (len(parts) > 1 and parts[1] == req.module)


def select(view: View, req: Request) -> list[str]:
    """The keys a request selects, sorted; one node's keys are read from the view's by-node index."""
    state = STATES[req.what]
    if req.what == "collect":
        # A collect key's first token is its collection, which the by-node index groups by.
        candidates: Iterable[str] = view.keys(state, req.collection) if req.collection else view.keys(state)
    else:
        candidates = view.keys(state, req.node) if req.node else view.keys(state)
    return sorted(key for key in candidates if wanted(req, key))


def item(view: View, state: str, key: str) -> Item | None:
    """A key's item: its stored value as JSON, or null and why when the value is not JSON; None when gone."""
    e = view.get(state, key)
    if e is None:
        return None
    try:
        _any.decode(e.raw)
    except msgspec.DecodeError as err:
        return Item(key, _NULL, f"{state} {key} is not JSON: {err}")
    except RecursionError:
        return Item(key, _NULL, f"{state} {key} is nested too deeply to read")
    return Item(key, msgspec.Raw(e.raw))


def asked(request: bytes) -> tuple[str, str] | None:
    """The state a request reads and the node it is narrowed to ("": none); None when it is refused (`parse`)."""
    req = parse(request)
    return None if isinstance(req, Error) else (STATES[req.what], req.node)


def reply(view: View, request: bytes) -> Reply:
    """The verb's reply to a request, as a record (contract 9)."""
    req = parse(request)
    if isinstance(req, Error):
        return req
    state = STATES[req.what]
    items = [it for key in select(view, req) if (it := item(view, state, key)) is not None]
    return Entries(items)


def encode(a_reply: Reply) -> bytes:
    """A reply as the bytes sent back."""
    return _encoder.encode(a_reply)


def answer(view: View, request: bytes) -> bytes:
    """The verb's reply to a request, as the bytes sent back (contract 9)."""
    return encode(reply(view, request))
