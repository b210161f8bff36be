"""The nats-servers of a fault run, all on 127.0.0.1: one server (the package's embedded one), or a cluster of three.

The cluster's servers route to each other on free loopback ports, each with JetStream in a store directory of its
own; any one can be killed (SIGKILL) and started again on the same ports and store. Nothing listens anywhere but
127.0.0.1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
from nats.js.api import StreamConfig

from mesh_provisioner.bus.embedded import EmbeddedServer, free_port
from meshcheck.bus import until


def server(root: Path, *, max_payload: int = 0) -> EmbeddedServer:
    """A nats-server with JetStream on a free loopback port, its store under `root` (not started)."""
    root.mkdir(parents=True, exist_ok=True)
    config = None
    if max_payload:
        config = root / "nats-server.conf"
        # JetStream takes a message up to the max payload: a megabyte value needs more than the default 1 MB.
        config.write_text(f"max_payload: {max_payload}\n")
    return EmbeddedServer(store=root, config=config)


class Cluster:
    """Three nats-servers in one JetStream cluster on loopback."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        ports = [free_port() for _ in range(size)]
        routes = [free_port() for _ in range(size)]
        self.servers: list[EmbeddedServer] = []
        for i in range(size):
            home = root / f"n{i + 1}"
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "nats-server.conf"
            others = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i)
            conf.write_text(
                f"server_name: n{i + 1}\n"
                f"cluster {{\n  name: faults\n  listen: 127.0.0.1:{routes[i]}\n  routes: [{others}]\n}}\n"
            )
            self.servers.append(EmbeddedServer(store=home, port=ports[i], config=conf))

    @property
    def url(self) -> str:
        """Every server's client URL, comma-separated, as `--nats` takes a cluster."""
        return ",".join(s.url for s in self.servers)

    def start(self, timeout: float = 60.0) -> Cluster:
        """Start every server, then wait until JetStream keeps a stream on three of them."""
        for s in self.servers:
            s.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the cluster has a JetStream leader and three peers: a replicated stream can be made."""

        async def replicated() -> bool:
            nc = await nats.connect(self.url.split(","), connect_timeout=2, max_reconnect_attempts=1)
            try:
                js = nc.jetstream(timeout=5)
                name = "faults_ready"
                await js.add_stream(StreamConfig(name=name, subjects=["faults.ready"], num_replicas=len(self.servers)))
                await js.delete_stream(name)
                return True
            except (nats.errors.Error, TimeoutError, OSError):
                return False
            finally:
                await nc.close()

        until(lambda: asyncio.run(replicated()), timeout, 0.25, "the cluster to keep a replicated stream")

    def index(self, name: str) -> int | None:
        """The index of the server of this name (`n1`...), None for any other name."""
        return next((i for i in range(len(self.servers)) if name == f"n{i + 1}"), None)

    def kill(self, i: int) -> None:
        """Kill one server at once (SIGKILL), as a crash would."""
        self.servers[i].kill()

    def revive(self, i: int) -> None:
        """Start a killed server again, on its ports and store."""
        self.servers[i].start()

    def stop(self) -> None:
        """Stop every server."""
        for s in self.servers:
            s.stop()
