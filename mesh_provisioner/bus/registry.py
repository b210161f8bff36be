"""Reading the operator's registry file (contract 4.1): the one piece of the seat's input that is a file, not a bucket.

What the file says and what it makes the seat write are `rules/registry.py`'s; this only reads its text.
"""

from __future__ import annotations

from pathlib import Path

from mesh_provisioner.rules.registry import Registry, form_of, parse


def read_registry(path: str) -> Registry:
    """The registry file at `path` parsed in its form (TOML or JSON); one that cannot be read is said, and nothing of
    it is taken (the state is left as it is, as with no file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return Registry(problems=[f"it cannot be read ({err}); nothing of it is written"], whole=False)
    return parse(text, form_of(path, text))
