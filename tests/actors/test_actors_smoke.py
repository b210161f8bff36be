"""The seat on the sample mesh: it settles, and a fresh reconcile over what it wrote writes nothing."""

from __future__ import annotations

from seatbus import Bus, assert_fixed_point

from mesh_provisioner.runtime import Runtime


def test_sample_mesh_settles_at_a_fixed_point(sup: Runtime, mesh: Bus) -> None:
    assert mesh.plan("ace.gitea") is not None
    assert_fixed_point(mesh)
