"""A key nats-py could not read as a subject is bad input (contract 7): named, and the seat keeps its connection.

The server takes any subject without a space or a tab, so another module may write a key with a vertical tab or a form
feed in it, or one that is not UTF-8. nats-py's parser split a message's line at any whitespace: the line of such a
key did not parse, the client reconnected or waited for ever, and the key came again after each reconnect; a subject
not UTF-8 ended nats-py's read loop. Either way the seat read nothing more. Found by the fault runner's bad input
(seed 20261204).
"""

from __future__ import annotations

import logging

import pytest
from helpers import raw_publish
from seatbus import Bus, assert_fixed_point, settle

from mesh_provisioner.bus.link import link
from mesh_provisioner.contract import PLACEMENT, WANTS, bucket
from mesh_provisioner.runtime import Runtime


def test_a_key_nats_py_could_not_parse_is_named_and_the_seat_keeps_its_connection(
    sup: Runtime, mesh: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "mesh_provisioner")
    reconnects = link(sup.nc).reconnects
    # More than 4 KB behind the line: nats-py's parser waited for ever rather than fail.
    mesh.put(PLACEMENT, "a\x0bb", {"node": "a\x0bb", "modules": [{"module": "m" * 5000}]}, validate=False)
    raw_publish(mesh.url, f"$KV.{bucket(PLACEMENT)}.c".encode() + b"\xff\xfed", b"{}")
    mesh.put(WANTS, "want.bee.mailer", {"fp": "ml9"})  # and everything else keeps working
    settle(sup)
    held = mesh.refusal("bee.mailer")
    assert held is not None and "ml9" in held.why
    assert link(sup.nc).reconnects == reconnects and sup.nc.is_connected
    assert "the placement key 'a\\x0bb' is no node" in caplog.text
    assert "c\\xff\\xfed' is not UTF-8" in caplog.text
    assert_fixed_point(mesh)
