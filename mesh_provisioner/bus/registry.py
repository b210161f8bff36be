"""The operator's registry file kept in `mesh-provisioner.registry` (contract 4.1): read once when the seat is taken,
written then, and written again whenever another writer changes that state.

What the file says and what it makes the seat write are `rules/registry.py`'s; this reads the file and makes the
writes, by compare-and-set.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from mesh_provisioner.bus.store import Store
from mesh_provisioner.messages.writes import Put
from mesh_provisioner.rules.registry import Registry, form_of, parse, registry_writes
from mesh_provisioner.rules.view import View

log = logging.getLogger("mesh_provisioner.bus.registry")


def read_registry(path: str) -> Registry:
    """The registry file at `path` parsed in its form (TOML or JSON); one that cannot be read is said, and nothing of
    it is taken (the state is left as it is, as with no file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return Registry(problems=[f"it cannot be read ({err}); nothing of it is written"], whole=False)
    return parse(text, form_of(path, text))


class RegistryWriter:
    """Keeps `mesh-provisioner.registry` saying what the registry file said when it was read (4.1)."""

    def __init__(self, path: str, store: Store, view: View) -> None:
        """Read the file at `path` and say each of its problems with its line."""
        self.path = path
        self.registry = read_registry(path)
        self.due = False  # a write is coming: a change before it starts rides on it
        self._store = store
        self._view = view
        for problem in self.registry.problems:
            log.warning("the registry file %s: %s", path, problem)

    def again(self) -> asyncio.Task[None] | None:
        """Write the file's word back (another writer changed the state), as a task of the running loop; None when a
        write is coming already, which every change before it starts rides on."""
        if self.due:
            return None
        self.due = True
        return asyncio.get_running_loop().create_task(self.write())

    async def write(self) -> None:
        """Write each key that differs from the file and delete each it no longer names, by compare-and-set, and say
        what was done; a write that did not land is made again at the registry's next change. Never raises: nothing
        read may stop the seat (section 7)."""
        self.due = False
        try:
            writes = registry_writes(self._view, self.registry)
            if not writes:
                return
            applied = await self._store.apply(writes)
        except Exception:
            log.exception("the registry is not written")
            return
        put = sum(1 for w, _ in applied.done if isinstance(w, Put))
        log.info("the registry: wrote %d key(s), deleted %d", put, len(applied.done) - put)
        if not applied.ok:
            log.warning("the registry is not all written: %s", applied.error)
