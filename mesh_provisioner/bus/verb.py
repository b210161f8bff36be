"""The seat's verb on the bus (contract 9): a NATS micro service answering `mesh-provisioner.provisioning`.

The answer is `rules.verb.answer` over a view of the bus (the cache's, read on the loop that changes it, so every
reply is one consistent picture; a state a partitioned seat keeps only in part is read from the bus: a node's keys
alone when the request names a node, else the whole state). As a NATS service it is discoverable: `$SRV.PING`,
`$SRV.INFO` and `$SRV.STATS` (each also `.mesh-provisioner` and `.mesh-provisioner.<id>`) answer with its name,
version and endpoint. Several seat processes may serve it at once: the endpoint's queue group gives each request to
one of them.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Endpoint, EndpointConfig, Service, ServiceConfig

from mesh_provisioner.bus.link import unless_closed
from mesh_provisioner.bus.snapshot import node_snapshot, snapshot
from mesh_provisioner.contract import VERB_ENDPOINT, VERB_SERVICE, VERB_SUBJECT
from mesh_provisioner.rules import verb
from mesh_provisioner.rules.view import View

log = logging.getLogger("mesh_provisioner.bus.verb")

DESCRIPTION: Final = (
    "Reads what mesh-provisioner keeps (contract 9): plans, provisions, refused, the registry, the retired needs, or "
    "what each machine's provisioner client wrote (applied, collect), narrowed by node, module and collection. Read "
    "only."
)
# A request's error is also said in the micro service's error headers, so service tools show it.
BAD_REQUEST: Final = "400"
INTERNAL: Final = "500"


def version() -> str:
    """The package's version, as the service announces it (semantic versioning, as NATS services require)."""
    try:
        return importlib.metadata.version("mesh-provisioner")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


async def serve_verb(
    nc: Client,
    view: View | Callable[[], View],
    *,
    held: Callable[[str, str], bool] = lambda state, node: True,
    service_version: str | None = None,
    timeout: float = 10.0,
) -> Service:
    """Serve the verb on `nc` from a view (or a callable answering the current one); answers the started service.

    A request for a state the view may not hold all of (`held(state, node)` says whether it holds all of a state's
    keys, or of a node's: a partitioned seat's memory keeps only what its judgments read, contract 8.1) is answered
    from the bus, within `timeout` s: the node's keys read one by one when it names a node, the state read whole when
    it does not. Runs on the loop that owns `nc`;
    the handler runs there too. Stop it with `await service.stop()`.
    """
    current: Callable[[], View] = view if callable(view) else (lambda: view)

    async def source(request: bytes) -> View:
        asked = verb.asked(request)
        if asked is None or held(*asked):
            return current()
        state, node = asked
        if node:
            return await node_snapshot(nc, state, node, timeout=timeout)
        return await snapshot(nc, states=[state], timeout=timeout)

    endpoints: list[Endpoint] = []

    def count_error(why: str) -> None:
        # nats-py counts an error in $SRV.STATS only when the handler raises, and then answers without the body the
        # contract gives an error ({"error"}); the handler answers it itself, so it counts it itself.
        for endpoint in endpoints:
            endpoint._num_errors += 1
            endpoint._last_error = why  # type: ignore[assignment]  # nats-py types it None, then sets a str

    async def handle(request: Request) -> None:
        try:
            reply = verb.reply(await source(request.data), request.data)
        except Exception as err:
            # Contract section 7: nothing read can crash the seat; a request that finds a bug is told so.
            log.exception("the verb could not answer a request")
            why = f"the seat could not answer: {type(err).__name__}: {err}"
            count_error(f"{INTERNAL} {why}")
            await request.respond_error(INTERNAL, "the seat could not answer", data=verb.encode(verb.Error(why)))
            return
        body = verb.encode(reply)
        if isinstance(reply, verb.Error):
            log.info("the verb refused a request: %s", reply.error)
            count_error(f"{BAD_REQUEST} {reply.error}")
            await request.respond_error(BAD_REQUEST, reply.error, data=body)
        else:
            await request.respond(body)

    return await unless_closed(nc, _start(nc, handle, endpoints, service_version))


async def _start(nc: Client, handle: Callable[[Request], Awaitable[None]], endpoints: list[Endpoint],
                 service_version: str | None) -> Service:
    """Add the verb's service and endpoint to `nc` (its endpoint put in `endpoints`), answering from the moment this
    returns."""
    service = await add_service(
        nc,
        ServiceConfig(name=VERB_SERVICE, version=service_version or version(), description=DESCRIPTION,
                      metadata={"contract": "9"}),
    )
    await service.add_endpoint(
        EndpointConfig(name=VERB_ENDPOINT, subject=VERB_SUBJECT, handler=handle,
                       metadata={"what": "|".join(verb.STATES), "default": verb.DEFAULT_WHAT})
    )
    endpoints.extend(e for e in service._endpoints if e._name == VERB_ENDPOINT)
    # nats-py subscribes an endpoint without flushing: the verb answers from the moment this returns.
    await nc.flush()
    log.info("serving the verb on %s as service %s %s", VERB_SUBJECT, VERB_SERVICE, service.id)
    return service
