"""The dispatcher (actors/dispatch.py): wakes by read sets, one entry per judgment, no change lost, no self-wake.

It is the seat's one work queue; these tests drive it as the actors and the cache do, with a recorder for the ticks
it sends, and the rules' own recording view over a MemoryView.
"""

from __future__ import annotations

from mesh_provisioner.actors.dispatch import COMPOSE, JUDGE, Dispatcher
from mesh_provisioner.rules.memory_view import MemoryView
from mesh_provisioner.rules.reads import Reads, token

ACE = (COMPOSE, "ace")
KEY = (JUDGE, "ace.app.db")
A = token("get", "s", "a")
B = token("get", "s", "b")


class Ticks:
    """The actors as the dispatcher sees them: each tick told, and whether an actor can hear one now."""

    def __init__(self) -> None:
        self.told: list[str] = []
        self.deaf: set[str] = set()

    def __call__(self, actor: str) -> bool:
        if actor in self.deaf:
            return False
        self.told.append(actor)
        return True


def ran(d: Dispatcher, actor: str, reads: set[tuple[str, ...]], began: int = 0) -> list[tuple[str, str]]:
    """Take an actor's queue and end each run with the given reads."""
    taken = [j for j, _ in d.take(actor)]
    for j in taken:
        r = Reads(MemoryView(), began)
        r.tokens |= reads
        d.done(j, r)
    return taken


def route(j: tuple[str, str]) -> str:
    return "node:ace"


def test_a_change_wakes_exactly_the_judgments_that_read_it() -> None:
    ticks = Ticks()
    d = Dispatcher(ticks)
    d.add([ACE, KEY], "node:ace")
    d.take("node:ace")
    for j, reads in ((ACE, {A}), (KEY, {B})):
        r = Reads(MemoryView())
        r.tokens |= reads
        d.done(j, r)
    assert d.idle()
    d.changed({B}, route, count=1)
    assert [j for j, _ in d.take("node:ace")] == [KEY]


def test_ten_wakes_while_queued_give_one_run() -> None:
    ticks = Ticks()
    d = Dispatcher(ticks)
    d.add([ACE], "node:ace")
    ran(d, "node:ace", {A})
    ticks.told.clear()
    for count in range(1, 11):
        d.changed({A}, route, count=count)
    assert ticks.told == ["node:ace"], "one tick for ten wakes"
    assert ran(d, "node:ace", {A}, began=10) == [ACE]
    assert d.idle()


def test_a_change_during_a_run_that_read_it_runs_it_again() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    ran(d, "node:ace", {A})
    d.changed({A}, route, count=1)
    (taken,) = d.take("node:ace")
    assert taken[0] == ACE
    d.changed({A}, route, count=2)  # lands while it runs, after it began reading at 1
    r = Reads(MemoryView(), 1)
    r.tokens.add(A)
    d.done(ACE, r)
    assert not d.idle(), "the change the run may have missed is not lost"
    assert [j for j, _ in d.take("node:ace")] == [ACE]


def test_a_change_counted_before_a_run_began_reading_is_in_what_it_read() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.take("node:ace")
    d.changed({A}, route, count=1)
    r = Reads(MemoryView(), 1)  # began reading once the cache held change 1
    r.tokens.add(A)
    d.done(ACE, r)
    assert d.idle()


def test_a_change_during_a_run_before_it_first_read_the_token_is_in_what_it_read() -> None:
    # Read through a view stamped by the cache's change count: a change counted before the run first read a token
    # is in what it read there, and does not run it again; one counted after it is, and does.
    count = [1]
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.take("node:ace")
    view = MemoryView()
    view.put("s", "a", b"1", 1)
    view.put("s", "b", b"1", 1)
    r = Reads(view, 1, lambda: count[0])
    r.get("s", "a")
    count[0] = 2
    d.changed({B}, route, count=2)  # b changed during the run, before the run read it
    r.get("s", "b")
    d.done(ACE, r)
    assert d.idle()
    d.add([ACE], "node:ace")
    d.take("node:ace")
    r = Reads(view, 2, lambda: count[0])
    r.get("s", "a")
    r.get("s", "b")
    count[0] = 3
    d.changed({A}, route, count=3)  # a changed during the run, after the run read it
    d.done(ACE, r)
    assert [j for j, _ in d.take("node:ace")] == [ACE]


