"""Bad input in every bucket the seat reads (contract section 7, design.md property 5), hypothesis-generated.

Two shares of the same generator (`faults.badinput`):

- the pure rules take `--inputs` of them (100,000 by default): each put in a MemoryView of the sample mesh settled,
  what it wakes composed, judged and decided, every write checked, and now and then the whole view settled;
- the live seat takes `--count` of them (400 by default), drawn a few thousand at a time and written into the
  disturbed bus's read buckets while the stream of good changes goes on (on a server that takes values of 24 MB,
  so megabyte strings reach the seat even JSON-escaped); then every key that got a bad value is given back its good
  value (or deleted), and the seat must end where the undisturbed seat, which saw the good changes only, ends.
  Halfway, the seat must still compose when asked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable

from faults.badinput import READ_STATES, pure_run, stream_inputs
from faults.mesh import ROUTER, Change, final_changes, initial_states, random_changes
from faults.twin import Params, Run, Twin, finish
from meshcheck import check
from meshcheck.bus import raw

NAME = "bad-input"
FAULTS = "bad values in every read bucket (hypothesis-generated)"
CHANGES = 400
GOOD = 60
# The largest value the generator makes: three megabyte strings of a character JSON escapes in six bytes (19 MB).
MAX_PAYLOAD = 24 << 20


def run(p: Params) -> Run:
    """One run: the pure share, then the live share during a stream of good changes; every check."""
    out = Run(NAME, p.seed)
    pure = pure_run(p.inputs, p.seed)
    out.figures.update(pure_inputs=pure.inputs, pure_settles=pure.settles, pure_seconds=round(pure.seconds, 1))
    out.lost += [f"the pure rules: {problem}" for problem in pure.problems]
    count = p.count(CHANGES)
    bad = stream_inputs(count, p.seed, live=True)
    good_changes = random_changes(random.Random(p.seed), GOOD, p.nodes)
    good: dict[tuple[str, str], bytes | None] = {
        (state, key): value for state, values in initial_states(p.nodes).items() for key, value in values.items()}
    try:
        live(p, out, bad, count, good_changes, good)
    except Exception as err:  # the pure share's figures stay with the run
        out.lost.append(f"the live share could not finish: {type(err).__name__}: {err}")
    return out


def live(p: Params, out: Run, bad: Iterable[tuple[str, str, bytes]], count: int, good_changes: list[Change],
         good: dict[tuple[str, str], bytes | None]) -> None:
    """The live share: bad values into the disturbed bus during the good changes, then given back; every check."""
    touched: set[tuple[str, str]] = set()
    # This run's stream is its bad values, put as fast as the bus takes them (their pace is in its figures); the good
    # changes go between them, not at a pace of their own.
    with check.watching_errors() as errors, Twin(p.work, nodes=p.nodes, max_payload=MAX_PAYLOAD) as twin:
        for bus in (twin.disturbed, twin.reference):
            for state in READ_STATES:  # as the modules owning them would have made them
                bus.create_bucket(state)
        sup = twin.start_disturbed()
        every = max(1, count // max(1, len(good_changes)))
        started = time.monotonic()
        g = 0
        for i, (state, key, value) in enumerate(bad):
            if time.monotonic() - started > p.seconds:
                break
            twin.disturbed.put(state, key, value, validate=False)
            touched.add((state, key))
            out.fault()
            if i % every == 0 and g < len(good_changes):
                change = good_changes[g]
                g += 1
                twin.write(change, out)
                if change[0] != ROUTER:
                    good[(change[0], change[1])] = None if change[2] is None else raw(change[2])
            if i == count // 2:
                out.lost += [f"halfway through the bad input: {what}" for what in check.composes(sup)]
        putting = time.monotonic() - started
        for change in good_changes[g:]:
            twin.write(change, out)
            if change[0] != ROUTER:
                good[(change[0], change[1])] = None if change[2] is None else raw(change[2])
        # Every key that got a bad value is given back its good value: the seat must end where the other ends.
        for state, key in sorted(touched):
            kept = good.get((state, key))
            if kept is None:
                twin.disturbed.delete(state, key, validate=False)
            else:
                twin.disturbed.put(state, key, kept, validate=False)
        out.changed()
        for change in final_changes(good_changes, p.nodes):
            twin.write(change, out)
        finish(out, twin, settled=sup.wait_settled, answers=lambda: check.composes(sup), errors=errors)
        out.figures.update(live_inputs=out.faults, keys_touched=len(touched),
                           bad_values_per_second=round(out.faults / putting, 1) if putting > 0 else None,
                           failed_writes=sup.store.counts()["failed writes"])
