"""Freezing what the seat holds out of full collections (mesh_provisioner/collector.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from mesh_provisioner import cli
from mesh_provisioner.collector import YOUNG, Freezer, collect_seldom


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_young_collections_come_every_young_objects_and_no_more_often() -> None:
    gc.set_threshold(700, 10, 10)
    collect_seldom()
    assert gc.get_threshold() == (YOUNG, 10, 10)
    young = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal young
        young += phase == "start" and info["generation"] == 0

    gc.callbacks.append(count)
    try:
        held = [[] for _ in range(5 * YOUNG)]  # tracked objects that live on
    finally:
        gc.callbacks.remove(count)
    assert len(held) == 5 * YOUNG and young <= 6, f"{young} young collections for {5 * YOUNG} objects"
    gc.set_threshold(10 * YOUNG, 10, 10)
    collect_seldom()
    assert gc.get_threshold()[0] == 10 * YOUNG, "a host's own, rarer, collections are left as they are"


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


def test_the_seats_process_has_young_collections_come_seldom(capsys: pytest.CaptureFixture[str]) -> None:
    # The process's decision (`mesh-provisioner`'s main), not the seat's: a host embedding the seat keeps its own.
    gc.set_threshold(700, 10, 10)
    assert cli.main(["--version"]) == 0
    assert gc.get_threshold() == (YOUNG, 10, 10)
