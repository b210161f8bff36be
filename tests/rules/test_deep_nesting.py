"""Contract section 7 for values nested deeper than the interpreter's recursion limit.

msgspec answers such a value with RecursionError, not DecodeError. Read as a record it escaped `records.decode`, so the
cache could not keep the key at all: it logged an error and kept the key's *previous* value, and the seat went on
judging from a value that was no longer on the bus. In the verb a request or an `applied` value so nested made the
seat answer "could not answer". Found by the fault runner's bad input (deep nesting in every read bucket).
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from mesh_provisioner.contract import APPLIED, ASK_RECORDS, PLACEMENT, PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules import verb
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.retire import decide
from mesh_provisioner.rules.view import entry_of

DEPTH = 20_000


def deep(field: str = "x") -> bytes:
    """An object whose one field holds arrays nested DEPTH deep."""
    return b'{"' + field.encode() + b'": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"


def test_a_deep_value_is_a_bad_value_that_names_its_key() -> None:
    with pytest.raises(r.BadValue, match=r"mesh-controller\.placement ace does not decode: it is nested too deeply"):
        r.decode(r.Placement, deep(), state=PLACEMENT, key="ace")
    entry = entry_of(PLACEMENT, "ace", deep(), 7)
    assert entry.value is None and "nested too deeply" in entry.error


def test_a_deep_value_replaces_the_value_before_it() -> None:
    view = MemoryView()
    view.put(PLACEMENT, "ace", b'{"node": "ace", "modules": [{"module": "gitea"}]}', 1)
    assert view.placed_on("gitea") == ["ace"]
    view.put(PLACEMENT, "ace", deep(), 2)
    held = view.get(PLACEMENT, "ace")
    assert held is not None and held.revision == 2 and held.value is None
    assert view.placed_on("gitea") == []


def test_the_verb_refuses_a_deep_request_and_names_a_deep_value() -> None:
    parsed = verb.parse(deep())
    assert isinstance(parsed, verb.Error) and "nested too deeply" in parsed.error
    view = MemoryView()
    view.put(APPLIED, "ace.gitea", b"[" * DEPTH + b"]" * DEPTH, 1)
    item = verb.item(view, APPLIED, "ace.gitea")
    assert item is not None and item.value == msgspec.Raw(b"null") and "nested too deeply" in str(item.error)


def test_a_deep_record_of_an_ask_is_said_not_readable() -> None:
    view = MemoryView()
    key = "bee.app.postgres-database"
    ask = k.ask_id(key, 1764000000)
    p = r.Provision(provision="postgres-database", consumer=r.End("app", "bee"), provider=r.End("postgres", "ace"),
                    state=r.RETIRING, ask=ask)
    view.put(PROVISIONS, key, r.encode(p), 1)
    view.put(ASK_RECORDS, ask, b'{"state": "decided", "warrant": ' + deep() + b"}", 2)
    said = decide(view, key, datetime.now(UTC))
    assert said.writes == [] and "not readable" in said.said and "nested too deeply" in said.said