def test_a_judgments_own_write_does_not_wake_it() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE, KEY], "node:ace")
    ran(d, "node:ace", {A})
    d.changed({A}, route, writers=[ACE], count=1)
    assert [j for j, _ in d.take("node:ace")] == [KEY], "the key read it; the composition wrote it"


def test_a_failed_run_is_queued_again() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.take("node:ace")
    d.done(ACE, None)
    assert [j for j, _ in d.take("node:ace")] == [ACE]


def test_an_actor_that_dies_gets_what_it_ran_back_at_its_restart() -> None:
    ticks = Ticks()
    d = Dispatcher(ticks)
    d.add([ACE], "node:ace")
    d.take("node:ace")
    ticks.deaf.add("node:ace")
    d.release("node:ace")
    ticks.deaf.clear()
    ticks.told.clear()
    d.restarted("node:ace")
    assert ticks.told == ["node:ace"]
    assert [j for j, _ in d.take("node:ace")] == [ACE]


def test_never_two_workers_on_one_judgment() -> None:
    d = Dispatcher(Ticks())
    d.add([KEY], "bound:postgres")
    d.take("bound:postgres")
    d.add([KEY], "node:ace")  # asked for elsewhere while it runs: it runs again where it ran, after
    assert d.take("node:ace") == []
    d.done(KEY, Reads(MemoryView()))
    assert [j for j, _ in d.take("bound:postgres")] == [KEY]


def _composed(d: Dispatcher, began: int, key_reads: set[tuple[str, ...]], key_began: int) -> None:
    """End the node's composition, which judged KEY within it reading `key_reads` from change `key_began` on."""
    r = Reads(MemoryView(), began)
    r.tokens.add(A)
    within = r.judged[KEY[1]] = Reads(MemoryView(), key_began)
    within.tokens |= key_reads
    d.done(ACE, r)


def test_a_key_judged_within_its_nodes_composition_keeps_that_read_set_and_is_not_judged_again_for_it() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.take("node:ace")
    d.writing({("s", "b"): ACE})
    d.changed({B}, route, writers=d.writers("s", "b"), count=1)  # the composition's own write of what the key read
    d.add([KEY], route)  # the key is new: the change that made it starts its judgment (actors/routing.py)
    d.written({("s", "b"): ACE})
    _composed(d, 0, {B}, 0)
    assert d.idle(), "the key's judgment learnt nothing a run would: it left the queue"
    d.changed({B}, route, count=2)  # another's change of what the key read
    assert [j for j, _ in d.take("node:ace")] == [KEY], "the read set kept from the composition wakes the key"


def test_a_key_judged_within_a_composition_that_missed_a_change_is_judged_again() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.take("node:ace")
    d.changed({B}, route, count=2)  # another's change, after the key was judged at 1: the key's read set is unknown yet
    _composed(d, 0, {B}, 1)
    assert [j for j, _ in d.take("node:ace")] == [KEY]


def test_a_key_judged_within_a_composition_while_its_own_judgment_runs_is_left_to_that_run() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.add([KEY], "bound:postgres")
    d.take("node:ace")
    d.take("bound:postgres")  # the key's judgment runs at its provider's actor meanwhile
    d.changed({B}, route, count=2)  # both runs read b before this change
    _composed(d, 0, {B}, 1)
    assert d.take("node:ace") == [], "a judgment that runs is not queued a second time"
    r = Reads(MemoryView(), 1)
    r.tokens.add(B)
    d.done(KEY, r)  # its own run ends: it missed the change, and runs again where it ran
    assert [j for j, _ in d.take("bound:postgres")] == [KEY]


def test_a_key_judged_within_a_composition_leaves_the_queue_of_whichever_actor_it_waited_at() -> None:
    d = Dispatcher(Ticks())
    d.add([ACE], "node:ace")
    d.take("node:ace")
    d.add([KEY], "bound:postgres")  # its provider's word, before the composition read it
    _composed(d, 0, {B}, 1)
    assert d.take("bound:postgres") == [] and d.idle()
