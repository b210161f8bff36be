"""The bus records of the contract (sections 2 to 5, 8, 9) as msgspec Structs, and their exact encoding.

Every record is kebab-case on the bus and leaves out its empty optional fields (contract section 1). Decoding
ignores fields it does not know and refuses a wrong type with an error that names the state and key, so a reader
can say which value is bad and why (section 7).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Final, TypeVar

import msgspec

from mesh_provisioner.messages.sharing import shared

# The states of a provision (section 4).
ASKED: Final = "asked"
PROVIDED: Final = "provided"
FAILED: Final = "failed"
WAITS: Final = "waits"
RETIRING: Final = "retiring"
STATES: Final = (ASKED, PROVIDED, FAILED, WAITS, RETIRING)

# A have's phases and healths (section 2).
PHASE_RUNNING: Final = "running"
PHASE_FAILED: Final = "failed"
HEALTH_OK: Final = "ok"
HEALTH_FAILED: Final = "failed"


class Record(
    msgspec.Struct, frozen=True, rename="kebab", omit_defaults=True, forbid_unknown_fields=False, gc=False
):
    """A record of the bus: kebab-case, empty optional fields left out, unknown fields ignored.

    Untracked by the cycle collector (`gc=False`): a record decoded from JSON is a tree and holds no cycle, and the
    cache keeps one for nearly every key, so tracked they made each full collection walk them all (a settled
    1,000-node mesh: 252 ms a collection with them, 81 ms without, docs/BENCHMARKS.md).
    """


# ---- what the seat reads (section 2) ------------------------------------------------------------------------


class PlacedModule(Record, frozen=True):
    """One module placed on a node."""

    module: str = ""


class Placement(Record, frozen=True):
    """`mesh-controller.placement` `<node>`: the modules placed on a node."""

    node: str = ""
    modules: tuple[PlacedModule, ...] = ()


class Want(Record, frozen=True):
    """`mesh-assigner.wants` `want.<node>.<module>`: the build a node is to run."""

    fp: str = ""
    removed: bool = False

    @property
    def wanted(self) -> str:
        """The fingerprint wanted, "" when this is no want (removed, or no fingerprint)."""
        return "" if self.removed else self.fp


class ModuleEntry(Record, frozen=True):
    """`mesh-indexer.modules` `<module>`: the build a module is registered at, and its trunk manifest's id."""

    module: str = ""
    fp: str = ""
    manifest: str = ""


class Build(Record, frozen=True):
    """`mesh-builder.builds` `<module>.<fp>`: one build and the id of its manifest."""

    module: str = ""
    fp: str = ""
    manifest: str = ""


class Have(Record, frozen=True):
    """`node-engine.have` `<node>.<module>`: what a node runs."""

    fp: str = ""
    phase: str = ""
    health: str = ""
    detail: str = ""


class Resolved(Record, frozen=True):
    """`mesh-config.resolved` `<node>.<module>`: which node's provider answers a provision, by provision."""

    providers: dict[str, str] = {}


class BoundEntry(Record, frozen=True):
    """`<provider>.bound` `<provision key>`: the provider's own outcome for one consumer."""

    state: str = ""
    why: str = ""
    refused: str = ""
    waits: str = ""
    vault_name: str = ""
    generation: int = 0


# ---- manifests (section 3) ----------------------------------------------------------------------------------


class Requirement(Record, frozen=True):
    """One need of a module: a provision, told apart by `local`, with its credential form."""

    provision: str = ""
    local: str = ""
    credential: str = ""


class Offer(Record, frozen=True):
    """One provision a module provides, and who answers it (`helper`: the provider's helper, by its entries)."""

    name: str = ""
    answered_by: str = ""


class Named(Record, frozen=True):
    """A state a module declares, in its object form."""

    name: str = ""


class Manifest(Record, frozen=True, gc=True, dict=True):
    """`mesh-indexer.manifests` `<id>`: a module's manifest; offers and states come as names or objects.

    Its offers and states in one form are made once for each manifest read (`dict=True` keeps them): a composition
    asks for them for every key it judges. Tracked by the cycle collector, as a `__dict__` needs: manifests are few.
    """

    name: str = ""
    requires: tuple[Requirement, ...] = ()
    provides: tuple[str | Offer, ...] = ()
    state: tuple[str | Named, ...] = ()
    reads: tuple[str, ...] = ()

    def offers(self) -> tuple[Offer, ...]:
        """Every offer in its object form."""
        return self._offers

    def states(self) -> tuple[str, ...]:
        """The name of every state it declares."""
        return self._states

    @functools.cached_property
    def _offers(self) -> tuple[Offer, ...]:
        return tuple(Offer(name=o) if isinstance(o, str) else o for o in self.provides)

    @functools.cached_property
    def _states(self) -> tuple[str, ...]:
        return tuple(s if isinstance(s, str) else s.name for s in self.state)


# ---- what the seat writes (section 4) -----------------------------------------------------------------------


class PlanProvision(Record, frozen=True, order=True):
    """One provision of a plan: what a module needs, and who provides it."""

    provision: str
    local: str = ""
    provider: str = ""
    provider_module: str = ""
    credential: str = ""


