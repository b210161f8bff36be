"""The baseline: the seat's own rules run the way the Go seeds' process runs them, for `ratio_vs_seed_design`.

The seeds' process (`004_*`) composes the nodes a change touched with one worker, one node at a time, and its
holder (`000_*`) reads the bus through the runtime for every read: `Store.Get` per value and `Store.Keys` per
listing, no cache, and every index computed by scanning (`placedOn` lists every placement and reads each one,
`dependedOn` and `held` list every provision and read each one). Every write is a round trip too.

`RemoteView` is that: a View whose `get` is one `kv.get` and whose `keys` is one key listing, run on the bus loop
from the worker's thread, and whose indices are computed by scanning with those two. `run` makes the seeds' cold
pass: every node composed with `rules.node.compose_node`, one at a time, each write awaited, then every provision key
judged again with `rules.node.rejudge` (the seeds' bound watches deliver every entry at start). That is all the
seeds' process does from a cold start: its own writes wake nothing, so it goes quiet there, short of the fixed point
the seat reaches (the seeds' missing wake-ups). With `max_passes` above one it repeats whole passes until one writes
nothing, up to that fixed point. Its time is taken to its last write: a pass that only confirms the fixed point is
left out, in the baseline's favour.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js import api
from nats.js.kv import KV_DEL, KV_OP, KeyValue

from mesh_provisioner.bus.connection import ensure_buckets, open_bucket
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import (
    BUILDS,
    DEFAULT_BOUND_READS,
    HAVE,
    MANIFESTS,
    MODULES,
    PLACEMENT,
    PLANS,
    PROVISIONS,
    REFUSED,
    RESOLVED,
    WANTS,
)
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Delete, Put, Write
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.view import Entry, View, entry_of, group_of, kept_elsewhere, plan_provisions_of

TIMEOUT = 30.0


class RemoteView:
    """The bus as the seeds read it: a round trip for every value and every listing, indices by scanning."""

    def __init__(self, loop: EventLoopThread, buckets: dict[str, KeyValue], bound_reads: Iterable[str]) -> None:
        self.bound_reads = tuple(bound_reads)
        self._loop = loop
        self._buckets = buckets
        self.reads = 0

    # ---- the two reads ------------------------------------------------------------------------------------------

    def unrecorded(self) -> RemoteView:
        """This view: it records nothing."""
        return self

    def judging(self, key: str, below: View | None = None) -> View:
        """The view a key's judgment reads within a composition: `below`, or this view (it records nothing)."""
        return self if below is None else below

    def get(self, state: str, key: str) -> Entry | None:
        """One `kv.get` on the bus."""
        kv = self._buckets.get(state)
        if kv is None:
            return None
        self.reads += 1
        found = self._loop.run(_get(kv, key), TIMEOUT)
        return None if found is None else entry_of(state, key, found[0], found[1])

    def keys(self, state: str, node: str | None = None) -> list[str]:
        """One key listing on the bus; a node's keys are those of the listing that are the node's (as `held`)."""
        kv = self._buckets.get(state)
        if kv is None:
            return []
        self.reads += 1
        keys = self._loop.run(_keys(kv), TIMEOUT)
        return keys if node is None else [key for key in keys if group_of(state, key) == node]

    def plan_provisions(self, key: str) -> tuple[tuple[str, str], ...] | None:
        """One `kv.get` of a plan, as the seeds read a provider's plan."""
        return plan_provisions_of(self.get(PLANS, key))

    # ---- indices, by scanning -----------------------------------------------------------------------------------

    def _values(self, state: str, kind: type[Any]) -> Iterable[tuple[str, Any]]:
        for key in self.keys(state):
            e = self.get(state, key)
            value = e.get(kind) if e is not None else None
            if value is not None:
                yield key, value

    def placed_on(self, module: str) -> list[str]:
        """As the seeds' `placedOn`: every placement read, and the nodes naming the module."""
        return sorted(node for node, p in self._values(PLACEMENT, r.Placement)
                      if any(m.module == module for m in p.modules))

    def is_placed(self, module: str, node: str) -> bool:
        """As the seeds' `placedOn`, asked of one node."""
        return node in self.placed_on(module)

    def is_placed_anywhere(self, module: str) -> bool:
        """As the seeds' `placedOn`, asked whether it names any node."""
        return bool(self.placed_on(module))

    def providers_of(self, provision: str) -> set[str]:
        """Every registered module read with its trunk manifest, and those providing the provision."""
        out = set()
        for module, entry in self._values(MODULES, r.ModuleEntry):
            if not entry.manifest:
                continue
            e = self.get(MANIFESTS, entry.manifest)
            m = e.get(r.Manifest) if e is not None else None
            if m is not None and any(o.name == provision for o in m.offers()):
                out.add(module)
        return out

    def provided_by(self, module: str, node: str) -> set[str]:
        """Every provision read, and those whose provider is the module on the node."""
        return {key for key, p in self._values(PROVISIONS, r.Provision)
                if p.provider.module == module and p.provider.node == node}

    def provided_on(self, node: str) -> set[str]:
        """Every provision read, and those whose provider is on the node."""
        return {key for key, p in self._values(PROVISIONS, r.Provision) if p.provider.node == node}

    def dependents(self, key: str) -> set[str]:
        """Every provision read, and those depending on the key."""
        return {other for other, p in self._values(PROVISIONS, r.Provision) if key in p.depends_on}

    def judged_on(self, node: str) -> list[str]:
        """The node's provisions listed, but the shared credentials other nodes depend on (each read to tell)."""
        return [key for key in self.keys(PROVISIONS, node) if not kept_elsewhere(self, key)]

    def needing(self, provision: str) -> set[str]:
        """Every plan read, and the nodes of those naming the provision."""
        return {k.node_of(key) for key, rec in self._values(PLANS, r.PlanRecord)
                if any(p.provision == provision for p in rec.plan.provisions)}

    def provided_by_module(self, module: str) -> set[str]:
        """Every provision read, and those whose provider is the module."""
        return {key for key, p in self._values(PROVISIONS, r.Provision) if p.provider.module == module}

    def nodes_naming(self, module: str) -> set[str]:
        """Every want and have key listed, and the nodes of those naming the module."""
        out = {key.split(".")[1] for key in self.keys(WANTS) if key.count(".") == 2 and key.split(".")[2] == module}
        return out | {key.split(".")[0] for key in self.keys(HAVE) if key.partition(".")[2] == module}

    def manifest_users(self, manifest: str) -> set[str]:
        """Every registration and build read, and the modules of those naming the manifest."""
        out = {key for key, e in self._values(MODULES, r.ModuleEntry) if e.manifest == manifest}
        return out | {key.split(".")[0] for key, b in self._values(BUILDS, r.Build) if b.manifest == manifest}

    def keys_of_ask(self, ask: str) -> set[str]:
        """Every provision read, and those naming the ask."""
        return {key for key, p in self._values(PROVISIONS, r.Provision) if p.ask == ask}

    def asking(self) -> set[str]:
        """Every provision read, and those naming an ask."""
        return {key for key, p in self._values(PROVISIONS, r.Provision) if p.ask}

    def requirers(self, provision: str) -> set[str]:
        """Every manifest read, and the modules using those requiring the provision."""
        out: set[str] = set()
        for mid, m in self._values(MANIFESTS, r.Manifest):
            if any(req.provision == provision for req in m.requires):
                out |= self.manifest_users(mid)
        return out


