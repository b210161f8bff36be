"""The seat on the sample mesh: it settles, and a fresh reconcile over what it wrote writes nothing."""

from __future__ import annotations

from seatbus import Bus, assert_fixed_point

from mesh_provisioner.supervisor import Supervisor


def test_sample_mesh_settles_at_a_fixed_point(sup: Supervisor, mesh: Bus) -> None:
    assert mesh.plan("ace.gitea") is not None
    assert_fixed_point(mesh)
