"""The operator's registry (contract 4.1, the seeds' `_registry` and `Publish`): which domain answers which kind of
placeholder.

The registry file is a table of placeholder kind to domain, and a `default` domain, in TOML or JSON:

    default = "example.org"      {"default": "example.org",
    forge = "git.example.org"     "forge": "git.example.org"}

The seat writes it into `mesh-provisioner.registry` when it takes the seat, one key a kind, `{"kind", "domain"}`,
deletes the keys the file no longer names, and writes a key back when anyone else deletes, purges or changes it.
A line with errors is said with its line number, and the rest is still written (none for the bad ones; a kind a bad
line names keeps its key as it is). A JSON file that does not parse at all has no rest: the state is left as it is.
Pure: the file's text comes in, what to write goes out; reading the file is the bus layer's (`bus/registry.py`).
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any, Final

import msgspec

from mesh_provisioner.contract import REGISTRY
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.view import View
from mesh_provisioner.rules.writing import Writes

DEFAULT_KIND: Final = "default"
TOML: Final = "toml"
JSON: Final = "json"
_TOML_LINE_AT: Final = re.compile(r" \(at line \d+, column (\d+)\)$")


class Registry(msgspec.Struct, frozen=True):
    """A registry file as read: each good kind's domain, every kind it names (good or bad), and each problem with
    its line. `whole` is False when nothing of it can be taken (it could not be read, or a JSON file does not parse):
    then the state is left as it is, as with no file."""

    domains: dict[str, str] = {}
    named: frozenset[str] = frozenset()
    problems: list[str] = []
    whole: bool = True


def form_of(name: str, text: str) -> str:
    """The form of a registry file: JSON by its `.json` name, or by a first character `{`; TOML otherwise."""
    if name.lower().endswith(".json") or (not name.lower().endswith(".toml") and text.lstrip().startswith("{")):
        return JSON
    return TOML


def parse(text: str, form: str = TOML) -> Registry:
    """A registry file's text in its form (`toml` or `json`), with every problem said with its line."""
    return _parse_json(text) if form == JSON else _parse_toml(text)


def domain_problem(kind: str, domain: Any) -> str:
    """Why a kind and its domain are not an entry of the registry ("" when they are)."""
    if not k.is_token(kind):
        return f"the kind {kind!r} is not a token ([A-Za-z0-9_-]+)"
    if not isinstance(domain, str):
        return f"the domain of {kind} is not a string"
    if not domain or any(c.isspace() or not c.isprintable() for c in domain):
        return f"the domain of {kind} ({domain!r}) is empty or holds spaces"
    return ""


def _parse_toml(text: str) -> Registry:
    """Each line on its own (a registry is flat: `kind = "domain"` lines), so that one bad line leaves the rest."""
    domains: dict[str, str] = {}
    named: dict[str, int] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            problems.append(f"line {number}: a table header; the registry is one table of kind = \"domain\" lines")
            continue
        try:
            table = tomllib.loads(line)
        except tomllib.TOMLDecodeError as err:
            kind = stripped.split("=", 1)[0].strip().strip("\"'") if "=" in stripped else ""
            if k.is_token(kind):
                named.setdefault(kind, number)
            why = _TOML_LINE_AT.sub(lambda m: f" (at column {m.group(1)})", str(err))
            problems.append(f"line {number}: {why}")
            continue
        for kind, domain in table.items():
            _take(kind, domain, number, domains, named, problems)
    return Registry(domains, frozenset(named), problems)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its pairs in order: a kind named twice is seen twice."""


def _parse_json(text: str) -> Registry:
    """A JSON object of kind to domain; each bad entry said with the line its kind stands on."""
    try:
        found = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as err:
        return Registry(problems=[f"line {err.lineno}: {err.msg} (at column {err.colno}); nothing of it is written"],
                        whole=False)
    except RecursionError:
        return Registry(problems=["line 1: nested too deeply; nothing of it is written"], whole=False)
    if not isinstance(found, _Pairs):
        return Registry(problems=["line 1: not an object of kind to domain; nothing of it is written"], whole=False)
    domains: dict[str, str] = {}
    named: dict[str, int] = {}
    problems: list[str] = []
    seen: dict[str, int] = {}
    for kind, domain in found:
        seen[kind] = seen.get(kind, 0) + 1
        _take(kind, domain, _line_of(text, kind, seen[kind]), domains, named, problems)
    return Registry(domains, frozenset(named), problems)


def _line_of(text: str, kind: str, nth: int = 1) -> int:
    """The line a JSON key stands on the nth time it is named (1 when it cannot be found)."""
    found = list(re.finditer(re.escape(json.dumps(kind)) + r"\s*:", text))
    return text.count("\n", 0, found[nth - 1].start()) + 1 if len(found) >= nth else 1


def _take(kind: str, domain: Any, line: int, domains: dict[str, str], named: dict[str, int],
          problems: list[str]) -> None:
    """Keep one kind's domain, or say why not; a kind named twice keeps its first domain."""
    if kind in named:
        problems.append(f"line {line}: {kind} is named again (first on line {named[kind]}); the first stands")
        return
    if k.is_token(kind):
        named[kind] = line
    why = domain_problem(kind, domain)
    if why:
        problems.append(f"line {line}: {why}")
        return
    domains[kind] = domain


def registry_writes(view: View, registry: Registry) -> list[Write]:
    """The writes that make `mesh-provisioner.registry` say what the file says (4.1): each kind's entry that differs
    (or is gone), and each key the file no longer names deleted; none for a file nothing of which can be taken."""
    if not registry.whole:
        return []
    writes = Writes(view)
    for kind, domain in sorted(registry.domains.items()):
        value = r.encode(r.RegistryEntry(kind=kind, domain=domain))
        e = view.get(REGISTRY, kind)
        if e is None or e.raw != value:
            writes.put(REGISTRY, kind, value)
    for key in sorted(view.keys(REGISTRY)):
        if key not in registry.named:
            writes.delete(REGISTRY, key)
    return writes.done()
