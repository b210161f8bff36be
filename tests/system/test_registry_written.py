"""Contract 4.1 on a real nats-server: the operator's registry written when the seat is taken, kept so against other
writers, and the retired needs emptied."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers import wait_until
from seatbus import Bus, Seats, assert_fixed_point, load_sample, seat_config, settle

from mesh_provisioner.contract import NEEDS, REGISTRY, bucket

REGISTRY_FILE = """default = "example.org"
forge = "git.example.org"
mail = 25
sso = "sso.example.org"
"""


def entry(kind: str, domain: str) -> bytes:
    return json.dumps({"kind": kind, "domain": domain}, separators=(",", ":")).encode()


WRITTEN = {"default": entry("default", "example.org"), "forge": entry("forge", "git.example.org"),
           "sso": entry("sso", "sso.example.org")}


def test_4_1_the_registry_is_written_when_the_seat_is_taken_and_written_back_when_another_deletes_it(
    bus: Bus, seats: Seats, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "registry.toml"
    path.write_text(REGISTRY_FILE)
    load_sample(bus.url, extra={
        NEEDS: {"ace.gitea": b'{"old": true}', "bee.webapp": b"{}"},
        REGISTRY: {"forge": entry("forge", "old.example.org"), "mail": entry("mail", "mail.example.org"),
                   "stale": entry("stale", "stale.example.org")},
    })
    config = seat_config(bus.url, registry=str(path))
    with caplog.at_level(logging.INFO, logger="mesh_provisioner"):
        sup = seats.start(config)
        settle(sup)
    said = [rec.getMessage() for rec in caplog.records]
    # Written as the file says; `stale` is no longer in it; `mail`, named on a bad line, is left as it is.
    assert bus.entries(REGISTRY) == {**WRITTEN, "mail": entry("mail", "mail.example.org")}
    assert f"the registry file {path}: line 3: the domain of mail is not a string" in said
    assert "the registry: wrote 3 key(s), deleted 1" in said
    # The retired needs are emptied when the seat is taken, and the count said.
    assert bus.entries(NEEDS) == {}
    assert "deleted 2 key(s) of the retired needs" in said

    # Another writer deletes a key, purges one, changes one, adds one: each is written back as the file says.
    bus.delete(REGISTRY, "forge")

    async def purge() -> None:
        kv = await bus.js.key_value(bucket(REGISTRY))
        await kv.purge("default")

    bus.run(purge)
    bus.put(REGISTRY, "sso", {"kind": "sso", "domain": "evil.example.org"})
    bus.put(REGISTRY, "extra", {"kind": "extra", "domain": "extra.example.org"})
    wait_until(lambda: bus.entries(REGISTRY) == {**WRITTEN, "mail": entry("mail", "mail.example.org")}, 10,
               interval=0.05, what="the registry written back")
    settle(sup)
    assert_fixed_point(bus, config)


def test_4_1_no_registry_file_leaves_the_state_as_it_is(bus: Bus, seats: Seats) -> None:
    load_sample(bus.url, extra={REGISTRY: {"forge": entry("forge", "git.example.org")}})
    sup = seats.start(seat_config(bus.url))
    settle(sup)
    bus.delete(REGISTRY, "forge")
    settle(sup)
    assert bus.entries(REGISTRY) == {}


def test_4_1_a_registry_file_that_cannot_be_read_is_said_and_leaves_the_state_as_it_is(
    bus: Bus, seats: Seats, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "registry.json"
    path.write_text('{\n  "default": "example.org",\n  "forge": \n}\n')
    load_sample(bus.url, extra={REGISTRY: {"forge": entry("forge", "git.example.org")}})
    with caplog.at_level(logging.WARNING, logger="mesh_provisioner"):
        sup = seats.start(seat_config(bus.url, registry=str(path)))
        settle(sup)
    said = [rec.getMessage() for rec in caplog.records]
    assert f"the registry file {path}: line 4: Expecting value (at column 1); nothing of it is written" in said
    assert bus.entries(REGISTRY) == {"forge": entry("forge", "git.example.org")}
    missing = seats.start(seat_config(bus.url, registry=str(tmp_path / "nowhere.toml")))
    settle(missing)
    assert bus.entries(REGISTRY) == {"forge": entry("forge", "git.example.org")}
