"""The runner's command line, its JSON and the markdown written from it, and the checks it ends every scenario with
(each must find what it looks for: a check that cannot fail proves nothing)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_until
from running import ROOT, run_faults

from faults.mesh import Router
from faults.report import GOAL_COMMAND, LONG_COMMAND, render
from faults.twin import Twin
from mesh_provisioner.actors import node as node_actor
from mesh_provisioner.contract import ASK_RECORDS, PLACEMENT
from meshcheck import check
from meshcheck.bus import Bus


def test_the_runner_writes_json_and_the_markdown_from_it(tmp_path: Path) -> None:
    figures, markdown = tmp_path / "figures.json", tmp_path / "RELIABILITY.md"
    done = run_faults("--scenario", "storm", "--seed", "7", "--runs", "2", "--count", "300",
                      "--json", str(figures), "--markdown", str(markdown))
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(figures.read_text())
    runs = data["scenarios"]["storm"]["runs"]
    assert [run["seed"] for run in runs] == [7, 8]
    assert all(run["changes"] == 300 and run["lost"] == [] and run["errors"] == [] for run in runs)
    assert markdown.read_text() == render(data)
    assert "| storm | 1 storm of a provider's bound entries" in markdown.read_text()


def test_an_unknown_scenario_is_refused() -> None:
    done = run_faults("--scenario", "nope", timeout=60)
    assert done.returncode == 2 and "no scenario is named nope" in done.stderr


def test_the_reliability_figures_are_the_runners_markdown_of_its_json() -> None:
    data = json.loads((ROOT / "docs" / "reliability.json").read_text())
    assert (ROOT / "docs" / "RELIABILITY.md").read_text() == render(data)
    command = GOAL_COMMAND if data.get("scale") == "goal" else LONG_COMMAND
    assert command in (ROOT / "docs" / "RELIABILITY.md").read_text()
    assert set(data["scenarios"]) == {"kills", "restarts", "pause", "sigkill", "shards", "cluster", "storm",
                                      "bad-input", "warrants"}


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Twin]:
    with Twin(tmp_path) as t:
        yield t


def test_the_checks_find_a_difference_an_unfixed_point_and_an_escaped_error(
    twin: Twin, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = twin.start_disturbed()
    assert check.same(twin.disturbed, twin.reference)[1] == []
    assert check.fixed_point(twin.disturbed, twin.disturbed_config()) == []
    # A change on one bus only: the plans differ.
    twin.disturbed.put(PLACEMENT, "cat", {"node": "cat", "modules": [{"module": "keycloak"}]})
    assert sup.wait_settled(30)
    assert any(p.startswith("plan cat.keycloak differs") for p in check.same(twin.disturbed, twin.reference)[1])
    # A seat that missed a change (its actors stopped before it came) leaves the bus off its fixed point.
    sup.stop()
    twin.sup = None
    twin.disturbed.put(PLACEMENT, "cat", {"node": "cat", "modules": []})
    assert any("not at a fixed point" in p for p in check.fixed_point(twin.disturbed, twin.disturbed_config()))
    # A kill is deliberate; an exception out of a composition is not.
    with check.watching_errors() as errors:
        sup = twin.start_disturbed()
        sup.kill("node:ace")
        assert sup.wait_settled(30)
        assert errors.kills >= 1 and errors.problems() == []
        failed = threading.Event()

        def broken(*_: object) -> None:
            failed.set()
            raise RuntimeError("a bug in a composition")

        monkeypatch.setattr(node_actor, "compose_node", broken)
        twin.disturbed.put(PLACEMENT, "bee", {"node": "bee", "modules": [{"module": "mailer"}]})
        assert failed.wait(30)
        monkeypatch.undo()
        assert sup.wait_settled(30)
    assert any("a bug in a composition" in p for p in errors.problems())


def test_asked_once_finds_an_ask_under_another_id(twin: Twin) -> None:
    bus: Bus = twin.reference  # its seat has published the sample's retiring key's ask
    asks = bus.asks_published()
    assert asks and check.asked_once(bus)[1] == []
    msg_id, ask = asks[0]
    bus.publish("asks.ask.mesh-provisioner", json.dumps({"id": ask.id, "about": ask.about}).encode(),
                headers={"Nats-Msg-Id": msg_id + "-again"})
    assert any("went out under the message id" in p for p in check.asked_once(bus)[1])


def test_the_streams_router_decides_each_ask_once_reading_only_what_came_since(twin: Twin) -> None:
    bus: Bus = twin.reference  # its seat has published the sample's retiring key's ask
    router = Router(bus)
    router.decide()
    asks = bus.asks_published()
    assert asks and all(bus.get(ASK_RECORDS, msg_id) is not None for msg_id, _ in asks)
    read = router.read
    assert read > 0 and bus.asks_since(read) == []
    msg_id, ask = asks[0]
    bus.publish("asks.ask.mesh-provisioner", json.dumps({"id": ask.id, "about": ask.about}).encode(),
                headers={"Nats-Msg-Id": msg_id + "-again"})
    # A core publish is flushed to the server, which stores it in the stream after: the router reads the stream.
    wait_until(lambda: bus.asks_since(read), 10, what="the ask published again, in the router's stream")
    router.decide()
    assert router.read > read and bus.get(ASK_RECORDS, msg_id + "-again") is not None
