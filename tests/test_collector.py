"""Freezing what the seat holds out of full collections (mesh_provisioner/collector.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from mesh_provisioner.collector import Freezer


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_freezer_freezes_only_when_quiet_and_then_no_more_often_than_its_period() -> None:
    held = [object() for _ in range(1000)]  # long-lived objects, tracked by the collector
    freezer = Freezer(every=3600)
    assert not freezer.tick(lambda: False), "work in progress: nothing frozen"
    assert gc.get_freeze_count() == 0
    assert freezer.tick(lambda: True)
    assert gc.get_freeze_count() >= len(held)
    assert not freezer.tick(lambda: True), "frozen a moment ago: not again before the period"
    assert freezer.freezes == 1


def test_the_freezer_frees_cyclic_garbage_before_it_freezes() -> None:
    # A cycle frozen would never be freed: the collection before the freeze frees it.
    class Node:
        other: object

    a, b = Node(), Node()
    a.other, b.other = b, a
    watched = weakref.ref(a)
    del a, b
    Freezer(every=0).tick(lambda: True)
    assert watched() is None
