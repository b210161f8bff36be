"""A host that embeds the seat: `python examples/embed.py [NATS_URL]`.

Without a URL it starts a nats-server of its own (the `demo` extra's) and loads the sample mesh into it, as
`mesh-provisioner demo` does; with one it runs on that server as it is. It starts a supervisor, asks it to compose a
node, crashes one of its actors (the supervisor restarts it), waits until everything is settled, prints what it saw
and stops only its own actors. This is what the README's "Embedding it" shows, runnable; the tests run it.
"""

from __future__ import annotations

import asyncio
import sys

from mesh_provisioner import Config
from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import load_states, router_stream
from mesh_provisioner.runtime import Runtime
from mesh_provisioner.samples import sample_mesh


def run(url: str) -> int:
    """Embed a seat on `url`: compose, crash an actor, settle, stop. 0 when it settled."""
    sup = Runtime.start(Config(nats=url))
    try:
        composed = sup.compose("ace").get(timeout=30)
        print(f"composed ace: {composed.node}, {len(composed.plans_written)} plan(s) written")
        print("children:", ", ".join(sup.children()))
        sup.kill("node:ace")  # dies as a crash would; the supervisor restarts it, and it resynchronises
        settled = sup.wait_settled(timeout=30)
        print("settled:", settled, "| restarts:", sup.status().restarts)
        return 0 if settled else 1
    finally:
        sup.stop()  # only its own actors: a host's other actors keep running


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        return run(argv[1])
    with EmbeddedServer() as server:
        asyncio.run(load_states(server.url, sample_mesh()))
        asyncio.run(router_stream(server.url))  # a stand-in for the router of asks, as the demo has
        return run(server.url)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