async def _get(kv: KeyValue, key: str) -> tuple[bytes, int] | None:
    try:
        e = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    return e.value or b"", e.revision or 0


async def _keys(kv: KeyValue) -> list[str]:
    """A bucket's keys through a watch of its last values, headers only, as `kv.keys()`; its consumer is deleted
    after (as the Go client's watcher does when stopped), so listings do not pile consumers up on the server."""
    watcher = await kv.watchall(ignore_deletes=True, meta_only=True)
    keys = []
    try:
        async for entry in watcher:
            if entry is None:
                break
            keys.append(entry.key)
    finally:
        consumer = getattr(watcher._sub, "_consumer", None)
        await watcher.stop()  # type: ignore[no-untyped-call]
        if isinstance(consumer, str):
            with contextlib.suppress(nats.errors.Error):
                await kv._js.delete_consumer(kv._stream, consumer)
    return keys


async def _write(js: Any, state_bucket: str, w: Write) -> None:
    """One write, awaited: a put (a create at revision 0) or a delete, each a compare-and-set as the seat's."""
    headers = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(w.revision)}
    if isinstance(w, Delete):
        headers[KV_OP] = KV_DEL
        await js.publish(f"$KV.{state_bucket}.{w.key}", b"", headers=headers)
    else:
        assert isinstance(w, Put)
        await js.publish(f"$KV.{state_bucket}.{w.key}", w.value, headers=headers)


@dataclass
class Baseline:
    """What the baseline did: its time to the fixed point, its passes, writes and reads."""

    seconds: float = 0.0
    first_pass_seconds: float = 0.0
    passes: int = 0
    writes: int = 0
    reads: int = 0
    writes_per_pass: list[int] = field(default_factory=list)


def run(url: str, *, bound_reads: Iterable[str] = DEFAULT_BOUND_READS, max_passes: int = 1) -> Baseline:
    """Run the baseline on the bus at `url`: `max_passes` passes at most, fewer when one writes nothing."""
    loop = EventLoopThread(name="seed-design-bus")
    out = Baseline()
    try:
        nc = loop.run(nats.connect(url), TIMEOUT)
        js = nc.jetstream(timeout=TIMEOUT)
        loop.run(ensure_buckets(js), TIMEOUT)
        bound_reads = tuple(bound_reads)
        states = (PLACEMENT, WANTS, MODULES, MANIFESTS, BUILDS, HAVE, RESOLVED, PLANS, PROVISIONS, REFUSED,
                  *(p + ".bound" for p in bound_reads))
        buckets: dict[str, KeyValue] = {}
        for state in states:
            try:
                buckets[state] = loop.run(open_bucket(js, state), TIMEOUT)[0]
            except nats.js.errors.BucketNotFoundError:
                continue
        view = RemoteView(loop, buckets, bound_reads)
        names = {s: b._name for s, b in buckets.items()}
        start = time.perf_counter()
        last_write = start
        for _ in range(max_passes):
            out.passes += 1
            wrote = 0
            now = datetime.now(UTC)
            nodes: set[str] = set()
            for state in (PLACEMENT, WANTS, HAVE, RESOLVED, PLANS, REFUSED, PROVISIONS):
                nodes |= {n for n in (group_of(state, key) for key in view.keys(state)) if k.is_token(n)}
            for node in sorted(nodes):
                for w in compose_node(view, node, now).writes:
                    loop.run(_write(js, names[w.state], w), TIMEOUT)
                    wrote += 1
                    last_write = time.perf_counter()
            for key in view.keys(PROVISIONS):
                for w in rejudge(view, key, now).writes:
                    loop.run(_write(js, names[w.state], w), TIMEOUT)
                    wrote += 1
                    last_write = time.perf_counter()
            out.writes_per_pass.append(wrote)
            out.writes += wrote
            if out.passes == 1:
                out.first_pass_seconds = last_write - start
            if wrote == 0:
                break
        out.seconds = last_write - start
        out.reads = view.reads
        loop.run(nc.close(), TIMEOUT)
    finally:
        loop.stop()
    return out
