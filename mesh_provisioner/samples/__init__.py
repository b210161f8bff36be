"""The sample mesh shipped with the package: every state of a provision on two nodes, for the demo and the tests.

A mesh file is JSON: `{"states": {"<module>.<state>": {"<key>": <value>, ...}, ...}}`, each value the JSON a module
of the mesh would write (contract sections 2 and 4); `mesh-provisioner load FILE` loads one into a bus.
"""

from __future__ import annotations

import json
from importlib import resources


class BadMesh(ValueError):
    """A mesh file that is not of that shape; the message says where."""


def sample_text() -> str:
    """The sample mesh file's text."""
    return resources.files(__package__).joinpath("mesh.json").read_text(encoding="utf-8")


def mesh_of(text: str) -> dict[str, dict[str, bytes]]:
    """A mesh file's states: for each state, each key's JSON value as bytes; BadMesh says what is wrong."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadMesh(f"not JSON: {err}") from None
    states = doc.get("states") if isinstance(doc, dict) else None
    if not isinstance(states, dict) or not all(isinstance(kv, dict) for kv in states.values()):
        raise BadMesh('not a mesh: {"states": {"<module>.<state>": {"<key>": value, ...}, ...}} is expected')
    return {state: {key: json.dumps(value).encode() for key, value in kv.items()} for state, kv in states.items()}


def sample_mesh() -> dict[str, dict[str, bytes]]:
    """The sample mesh's states: for each state, each key's JSON value as bytes."""
    return mesh_of(sample_text())
