"""The sample mesh shipped with the package: every state of a provision on two nodes, for the demo and the tests."""

from __future__ import annotations

import json
from importlib import resources


def sample_mesh() -> dict[str, dict[str, bytes]]:
    """The sample mesh's states: for each state, each key's JSON value as bytes."""
    text = resources.files(__package__).joinpath("mesh.json").read_text(encoding="utf-8")
    states: dict[str, dict[str, object]] = json.loads(text)["states"]
    return {state: {key: json.dumps(value).encode() for key, value in kv.items()} for state, kv in states.items()}
