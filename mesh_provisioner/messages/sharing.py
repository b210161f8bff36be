"""One copy of each short string the decoded records hold (`sys.intern`), so the cache's memory grows with what
differs between records, not with how many there are."""

from __future__ import annotations

import sys
from typing import Any, Final

import msgspec

_SHARED_UP_TO: Final = 128  # longer strings (a why, a manifest's text) are seldom repeated
_STR, _STRUCT, _STRS, _STRUCTS = range(4)
_share_plans: dict[type[Any], tuple[tuple[str, int], ...]] = {}


def shared(value: Any) -> Any:
    """A decoded value with each of its short strings the one copy the process has (`sys.intern`), set in place.

    The cache holds a hundred thousand records whose strings are mostly the same few thousand names (nodes,
    modules, provisions, states, the keys they depend on): one copy of each is most of the 2 KiB a key
    (design.md). Interned strings are freed once nothing holds them. Which fields hold strings is read once a
    type from its declaration, so a record costs a step a string, not a look at every field."""
    kind = type(value)
    plan = _share_plans.get(kind)
    if plan is None:
        plan = _share_plans[kind] = _share_plan(kind)
    set_field = msgspec.structs.force_setattr
    intern = sys.intern
    for name, how in plan:
        field = getattr(value, name)
        if how == _STR:
            if field and len(field) <= _SHARED_UP_TO:
                set_field(value, name, intern(field))
        elif how == _STRS:
            if field:
                set_field(value, name, tuple(intern(x) for x in field))
        elif how == _STRUCT:
            if field is not None:
                shared(field)
        else:
            for x in field:
                shared(x)
    return value


def _share_plan(kind: type[Any]) -> tuple[tuple[str, int], ...]:
    """Which fields of a record type hold strings, records, or tuples of either."""
    info = msgspec.inspect.type_info(kind)
    if not isinstance(info, msgspec.inspect.StructType):
        return ()
    plan: list[tuple[str, int]] = []
    for f in info.fields:
        t = f.type
        if isinstance(t, msgspec.inspect.UnionType):  # `X | None`
            kinds = [u for u in t.types if not isinstance(u, msgspec.inspect.NoneType)]
            t = kinds[0] if len(kinds) == 1 else t
        if isinstance(t, msgspec.inspect.StrType):
            plan.append((f.name, _STR))
        elif isinstance(t, msgspec.inspect.StructType):
            plan.append((f.name, _STRUCT))
        elif isinstance(t, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
            if isinstance(t.item_type, msgspec.inspect.StrType) and isinstance(t, msgspec.inspect.VarTupleType):
                plan.append((f.name, _STRS))
            elif isinstance(t.item_type, msgspec.inspect.StructType):
                plan.append((f.name, _STRUCTS))
    return tuple(plan)
