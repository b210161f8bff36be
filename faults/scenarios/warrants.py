"""Forged and replayed warrants (contract 5.4): with the router's key configured, only the router's own answer for
this key's ask is taken.

Both seats are given the router's ed25519 public key (`Config.router_key`). A stream of changes retires keys
(modules taken off bee, their wants removed), so that each has an ask. Then, for every retiring key of the disturbed
bus, the router's record of its ask is written again and again with answers that must all be refused: unsigned,
signed by another key, a signed warrant altered after signing, a signature that is not base64 or of the wrong
length, a valid warrant of another module, of another option, of an option bound to another act, and a valid signed
warrant replayed from another key's ask (as it is, and with its ask rewritten). After each round the seat must have
taken none: every such key still retiring with no warrant. Then the router's genuine answer is written for each key
of both buses (yes or no, each key always the same), and it must be taken.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any

import msgspec

from faults.mesh import final_changes, random_changes
from faults.twin import Params, Run, Twin, finish
from mesh_provisioner.contract import ASK_RECORDS, DECIDED_SUBJECT, PLACEMENT, PROVISIONS, WANTS
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.retire import act, act_digest
from meshcheck import check
from meshcheck.bus import Signer, record, until

NAME = "warrants"
FAULTS = "forged or replayed answers to retiring asks"
CHANGES = 120
GOOD_CHANGES = 60
RETIRED = ("webapp", "mailer")

Forge = Callable[[str, str, str, str], bytes]
"""(key, its ask id, another key, its ask id) -> a record the seat must refuse."""


def forgeries(router: Signer, forger: Signer) -> dict[str, Forge]:
    """Every kind of answer the seat must refuse, by name."""

    def replayed(key: str, ask: str, other: str, other_ask: str) -> bytes:
        return record(other, other_ask, "yes", signer=router)

    def rewritten(key: str, ask: str, other: str, other_ask: str) -> bytes:
        signed = msgspec.json.decode(record(other, other_ask, "yes", signer=router))
        signed["warrant"]["ask"] = ask
        signed["ask"]["id"] = ask
        return msgspec.json.encode(signed)

    def altered(key: str, ask: str, other: str, other_ask: str) -> bytes:
        signed = msgspec.json.decode(record(key, ask, "no", signer=router))
        signed["warrant"]["option"] = "yes"
        return msgspec.json.encode(signed)

    return {
        "unsigned": lambda key, ask, *_: record(key, ask, "yes"),
        "signed by another key": lambda key, ask, *_: record(key, ask, "yes", signer=forger),
        "altered after signing": altered,
        "a signature not base64": lambda key, ask, *_: record(key, ask, "yes", warrant={"sig": "not base64!"}),
        "a signature of the wrong length": lambda key, ask, *_: record(key, ask, "yes", warrant={"sig": "AAAA"}),
        "another module's": lambda key, ask, *_: record(key, ask, "yes", signer=router, warrant={"asker": "other"}),
        "an option not offered": lambda key, ask, *_: record(key, ask, "maybe", signer=router),
        "an option bound to another act": lambda key, ask, other, other_ask: record(
            key, ask, "yes", signer=router, binds=act_digest(act(other, other_ask, "yes"))),
        "replayed from another key's ask": replayed,
        "replayed with its ask rewritten": rewritten,
    }


def waiting(bus: Any) -> dict[str, str]:
    """Every retiring key of a bus whose ask waits for an answer, and its ask id."""
    out = {}
    for key, value in bus.entries(PROVISIONS).items():
        p = r.decode(r.Provision, value)
        if p.state == r.RETIRING and p.ask and p.warrant is None:
            out[key] = p.ask
    return out


def answer(key: str) -> str:
    """The router's genuine answer for a key, the same on both buses."""
    return "yes" if zlib.crc32(key.encode()) % 2 else "no"


def run(p: Params) -> Run:
    """One run: a stream that retires keys, `p.changes` forged answers, then the genuine ones; every check."""
    out = Run(NAME, p.seed)
    rng = random.Random(p.seed)
    router, forger = Signer(), Signer()
    kinds = forgeries(router, forger)
    # The stream, with the router left out: only this scenario answers asks.
    changes = [c for c in random_changes(rng, GOOD_CHANGES, p.nodes) if c[0] != "router"]
    with check.watching_errors() as errors, Twin(
        p.work, nodes=p.nodes, pace=p.pace, router_key=router.public
    ) as twin:
        sup = twin.start_disturbed()
        for change in changes:
            twin.write(change, out)
        for change in final_changes(changes, p.nodes):
            twin.write(change, out)
        bee = {"node": "bee", "modules": [{"module": "reports"}]}
        twin.write((PLACEMENT, "bee", bee), out)
        for module in RETIRED:
            twin.write((WANTS, f"want.bee.{module}", {"fp": "", "removed": True}), out)
        for seat in (sup, twin.reference_seat):
            seat.wait_settled(60)
        keys = until(lambda: waiting(twin.disturbed), 30, 0.1, "retiring keys with asks")
        refused: dict[str, int] = dict.fromkeys(kinds, 0)
        taken: list[str] = []
        order = sorted(keys)
        forged = 0
        while forged < p.count(CHANGES):
            for i, key in enumerate(order):
                if forged >= p.count(CHANGES):
                    break
                kind = rng.choice(sorted(kinds))
                other = order[(i + 1) % len(order)]
                twin.disturbed.put(ASK_RECORDS, keys[key], kinds[kind](key, keys[key], other, keys[other]))
                twin.disturbed.publish(DECIDED_SUBJECT, b"{}")
                refused[kind] += 1
                forged += 1
                out.fault()
            sup.wait_settled(60)
            still = waiting(twin.disturbed)
            taken += [f"a forged answer was taken for {key}" for key in order if key not in still]
            order = [key for key in order if key in still]
            if not order:
                break
        # The router's genuine answers, on both buses.
        for bus in (twin.disturbed, twin.reference):
            for key, ask in waiting(bus).items():
                bus.decide(key, ask, answer(key), signer=router)
        out.changed()

        def genuine() -> list[str]:
            problems = list(taken)
            left = waiting(twin.disturbed)
            problems += [f"the router's genuine answer for {key} was not taken" for key in sorted(left)]
            for key in sorted(keys):
                p_ = twin.disturbed.provision(key)
                if p_ is not None and p_.warrant is not None and p_.warrant.option != answer(key):
                    problems.append(f"{key} took the answer {p_.warrant.option}, not the router's {answer(key)}")
            return problems

        finish(out, twin, settled=sup.wait_settled, answers=lambda: check.composes(sup), errors=errors, more=genuine)
        out.figures.update(retiring_keys=len(keys), forged_by_kind={k: v for k, v in refused.items() if v})
    return out

