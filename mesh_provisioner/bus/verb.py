"""The seat's verb on the bus (contract 9): a NATS micro service answering `mesh-provisioner.provisioning`.

The answer is `rules.verb.answer` over a view of the bus (the cache's, read on the loop that changes it, so every
reply is one consistent picture). As a NATS service it is discoverable: `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS`
(each also `.mesh-provisioner` and `.mesh-provisioner.<id>`) answer with its name, version and endpoint. Several
seat processes may serve it at once: the endpoint's queue group gives each request to one of them.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from typing import Final

from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointConfig, Service, ServiceConfig

from mesh_provisioner.messages.records import MODULE
from mesh_provisioner.rules import verb
from mesh_provisioner.rules.view import View

log = logging.getLogger("mesh_provisioner.bus.verb")

SERVICE_NAME: Final = MODULE
ENDPOINT_NAME: Final = "provisioning"
SUBJECT: Final = f"{MODULE}.{ENDPOINT_NAME}"  # contract 9
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


async def serve_verb(nc: Client, view: View | Callable[[], View], *, service_version: str | None = None) -> Service:
    """Serve the verb on `nc` from a view (or a callable answering the current one); answers the started service.

    Runs on the loop that owns `nc`; the handler runs there too. Stop it with `await service.stop()`.
    """
    current: Callable[[], View] = view if callable(view) else (lambda: view)

    async def handle(request: Request) -> None:
        try:
            reply = verb.reply(current(), request.data)
        except Exception as err:
            # Contract section 7: nothing read can crash the seat; a request that finds a bug is told so.
            log.exception("the verb could not answer a request")
            body = verb.encode(verb.Error(f"the seat could not answer: {type(err).__name__}: {err}"))
            await request.respond_error(INTERNAL, "the seat could not answer", data=body)
            return
        body = verb.encode(reply)
        if isinstance(reply, verb.Error):
            log.info("the verb refused a request: %s", reply.error)
            await request.respond_error(BAD_REQUEST, reply.error, data=body)
        else:
            await request.respond(body)

    service = await add_service(
        nc,
        ServiceConfig(name=SERVICE_NAME, version=service_version or version(), description=DESCRIPTION,
                      metadata={"contract": "9"}),
    )
    await service.add_endpoint(
        EndpointConfig(name=ENDPOINT_NAME, subject=SUBJECT, handler=handle,
                       metadata={"what": "|".join(verb.STATES), "default": verb.DEFAULT_WHAT})
    )
    # nats-py subscribes an endpoint without flushing: the verb answers from the moment this returns.
    await nc.flush()
    log.info("serving the verb on %s as service %s %s", SUBJECT, SERVICE_NAME, service.id)
    return service