class Plan(Record, frozen=True):
    """A module's provisioning plan, its provisions sorted by (provision, local)."""

    provisions: tuple[PlanProvision, ...]


class PlanRecord(Record, frozen=True):
    """`mesh-provisioner.plans` `<node>.<module>`."""

    node: str
    module: str
    plan: Plan


class End(Record, frozen=True):
    """One end of a provision: a module on a node."""

    module: str = ""
    node: str = ""


class Reference(Record, frozen=True):
    """Where the provider keeps the value it made: the vault's name and generation."""

    id: str = ""
    generation: int = 0


class ProvisionWarrant(Record, frozen=True):
    """The operator's answer to a retiring ask, as the provision keeps it."""

    ask: str = ""
    option: str = ""
    by: str = ""
    at: datetime | None = None


class Provision(Record, frozen=True):
    """`mesh-provisioner.provisions` `<node>.<consumer>.<provision>[.<local>]`: who provides what to whom."""

    provision: str = ""
    local: str = ""
    consumer: End = End()
    provider: End = End()
    depends_on: tuple[str, ...] = ()
    state: str = ""
    why: str = ""
    reference: Reference | None = None
    ask: str = ""
    warrant: ProvisionWarrant | None = None
    at: datetime | None = None
    v: int = 0


class Refusal(Record, frozen=True):
    """`mesh-provisioner.refused` `<node>.<module>`: a placed module whose plan is not composed, and why."""

    node: str = ""
    module: str = ""
    why: str = ""
    since: datetime | None = None


class RegistryEntry(Record, frozen=True):
    """`mesh-provisioner.registry` `<placeholder kind>`, and `default`: which domain answers that kind (4.1)."""

    kind: str = ""
    domain: str = ""


class Lease(Record, frozen=True):
    """`mesh-provisioner.seat` `holder`: the lease of the seat's holder (section 8); also each `shard.<i>` and
    `member.<holder>` of a partitioned seat (8.1), which say the shard count their process runs with."""

    holder: str = ""
    host: str = ""
    pid: int = 0
    since: datetime | None = None
    shards: int = 0


# ---- the operator's channel (section 5.4) -------------------------------------------------------------------


class Option(Record, frozen=True):
    """One answer an ask offers, bound to the act it performs."""

    id: str = ""
    label: str = ""
    does: str = ""
    level: str = ""
    binds: str = ""


class Ask(Record, frozen=True):
    """An ask to a person, published on `asks.ask.mesh-provisioner`."""

    id: str = ""
    headline: str = ""
    explanation: str = ""
    who: str = ""
    expires: datetime | None = None
    on_expiry: str = ""
    about: str = ""
    details: str = ""
    options: tuple[Option, ...] = ()


class Identity(Record, frozen=True):
    """Who answered an ask."""

    who: str = ""
    kind: str = ""
    identity: str = ""


class Warrant(Record, frozen=True):
    """The router's warrant: how an ask ended, and by whom. `sig` signs the rest when the router signs."""

    asker: str = ""
    ask: str = ""
    outcome: str = ""
    option: str = ""
    by: Identity | None = None
    at: datetime | None = None
    sig: str = ""


class AskRecord(Record, frozen=True):
    """`asks.records` `<ask id>`: the router's record of an ask."""

    state: str = ""
    ask: Ask | None = None
    warrant: Warrant | None = None


class Composed(msgspec.Struct, rename="kebab", omit_defaults=True):
    """What one node's composition did (section 5.2), with the seeds' field names."""

    node: str
    plans_written: list[str] = msgspec.field(default_factory=list)
    plans_removed: list[str] = msgspec.field(default_factory=list)
    provisions_changed: list[str] = msgspec.field(default_factory=list)
    retiring_asked: list[str] = msgspec.field(default_factory=list)
    modules_held: dict[str, str] = msgspec.field(default_factory=dict)
    problems: list[str] = msgspec.field(default_factory=list)

    def __bool__(self) -> bool:
        """True when the composition wrote, asked or has a problem: what is logged, as the seeds log it."""
        return bool(
            self.plans_written or self.plans_removed or self.provisions_changed or self.retiring_asked or self.problems
        )


# ---- encoding -----------------------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder(order="deterministic")
R = TypeVar("R")


class BadValue(ValueError):
    """A value of a state that does not decode, naming the state and key."""


def canonical_json(value: Any) -> bytes:
    """A value as JSON with sorted keys, no spaces, UTF-8: what an act's digest and a warrant's signature are taken
    over (contract 5.4)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode(record: Any) -> bytes:
    """The record as the bus keeps it: fixed field order, empties left out, byte-for-byte deterministic."""
    return _encoder.encode(record)


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def decode(kind: type[R], raw: bytes, *, state: str = "", key: str = "") -> R:
    """Decode one value of `state` at `key`, or raise BadValue saying which value is bad and why."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        value: R = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise BadValue(f"{_where(kind, state, key)} does not decode: {err}") from None
    except RecursionError:  # msgspec's answer to nesting deeper than the interpreter's recursion limit
        raise BadValue(f"{_where(kind, state, key)} does not decode: it is nested too deeply") from None
    return shared(value)  # type: ignore[no-any-return]


def _where(kind: type[Any], state: str, key: str) -> str:
    return f"{state} {key}".strip() or kind.__name__
