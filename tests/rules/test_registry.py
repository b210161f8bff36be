"""Contract 4.1: the operator's registry file, parsed (TOML or JSON), and the writes that keep the state saying it."""

from __future__ import annotations

import json

import pytest

from mesh_provisioner.contract import REGISTRY
from mesh_provisioner.messages.writes import Delete, Put
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.registry import JSON, TOML, Registry, form_of, parse, registry_writes

TOML_FILE = """# which domain answers which kind of placeholder
default = "example.org"
forge = "git.example.org"  # the forge
bad kind = "x.example.org"
mail = 12
[more]
wiki = "wiki.example.org
forge = "other.example.org"
chat = ""
sso = "sso.example.org"
"""

JSON_FILE = """{
  "default": "example.org",
  "forge": "git.example.org",
  "bad kind": "x.example.org",
  "mail": 12,
  "forge": "other.example.org",
  "chat": "",
  "sso": "sso.example.org"
}
"""


def entry(kind: str, domain: str) -> bytes:
    return json.dumps({"kind": kind, "domain": domain}, separators=(",", ":")).encode()


def test_4_1_a_toml_file_with_errors_is_said_line_by_line_and_the_rest_taken() -> None:
    reg = parse(TOML_FILE, TOML)
    assert reg.domains == {"default": "example.org", "forge": "git.example.org", "sso": "sso.example.org"}
    assert reg.problems == [
        "line 4: Expected '=' after a key in a key/value pair (at column 5)",
        "line 5: the domain of mail is not a string",
        'line 6: a table header; the registry is one table of kind = "domain" lines',
        "line 7: Unterminated string (at end of document)",
        "line 8: forge is named again (first on line 3); the first stands",
        "line 9: the domain of chat ('') is empty or holds spaces",
    ]
    # A kind a bad line names keeps its key as it is: named, though nothing is written for it.
    assert reg.named == {"default", "forge", "mail", "wiki", "chat", "sso"}
    assert reg.whole


def test_4_1_a_json_file_with_errors_is_said_line_by_line_and_the_rest_taken() -> None:
    reg = parse(JSON_FILE, JSON)
    assert reg.domains == {"default": "example.org", "forge": "git.example.org", "sso": "sso.example.org"}
    assert reg.problems == [
        "line 4: the kind 'bad kind' is not a token ([A-Za-z0-9_-]+)",
        "line 5: the domain of mail is not a string",
        "line 6: forge is named again (first on line 3); the first stands",
        "line 7: the domain of chat ('') is empty or holds spaces",
    ]
    assert reg.named == {"default", "forge", "mail", "chat", "sso"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{\n  "default": "example.org",,\n}', "line 2: Expecting property name enclosed in double quotes (at column "
                                            "28); nothing of it is written"),
        ('["example.org"]', "line 1: not an object of kind to domain; nothing of it is written"),
        ("[" * 100_000, "line 1: nested too deeply; nothing of it is written"),
    ],
    ids=["does-not-parse", "not-an-object", "too-deep"],
)
def test_4_1_a_json_file_that_does_not_parse_leaves_the_state_as_it_is(text: str, problem: str) -> None:
    reg = parse(text, JSON)
    assert reg == Registry(problems=[problem], whole=False)
    view = MemoryView()
    view.put(REGISTRY, "forge", entry("forge", "git.example.org"), 1)
    assert registry_writes(view, reg) == []


def test_4_1_the_form_is_told_by_the_name_or_the_first_character() -> None:
    assert form_of("registry.json", "default = 'x'") == JSON
    assert form_of("registry.toml", "{") == TOML
    assert form_of("registry", '  {"default": "x"}') == JSON
    assert form_of("registry", 'default = "x"') == TOML


def test_4_1_writes_put_what_differs_and_delete_keys_no_longer_named() -> None:
    view = MemoryView()
    view.put(REGISTRY, "default", entry("default", "example.org"), 1)  # as the file says: left alone
    view.put(REGISTRY, "forge", entry("forge", "old.example.org"), 2)  # another domain: written
    view.put(REGISTRY, "mail", entry("mail", "mail.example.org"), 3)  # named on a bad line: left as it is
    view.put(REGISTRY, "gone", entry("gone", "gone.example.org"), 4)  # no longer in the file: deleted
    writes = registry_writes(view, parse(TOML_FILE, TOML))
    assert writes == [
        Put(REGISTRY, "forge", entry("forge", "git.example.org"), 2),
        Put(REGISTRY, "sso", entry("sso", "sso.example.org"), 0),
        Delete(REGISTRY, "gone", 4),
    ]
    for w in writes:
        if isinstance(w, Put):
            view.put(w.state, w.key, w.value, 10)
        else:
            view.delete(w.state, w.key)
    assert registry_writes(view, parse(TOML_FILE, TOML)) == []  # the fixed point


def test_4_1_a_key_someone_else_changed_or_deleted_is_written_back() -> None:
    reg = parse('default = "example.org"\nforge = "git.example.org"\n', TOML)
    view = MemoryView()
    view.put(REGISTRY, "forge", b'{"kind": "forge", "domain": "evil.example.org"}', 5)
    assert registry_writes(view, reg) == [
        Put(REGISTRY, "default", entry("default", "example.org"), 0),
        Put(REGISTRY, "forge", entry("forge", "git.example.org"), 5),
    ]
