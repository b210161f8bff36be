"""The differential tests' comparison of a bus with `settle()` of its final inputs: meshcheck/settled.py, with the
random meshes' providers (tests/support/meshgen.py `BOUND_READS`) as the default set of bound reads."""

from __future__ import annotations

from datetime import datetime

from mesh_provisioner.rules.memory_view import MemoryView
from meshcheck import settled
from meshcheck.settled import compare, inputs_of, off_fixed_point
from tests.support.meshgen import BOUND_READS, Inputs

__all__ = ["compare", "expected", "inputs_of", "off_fixed_point"]


def expected(inputs: Inputs, now: datetime | None = None, bound_reads: tuple[str, ...] = BOUND_READS) -> MemoryView:
    """`settle()` of a view holding only these inputs (meshcheck.settled.expected), the meshes' bound reads unless
    said."""
    return settled.expected(inputs, bound_reads, now)
