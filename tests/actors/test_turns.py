"""Turns (actors/turns.py): the bound on compositions at once, given lowest priority first."""

from __future__ import annotations

import threading

from helpers import wait_until

from mesh_provisioner.actors.turns import Turns


def test_turns_go_lowest_priority_first_and_never_past_the_bound() -> None:
    turns = Turns(1)
    order: list[tuple[int, int]] = []
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with turns.turn((0, 0)):
            held.set()
            release.wait(10)

    def waiter(priority: tuple[int, int]) -> None:
        with turns.turn(priority):
            order.append(priority)

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(10)
    waiters = [threading.Thread(target=waiter, args=(p,)) for p in ((1, 3), (0, 7), (1, 0))]
    for t in waiters:
        t.start()
    wait_until(lambda: turns.waiting() == 3, 10, what="three waiting")
    release.set()
    for t in [first, *waiters]:
        t.join(10)
    assert order == [(0, 7), (1, 0), (1, 3)]
