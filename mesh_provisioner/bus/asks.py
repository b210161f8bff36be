"""The operator's channel (contract section 5.4): publishing asks, and hearing that the router decided one.

An ask goes out through JetStream on `asks.ask.mesh-provisioner` with header `Nats-Msg-Id: <ask id>`, so that
JetStream drops a second publish of the same ask (design.md property 4: the operator is asked once). The router
says it decided by any message on `asks.decided.mesh-provisioner`; its records are read through the cache (state
`asks.records`), not here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

from mesh_provisioner.contract import ASK_SUBJECT, DECIDED_SUBJECT
from mesh_provisioner.messages.records import Ask, encode

log = logging.getLogger("mesh_provisioner.bus.asks")


class NoRouter(RuntimeError):
    """No JetStream stream takes asks: there is no router in the mesh yet."""


class Asks:
    """Publishes the seat's asks to the router, and tells a listener each time the router decides one."""

    def __init__(self, nc: Client, *, timeout: float = 10.0) -> None:
        """The channel over `nc`; a publish waits `timeout` s at most for JetStream's acknowledgement."""
        self.published = 0
        self.duplicates = 0
        self._nc = nc
        self._js = nc.jetstream(timeout=timeout)

    async def publish(self, ask: Ask) -> api.PubAck:
        """Publish an ask, de-duplicated by its id (section 5.4); answers JetStream's acknowledgement.

        Raises NoRouter when no stream takes `asks.ask.mesh-provisioner`.
        """
        if not ask.id:
            raise ValueError("an ask without an id is not published: its id is what de-duplicates it")
        try:
            ack = await self._js.publish(ASK_SUBJECT, encode(ask), headers={"Nats-Msg-Id": ask.id})
        except nats.js.errors.NoStreamResponseError:
            raise NoRouter(
                f"no JetStream stream takes {ASK_SUBJECT}: there is no router yet, so ask {ask.id} is not published"
            ) from None
        if ack.duplicate:
            self.duplicates += 1
            log.debug("ask %s was published before; JetStream kept the first", ask.id)
        else:
            self.published += 1
            log.info("published ask %s", ask.id)
        return ack

    async def subscribe_decided(self, callback: Callable[[], None]) -> Subscription:
        """Call `callback` on each message on `asks.decided.mesh-provisioner`, on the loop; it must not block.

        What the message says does not matter (section 5.4: the router publishes any message; the records tell).
        A core NATS subscription: nats-py subscribes again after each reconnect.
        """

        async def heard(msg: Msg) -> None:
            try:
                callback()
            except Exception:
                log.exception("the decided listener failed")

        return await self._nc.subscribe(DECIDED_SUBJECT, cb=heard)
