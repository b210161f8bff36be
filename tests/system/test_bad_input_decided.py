"""Contract section 7's decided cases on a real nats-server: a placement key that is not one token is no node; a
want or a resolved value that does not decode holds its module, with the key and why in `refused`."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from helpers import wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, provisions, raw, seat_config, settle

from mesh_provisioner.contract import PLACEMENT, PLANS, REFUSED, RESOLVED, WANTS
from mesh_provisioner.messages import records as r
from mesh_provisioner.rules.view import not_a_node

BAD = "0.bad"  # sorted before ace, where the sample mesh places mesh-vault
VAULTED: dict[str, object] = {"node": BAD, "modules": [{"module": "mesh-vault"}, {"module": "postgres"}]}


def test_7_a_placement_key_that_is_not_one_token_is_no_node(
    bus: Bus, seats: Seats, caplog: pytest.LogCaptureFixture
) -> None:
    load_sample(bus.url, extra={PLACEMENT: {BAD: raw(VAULTED)}})
    bus.create_asks_stream()
    with caplog.at_level(logging.WARNING, logger="mesh_provisioner"):
        sup = seats.start(seat_config(bus.url))
        settle(sup)
        # A change of it is no change of any node: nothing is composed for it, and it is said no more.
        bus.put(PLACEMENT, BAD, {**VAULTED, "modules": [{"module": "mesh-vault"}]})
        settle(sup)
    kept = provisions(bus)
    assert kept, "the sample mesh has provisions"
    # Never chosen as a provider, of a credential either: every credential is the vault's on ace.
    assert all(p.provider.node in ("ace", "bee") and p.consumer.node in ("ace", "bee") for p in kept.values())
    credentials = [p for p in kept.values() if p.provision.endswith("-credential")]
    assert credentials and {p.provider.node for p in credentials} == {"ace"}
    # None of its modules composed: no plan, no refusal, no actor of its own.
    for state in (PLANS, REFUSED):
        assert all(key.split(".")[0] in ("ace", "bee") for key in bus.entries(state)), state
    assert not any(name.startswith(("node:0", f"node:{BAD}")) for name in sup.children())
    # Said once in the log ...
    said = [rec.getMessage() for rec in caplog.records if BAD in rec.getMessage()]
    assert said == [not_a_node(BAD)]
    # ... and in show.
    shown = subprocess.run([sys.executable, "-m", "mesh_provisioner", "--nats", bus.url, "show", "provisions"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "No node" in shown.stdout and not_a_node(BAD) in shown.stdout
    assert_fixed_point(bus)


def test_7_a_want_that_does_not_decode_holds_its_module_with_key_and_why_in_refused(sup: object, mesh: Bus) -> None:
    mesh.put(WANTS, "want.bee.webapp", b'{"fp": [1]}')
    refusal = wait_until(lambda: mesh.refusal("bee.webapp"), 10, what="bee.webapp refused")
    assert isinstance(refusal, r.Refusal)
    assert refusal.why.startswith("its want cannot be read: mesh-assigner.wants want.bee.webapp does not decode: ")
    assert mesh.plan("bee.webapp") is not None  # its last plan kept as it was
    assert_fixed_point(mesh)


def test_7_a_resolved_value_that_does_not_decode_holds_its_module_with_key_and_why_in_refused(
    sup: object, mesh: Bus
) -> None:
    # Held whether or not its composition needs mesh-config to choose a provider: postgres on ace needs none.
    for key in ("bee.webapp", "ace.postgres"):
        mesh.put(RESOLVED, key, b'{"providers": ["ace"]}')
    for key in ("bee.webapp", "ace.postgres"):
        refusal = wait_until(lambda k=key: mesh.refusal(k), 10, what=f"{key} refused")
        assert isinstance(refusal, r.Refusal)
        assert refusal.why.startswith(
            f"mesh-config.resolved {key} cannot be read, so no provider is chosen: mesh-config.resolved {key} does "
            "not decode: "
        )
    assert_fixed_point(mesh)


