"""The writes a rule returns: each a put or a delete of one key, against the revision the rule judged from.

Every write to the seat's states is a compare-and-set on that revision (design.md): revision 0 means the rule saw
no key, so the write creates it; a delete of revision 0 is never made.
"""

from __future__ import annotations

import msgspec


class Put(msgspec.Struct, frozen=True, tag=True):
    """Set `key` of `state` to `value`, if its revision is still `revision` (0: if it does not exist)."""

    state: str
    key: str
    value: bytes
    revision: int


class Delete(msgspec.Struct, frozen=True, tag=True):
    """Delete `key` of `state`, if its revision is still `revision`."""

    state: str
    key: str
    revision: int


Write = Put | Delete
