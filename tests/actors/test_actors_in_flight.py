"""InFlight: the count of messages told and not yet handled, that `wait_settled` waits on."""

from __future__ import annotations

import threading

from mesh_provisioner.actors.base import InFlight


def test_a_message_told_to_a_forgotten_instance_counts_nothing() -> None:
    # A tell that races the child's death: the count must not outlive the instance, or nothing settles again.
    flight = InFlight()
    flight.sent("urn:a")
    flight.forget("urn:a")
    flight.sent("urn:a")
    assert flight.total() == 0
    assert flight.wait_idle(0.0)


def test_wait_idle_wakes_when_the_last_message_is_done() -> None:
    flight = InFlight()
    flight.sent("urn:a")
    flight.sent("urn:b")
    woke = threading.Event()

    def waiter() -> None:
        if flight.wait_idle(10.0):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    flight.done("urn:a")
    assert not woke.wait(0.05)  # one still in flight
    flight.done("urn:b")
    thread.join(10.0)
    assert woke.is_set()
    assert flight.total() == 0


def test_done_more_often_than_sent_never_goes_below_nothing() -> None:
    flight = InFlight()
    flight.done("urn:a")
    flight.sent("urn:a")
    assert flight.total() == 1
