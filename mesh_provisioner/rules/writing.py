"""What one judgement writes: each key's put or delete, against the revision the view had, in order.

Later judgements of the same composition read its earlier writes (an `Overlay`), so a credential judged first is
seen by the key that depends on it; the revision each write carries is always the one of the view below, which
is what a compare-and-set checks (design.md, "Functional core").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Delete, Put, Write
from mesh_provisioner.rules.overlay import Overlay
from mesh_provisioner.rules.view import View

PROVISION_VERSION = 1


class Writes:
    """One judgement's writes over a view, each key once, the latest word for it kept."""

    def __init__(self, base: View) -> None:
        self.base = base
        self.view = Overlay(base)
        self._writes: dict[tuple[str, str], Write] = {}

    def put(self, state: str, key: str, value: bytes) -> None:
        """Set a key, judged against the revision the view below has (0: none, so it is created)."""
        have = self.base.get(state, key)
        self._writes[(state, key)] = Put(state, key, value, have.revision if have else 0)
        self.view.lay(state, key, value)

    def delete(self, state: str, key: str) -> None:
        """Delete a key the view below has; one this judgement only put is simply not written."""
        have = self.base.get(state, key)
        if have is None:
            self._writes.pop((state, key), None)
        else:
            self._writes[(state, key)] = Delete(state, key, have.revision)
        self.view.lay(state, key, None)

    def provision(self, key: str, p: r.Provision, now: datetime) -> r.Provision:
        """Write a provision stamped with the time and the record's version; answers it as written."""
        stamped = msgspec.structs.replace(p, at=utc(now), v=PROVISION_VERSION)
        self.put(PROVISIONS, key, r.encode(stamped))
        return stamped

    def done(self, first_node: str | None = None) -> list[Write]:
        """The writes in the order judged; with first_node, that node's own keys first.

        A composition writes its own node's keys before another node's (a provider's shared credential), so that
        the key depending on a credential exists before the credential's node can judge it unneeded.
        """
        writes = list(self._writes.values())
        if first_node is None:
            return writes
        own = [w for w in writes if w.key.split(".", 1)[0] == first_node or w.state != PROVISIONS]
        return own + [w for w in writes if w not in own]


def utc(t: datetime) -> datetime:
    """A time in UTC, as every time of the contract is (section 1); one with no zone is taken as UTC."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def same(a: r.Provision, b: r.Provision) -> bool:
    """Whether two provisions say the same, `at` and `v` aside (section 4)."""
    return msgspec.structs.replace(a, at=None, v=0) == msgspec.structs.replace(b, at=None, v=0)


def told(key: str, was: r.Provision | None, now: r.Provision) -> str:
    """How a composition's report says a provision it wrote: its key and state, and, when the state stayed, the fields
    that changed (a depends-on that grew would otherwise read as the same line twice)."""
    if was is None or was.state != now.state:
        return f"{key} {now.state}"
    fields = [f.encode_name for f in msgspec.structs.fields(r.Provision)
              if f.name not in ("at", "v") and getattr(was, f.name) != getattr(now, f.name)]
    return f"{key} {now.state} ({', '.join(fields)} changed)"


def judged_alike(a: r.Provision, b: r.Provision) -> bool:
    """Whether two provisions differ at most in what their provider's outcome says (5.3: `state`, `why`,
    `reference`), `at` and `v` aside: the same provision of the same consumer, depending on the same keys, with the
    same ask."""
    aside = {"state": "", "why": "", "reference": None, "at": None, "v": 0}
    return msgspec.structs.replace(a, **aside) == msgspec.structs.replace(b, **aside)


def said(*words: str) -> str:
    """The first of the words that says something (the seeds' orSaid)."""
    return next((w for w in words if w.strip()), "")


def provision_of(view: View, key: str) -> tuple[r.Provision | None, str]:
    """The provision kept at a key and "", or None and why it cannot be read ("" when there is none)."""
    e = view.get(PROVISIONS, key)
    if e is None:
        return None, ""
    p = e.get(r.Provision)
    return p, "" if p is not None else e.error


def value_of(view: View, kind: type[Any], state: str, key: str) -> Any:
    """The decoded value at a key, None when there is none or it does not decode."""
    e = view.get(state, key)
    return e.get(kind) if e is not None else None
