"""From one change of the cache to the judgments it wakes, each at the actor that runs it (contract section 6).

A change wakes the judgments whose last read set it touched (rules/reads.py, actors/dispatch.py); a new node or
key starts the judgments it needs (every node is composed, every key judged, every retiring key waiting for its
answer looked at: rules/settle.py's fixed point); and each woken judgment is queued at one actor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Final

from mesh_provisioner.actors.dispatch import COMPOSE, JUDGE, LOOK, Dispatcher, Judgment
from mesh_provisioner.contract import ASK_RECORDS, BUILDS, MANIFESTS, MODULES, PLACEMENT, PROVISIONS
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.keys import is_token, node_of, shaped_as_shared_credential
from mesh_provisioner.rules.reads import NODE_STATES, token, touched
from mesh_provisioner.rules.view import Entry, View, group_of, not_a_node
from mesh_provisioner.rules.writing import judged_alike

log = logging.getLogger("mesh_provisioner.actors.routing")

ASKER: Final = "asker"


class Router:
    """Wakes and starts judgments for each change, on the loop that applies changes: it never blocks."""

    def __init__(self, dispatcher: Dispatcher, view: Callable[[], View], bound_reads: Iterable[str]) -> None:
        self.dispatcher = dispatcher
        self.view = view
        self.bound_reads = frozenset(bound_reads)
        # The nodes whose keys this seat writes (a partitioned seat's, contract 8.1); None: every node's.
        self.writes_on: Callable[[str], bool] | None = None
        self._no_nodes: set[str] = set()  # placement keys said to be no node (section 7), each said once

    def no_node(self, key: str) -> None:
        """Say once that a placement key is no node (section 7): nothing under it is composed or placed."""
        why = not_a_node(key)
        if why and key not in self._no_nodes:
            self._no_nodes.add(key)
            log.warning("%s", why)

    def changed(self, state: str, key: str, old: Entry | None, new: Entry | None, ours: bool, count: int) -> None:
        """Wake the judgments one change of the cache may change, and start those a new node or key needs.

        `count`: the change's place among the cache's changes; `ours`: the seat's own write, which does not wake its
        writer. A change of another process's node wakes only this process's judgments of what it may depend on here.
        """
        if state == PLACEMENT and new is not None and not is_token(key):
            self.no_node(key)
        route = partial(self.route, state, key)
        writers = self.dispatcher.writers(state, key) if ours else ()
        tokens = touched(self.view(), state, key, old, new)
        # A key's state, why and reference come from its provider's outcome alone (5.3): a key's own judgment, woken by
        # every input of that outcome, keeps them. When one of the seat's key judgments changed only those, the node
        # compositions that read the key would compute the same outcome and write nothing: they are not woken by it.
        spared = token("get", state, key) if writers and _judged_only(state, writers, old, new) else None
        self.dispatcher.changed(tokens, route, time.monotonic(), writers, count, spared)
        if new is None:
            return
        node = group_of(state, key)
        theirs = self.writes_on is not None and is_token(node) and not self.writes_on(node)
        p = new.get(r.Provision) if state == PROVISIONS and self.writes_on is not None else None
        if p is not None and p.depends_on:
            # A partitioned seat (contract 8.1): a key may depend on a shared credential of a node this process
            # writes, which is made here when a key of another process's node depends on it, or when it is missing
            # (rules/node.py `shared_credential`); the dispatcher keeps only our nodes' judgments of those.
            view = self.view()
            new_deps = [(JUDGE, d) for d in p.depends_on[:2]
                        if (theirs or (shaped_as_shared_credential(d) and node_of(d) != node
                                       and view.get(PROVISIONS, d) is None))
                        and not self.dispatcher.knows((JUDGE, d))]
            if new_deps:
                self.dispatcher.add(new_deps, route)
        if state in NODE_STATES and theirs:
            return  # another process's node: nothing of it is composed, judged or looked at here
        if state in NODE_STATES and not self.dispatcher.knows((COMPOSE, node)):
            if not is_token(node):
                # Section 7: a key whose node is not a token is bad input; nothing is composed for it (a placement
                # key is said once, above).
                if state != PLACEMENT:
                    log.warning("%s %s names no node (%r is not a token): nothing is composed for it", state, key, node)
            else:
                self.dispatcher.add([(COMPOSE, node)], f"node:{node}")
        if state == PROVISIONS:
            if not self.dispatcher.knows((JUDGE, key)):
                self.dispatcher.add([(JUDGE, key)], route)
            p = new.get(r.Provision)
            waits = p is not None and p.state == r.RETIRING and bool(p.ask) and p.warrant is None
            if waits and not self.dispatcher.knows((LOOK, key)):
                self.dispatcher.add([(LOOK, key)], ASKER)

    def route(self, state: str, key: str, j: Judgment) -> str:
        """The actor that runs a judgment a change of `state` at `key` woke.

        A node's composition runs at its node's actor, a look at the asker. The keys one change wakes are judged
        together, in batches of writes (actors/base.py `BATCH`), by one actor: the provider's bound actor for its
        entries, else the changed key's node's (a provider's have, a key whose state its dependents follow), else the
        key's own node.
        Writes are compare-and-set, so the actor need not own them (design.md, "Parallel, not shared"); a shared
        credential's change would otherwise wake hundreds of actors for one write each.
        """
        kind, subject = j
        if kind == COMPOSE:
            return f"node:{subject}"
        if kind == LOOK:
            return ASKER
        provider = state.removesuffix(".bound")
        if provider != state and provider in self.bound_reads:
            return f"bound:{provider}"
        node = group_of(state, key)
        mine = self.writes_on is None or not is_token(node) or self.writes_on(node)
        if state in (MODULES, MANIFESTS, BUILDS, ASK_RECORDS) or not is_token(node) or not mine:
            node = subject.split(".", 1)[0]
        return f"node:{node}" if is_token(node) else ASKER


def _judged_only(state: str, writers: list[Judgment], old: Entry | None, new: Entry | None) -> bool:
    """Whether a provision's change was made by key judgments alone and changed only what its provider's outcome says
    (`state`, `why`, `reference`, and `at` and `v` with them): nothing a composition decides."""
    if state != PROVISIONS or old is None or new is None or any(kind != JUDGE for kind, _ in writers):
        return False
    was, now = old.get(r.Provision), new.get(r.Provision)
    return was is not None and now is not None and judged_alike(was, now)
