"""What memory keeps when it keeps only some keys (a partitioned seat's, contract 8.1: bus/memory.py `keeping`): a
key it stops keeping leaves it, and is read again whole once it is kept again."""

from __future__ import annotations

import json

from mesh_provisioner.bus.memory import Memory
from mesh_provisioner.contract import WANTS
from mesh_provisioner.rules.memory_view import MemoryView


class _Nodes:
    """Keeps the keys of the nodes in `held`; decides nothing."""

    deciding: tuple[str, ...] = ()
    widening: tuple[str, ...] = ()

    def __init__(self, *held: str) -> None:
        self.held = set(held)

    def keeps(self, state: str, key: str, raw: bytes) -> bool:
        return key.split(".")[1] in self.held

    def widens(self, state: str, key: str, raw: bytes | None) -> tuple[str, ...]:
        return ()


def test_8_1_a_key_changed_while_not_kept_is_read_again_once_it_is_kept_again() -> None:
    # Shards given back and taken again: the want changed while bee was not kept, and memory must take it when bee's
    # states are read again, at that same revision, and from a refresh after a conflict, not hold it as deleted.
    memory = Memory(MemoryView())
    nodes = _Nodes("ace", "bee")
    memory.keeping = nodes
    want = json.dumps({"fp": "1"}).encode()
    memory.receive(WANTS, "want.bee.wiki", want, 3)
    nodes.held.discard("bee")
    changed = json.dumps({"fp": "2"}).encode()
    memory.receive(WANTS, "want.bee.wiki", changed, 7)
    assert memory.view.get(WANTS, "want.bee.wiki") is None, "a key not kept leaves memory"
    nodes.held.add("bee")
    memory.reconcile(WANTS, {"want.bee.wiki": (changed, 7)}, 9)
    kept = memory.view.get(WANTS, "want.bee.wiki")
    assert kept is not None and kept.revision == 7, "read again, the key is kept at its revision on the bus"
    again = Memory(MemoryView())
    again.keeping = nodes
    nodes.held.discard("bee")
    again.receive(WANTS, "want.bee.wiki", want, 3)
    nodes.held.add("bee")
    again.receive(WANTS, "want.bee.wiki", changed, 7)
    assert again.view.get(WANTS, "want.bee.wiki") is not None, "a refresh after a conflict brings it too"
