"""Design.md, "Functional core": a composition reads the cache's memory, never the network."""

from __future__ import annotations

from datetime import UTC, datetime

from helpers import NatsServer, seed_buckets

from mesh_provisioner.bus.cache import Cache, watched_states
from mesh_provisioner.bus.connection import connect
from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.contract import PROVISIONS
from mesh_provisioner.rules.node import compose_node, rejudge
from mesh_provisioner.rules.reads import known_nodes
from mesh_provisioner.rules.retire import decide
from mesh_provisioner.samples import sample_mesh

NOW = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)


def test_a_composition_of_a_node_reads_nothing_over_the_network(nats_server: NatsServer) -> None:
    # Every bucket exists, so no watch of a missing one polls in the background while the rules run.
    seed_buckets(nats_server.url, watched_states())
    with EventLoopThread() as loop:
        loop.run(load_states(nats_server.url, sample_mesh()), 30)
        nc = loop.run(connect([nats_server.url]), 10)
        cache = Cache(nc)
        loop.run(cache.start(), 10)
        loop.run(cache.wait_synced(30), 30)
        before = cache.requests
        assert before > 0  # the counter is live: loading the cache itself made requests
        writes = 0
        for node in sorted(known_nodes(cache.view)):
            writes += len(compose_node(cache.view, node, NOW).writes)
        for key in cache.view.keys(PROVISIONS):
            rejudge(cache.view, key, NOW)
            decide(cache.view, key, NOW)
        assert writes > 0  # the rules judged something real: the sample mesh is not composed yet
        assert cache.requests == before
        loop.run(cache.stop(), 10)
        loop.run(nc.close(), 10)
