"""The operator's first hour: `mesh-provisioner` run as a process, against real nats-servers on loopback.

Each test is one thing an operator meets: options where they put them, a wrong value refused in one line, a server
out of reach or without JetStream named with the fix, a signal that stops the process at any moment, a demo that is
a real seat, read commands that only print what they read.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from helpers import NatsServer, free_port, wait_until

from mesh_provisioner.bus.embedded import EmbeddedServer
from mesh_provisioner.bus.loader import load_states
from mesh_provisioner.contract import HOLDER_KEY, SEAT, bucket
from mesh_provisioner.messages import records as r
from mesh_provisioner.samples import sample_mesh

ROOT = Path(__file__).parents[2]
COMMANDS = ("reconcile", "serve", "demo", "show", "load")


def environment(**extra: str) -> dict[str, str]:
    """The process's environment, none of the seat's settings leaking in from the test's, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESH_PROVISIONER_", "NATS_"))}
    return {**env, **extra}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mesh_provisioner", *args]


def cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """The command line as an operator runs it, bounded in time (a hang fails the test, it does not stall it)."""
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=timeout, env=environment(**env),
                          check=False)


def start(*args: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """A long-running command, its stdout and stderr in `log` (read while it runs)."""
    with log.open("wb") as out:
        return subprocess.Popen(command(*args), stdout=out, stderr=subprocess.STDOUT, env=environment(**env))


def stop(p: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Signal a process and answer its exit code; killed past 30 s."""
    if p.poll() is None:
        p.send_signal(sig)
    try:
        return p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def get(url: str) -> tuple[int, str]:
    """An HTTP GET's status and body; 0 while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def nothing_listens() -> str:
    return f"nats://127.0.0.1:{free_port()}"


def holder(url: str) -> r.Lease | None:
    """The seat's lease on the bus now."""

    async def read() -> r.Lease | None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket(SEAT))
            entry = await kv.get(HOLDER_KEY)
            return r.decode(r.Lease, entry.value or b"") if entry.value else None
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        finally:
            await nc.close()

    return asyncio.run(read())


def request(url: str, subject: str, payload: bytes = b"") -> tuple[dict[str, str], Any]:
    """A request's reply: its headers and its JSON."""

    async def ask() -> tuple[dict[str, str], Any]:
        nc = await nats.connect(url)
        try:
            msg = await nc.request(subject, payload, timeout=5)
            return dict(msg.headers or {}), json.loads(msg.data)
        finally:
            await nc.close()

    return asyncio.run(ask())


def lease_bucket_age(url: str) -> float:
    async def read() -> float:
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().stream_info(f"KV_{bucket(SEAT)}")).config.max_age or 0.0
        finally:
            await nc.close()

    return asyncio.run(read())


@pytest.fixture
def loaded(nats_server: NatsServer) -> str:
    """A server holding the sample mesh, as the other modules wrote it; answers its URL."""
    asyncio.run(load_states(nats_server.url, sample_mesh()))
    return nats_server.url


@pytest.fixture(scope="module")
def reconciled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with the sample mesh reconciled once by the seat; answers its URL."""
    server = NatsServer(tmp_path_factory.mktemp("operator"))
    server.start()
    try:
        asyncio.run(load_states(server.url, sample_mesh()))
        done = cli("--nats", server.url, "reconcile", "--timeout", "60", timeout=120)
        assert done.returncode == 0, done.stderr
        yield server.url
    finally:
        server.stop()


# ---- 1. options before or after the command, --version, each command's help ------------------------------------


@pytest.mark.parametrize("args", [
    ("show", "plans", "--json", "--nats", "{url}"),
    ("show", "--nats", "{url}", "provisions", "--state", "retiring", "--log-format", "json"),
    ("reconcile", "--dry-run", "--nats", "{url}"),
    ("--log-level", "ERROR", "reconcile", "--nats", "{url}", "--lease-seconds", "15"),
])
def test_1_options_are_taken_before_or_after_the_command(reconciled: str, args: tuple[str, ...]) -> None:
    done = cli(*(a.format(url=reconciled) for a in args))
    assert done.returncode == 0, done.stderr
    assert done.stdout


def test_1_an_option_given_before_and_after_the_command_is_taken_from_after(reconciled: str) -> None:
    done = cli("--nats", nothing_listens(), "show", "plans", "--json", "--nats", reconciled)
    assert done.returncode == 0, done.stderr
    assert "ace.gitea" in done.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_1_each_commands_help_lists_its_options_and_the_settings(name: str) -> None:
    done = cli(name, "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--nats", "--creds", "--max-parallel", "--lease-seconds", "--metrics-addr", "--log-level",
                   "NATS_URL", "MESH_PROVISIONER_LEASE_SECONDS"):
        assert option in done.stdout, (name, option)
    own = {"reconcile": ("--timeout", "--wait", "--dry-run", "--json"), "serve": (), "demo": ("--serve",),
           "show": ("--node", "--module", "--state", "--json", "--timeout"), "load": ("--router", "FILE")}
    for option in own[name]:
        assert option in done.stdout, (name, option)


def test_1_version() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout == f"mesh-provisioner {importlib.metadata.version('mesh-provisioner')}\n"


# ---- 2. every value checked up front: one line, exit 2 ----------------------------------------------------------


@pytest.mark.parametrize(("args", "env", "said"), [
    (("--lease-seconds", "-5", "serve"), {}, "--lease-seconds -5: the lease time must be at least 2 seconds"),
    (("--lease-seconds", "0", "serve"), {}, "--lease-seconds 0: the lease time must be at least 2 seconds"),
    (("serve",), {"MESH_PROVISIONER_LEASE_SECONDS": "1"},
     "MESH_PROVISIONER_LEASE_SECONDS=1: the lease time must be at least 2 seconds"),
    (("--max-parallel", "-3", "serve"), {}, "--max-parallel -3: must be 0 (no bound) or more"),
    (("--log-level", "LOUD", "serve"), {}, "argument --log-level: invalid choice: 'LOUD'"),
    (("serve",), {"MESH_PROVISIONER_LOG_LEVEL": "loud"},
     "MESH_PROVISIONER_LOG_LEVEL=LOUD: the log level is one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    (("serve",), {"MESH_PROVISIONER_MAX_PARALLEL": "four"},
     "MESH_PROVISIONER_MAX_PARALLEL=four: 'four' is not a whole number"),
    (("reconcile", "--max-parallel", "four"), {}, "argument --max-parallel: 'four' is not a whole number"),
    (("--replicas", "0", "serve"), {}, "--replicas 0: JetStream keeps a bucket on 1 to 5 servers"),
    (("--shards", "0", "serve"), {}, "--shards 0: a mesh has 1 to 1024 shards"),
    (("serve",), {"MESH_PROVISIONER_SHARDS": "2000"}, "MESH_PROVISIONER_SHARDS=2000: a mesh has 1 to 1024 shards"),
    (("--metrics-addr", "9464", "serve"), {}, "--metrics-addr 9464: not host:port"),
    (("serve",), {"MESH_PROVISIONER_LOG_FORMAT": "xml"}, "MESH_PROVISIONER_LOG_FORMAT=xml: the log format is"),
    (("reconcile", "--timeout", "0"), {}, "argument --timeout: '0': the time must be more than 0 seconds"),
    (("reconcile", "--json"), {}, "reconcile --json goes with --dry-run"),
    (("demo",), {}, "--nats: the demo runs on a nats-server of its own"),
    (("--bound-reads", "postgres,a.b", "serve"), {}, "'a.b': a provider is one token"),
])
def test_2_a_wrong_value_is_refused_in_one_line_before_connecting(
    args: tuple[str, ...], env: dict[str, str], said: str
) -> None:
    began = time.monotonic()
    # Nothing listens there: a value taken would have the process wait for a server, not exit 2 at once.
    done = cli("--nats", nothing_listens(), *args, timeout=20, **env)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == ""
    assert time.monotonic() - began < 15


def test_2_help_is_given_whatever_the_environment_says() -> None:
    for args in (("--help",), ("serve", "--help")):
        done = cli(*args, MESH_PROVISIONER_MAX_PARALLEL="four", MESH_PROVISIONER_LEASE_SECONDS="-5")
        assert done.returncode == 0, done.stderr
        assert "usage: mesh-provisioner" in done.stdout
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("made_with", "lease", "said"), [
    (15.0, 60.0, "ages keys out after 15 s, not after the lease time 60 s"),
    (None, 5.0, "never ages keys out, not after the lease time 5 s"),
])
def test_2_a_lease_bucket_of_another_max_age_is_said_and_set_to_the_lease_time(
    nats_server: NatsServer, made_with: float | None, lease: float, said: str
) -> None:
    async def make() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            await nc.jetstream().create_key_value(bucket=bucket(SEAT), history=1, ttl=made_with)
        finally:
            await nc.close()

    asyncio.run(make())
    done = cli("--nats", nats_server.url, "--lease-seconds", f"{lease:g}", "reconcile", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if said in line]
    assert warned and " WARNING " in warned[0], done.stderr
    assert lease_bucket_age(nats_server.url) == lease


# ---- 3. a server out of reach, without JetStream, a held seat, signals ------------------------------------------


def test_3_serve_while_the_server_is_out_of_reach_is_alive_says_why_and_stops_at_sigterm(tmp_path: Path) -> None:
    url, port = nothing_listens(), free_port()
    log = tmp_path / "serve.log"
    p = start("serve", "--nats", url, "--metrics-addr", f"127.0.0.1:{port}", log=log)
    try:
        # /healthz from the start: alive while it connects; /readyz says what it waits for.
        wait_until(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 15, 0.05, "healthz while connecting")
        status, why = wait_until(lambda: (got := get(f"http://127.0.0.1:{port}/readyz"))[0] and got, 15, 0.05)
        assert status == 503
        assert why.startswith(f"connecting to {url}")
        wait_until(lambda: "nothing listens" in log.read_text(), 15, 0.05, "the failure logged")
        began = time.monotonic()
        assert stop(p) == 0, log.read_text()
        assert time.monotonic() - began < 5
    finally:
        stop(p, signal.SIGKILL)
    text = log.read_text()
    assert "Traceback" not in text
    said = [line for line in text.splitlines() if url in line]
    assert said and all(" WARNING " in line for line in said), text
    assert "is nats-server running there" in said[0]


@pytest.mark.parametrize("args", [("reconcile", "--timeout", "3"), ("reconcile", "--dry-run", "--timeout", "3"),
                                  ("show", "plans", "--timeout", "3"), ("load", "--timeout", "3")])
def test_3_a_server_out_of_reach_is_named_with_the_fix_within_the_timeout(args: tuple[str, ...]) -> None:
    url = nothing_listens()
    began = time.monotonic()
    done = cli("--nats", url, *args, timeout=30)
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr
    assert took < 3 + 6, took
    last = done.stderr.splitlines()[-1]
    assert " ERROR " in last and f"nothing listens at {url}" in last and "tried for 3 s" in last, done.stderr
    assert " INFO " not in done.stderr.replace("connected to NATS", "")  # failures are warnings or errors
    assert done.stdout == ""


def test_3_an_http_url_is_said_to_have_the_wrong_scheme() -> None:
    done = cli("--nats", "http://127.0.0.1:4222", "reconcile", timeout=20)
    assert done.returncode == 2
    assert done.stderr == ("mesh-provisioner: error: --nats http://127.0.0.1:4222: not a NATS URL: http:// is the "
                           "wrong scheme, the seat speaks NATS (nats://, tls://, ws://, wss://), as in "
                           "nats://127.0.0.1:4222\n")


@pytest.mark.parametrize("args", [("reconcile", "--timeout", "30"), ("reconcile", "--dry-run"), ("show", "plans"),
                                  ("load",)])
def test_3_a_server_without_jetstream_is_said_to_need_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    with EmbeddedServer(tmp_path, jetstream=False) as server:
        began = time.monotonic()
        done = cli("--nats", server.url, *args, timeout=60)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - began < 15
    last = done.stderr.splitlines()[-1]
    assert " ERROR " in last and f"JetStream is not enabled on {server.url}: start nats-server with -js" in last


def test_3_reconcile_says_at_once_that_another_process_holds_the_seat(loaded: str, tmp_path: Path) -> None:
    a = start("--nats", loaded, "--lease-seconds", "5", "serve", log=tmp_path / "a.log")
    try:
        wait_until(lambda: getattr(holder(loaded), "pid", 0) == a.pid, 30, 0.05, "a holds the seat")
        began = time.monotonic()
        done = cli("--nats", loaded, "--lease-seconds", "5", "reconcile", "--timeout", "60", timeout=60)
        assert done.returncode == 2, done.stderr
        assert time.monotonic() - began < 10
        last = done.stderr.splitlines()[-3:]  # the error, then the two connections closed (the seat's, the lease's)
        assert any(f"another process holds the seat (pid {a.pid} on " in line and "--wait waits for it" in line
                   for line in last), done.stderr
        # --wait waits, and still says who holds it when the time is up.
        began = time.monotonic()
        done = cli("--nats", loaded, "--lease-seconds", "5", "reconcile", "--wait", "--timeout", "2")
        assert done.returncode == 2
        assert time.monotonic() - began >= 2
        assert f"another process holds the seat (pid {a.pid} on " in done.stderr
    finally:
        assert stop(a) == 0


def test_3_reconcile_waiting_for_the_seat_stops_at_a_signal_and_says_only_that(loaded: str, tmp_path: Path) -> None:
    a = start("--nats", loaded, "--lease-seconds", "5", "serve", log=tmp_path / "a.log")
    log = tmp_path / "reconcile.log"
    b = None
    try:
        wait_until(lambda: getattr(holder(loaded), "pid", 0) == a.pid, 30, 0.05, "a holds the seat")
        b = start("--nats", loaded, "--lease-seconds", "5", "reconcile", "--wait", "--timeout", "60", log=log)
        wait_until(lambda: "waits for it as a standby" in log.read_text(), 30, 0.05, "reconcile waiting")
        began = time.monotonic()
        assert stop(b) == 143, log.read_text()
        assert time.monotonic() - began < 5
    finally:
        if b is not None:
            stop(b, signal.SIGKILL)
        assert stop(a) == 0
    text = log.read_text()
    # The wait ended on `stop`: not a holder that stayed, nor anything reconciled.
    assert "Traceback" not in text and "nothing is reconciled" not in text, text
    assert "interrupted by SIGTERM: reconcile did not finish" in text.splitlines()[-1], text


@pytest.mark.parametrize(("args", "code"), [(("reconcile", "--timeout", "60"), 130), (("serve",), 0),
                                            (("reconcile", "--dry-run", "--timeout", "60"), 130)])
def test_3_ctrl_c_while_connecting_stops_at_once_without_a_traceback(
    tmp_path: Path, args: tuple[str, ...], code: int
) -> None:
    log = tmp_path / "cli.log"
    p = start("--nats", nothing_listens(), *args, log=log)
    try:
        wait_until(lambda: "nothing listens" in log.read_text(), 15, 0.05, "connecting")
        began = time.monotonic()
        assert stop(p, signal.SIGINT) == code, log.read_text()
        assert time.monotonic() - began < 5
    finally:
        stop(p, signal.SIGKILL)
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "SIGINT" in text.splitlines()[-1]


# ---- 4. demo is a real seat; load puts the sample into one's own server -----------------------------------------


def test_4_demo_serve_holds_the_lease_answers_the_verb_and_a_second_seat_is_its_standby(tmp_path: Path) -> None:
    port = free_port()
    demo_log, serve_log = tmp_path / "demo.log", tmp_path / "serve.log"
    demo = start("demo", "--serve", "--metrics-addr", f"127.0.0.1:{port}", log=demo_log)
    other = None
    try:
        said = wait_until(lambda: re.search(r"holds its lease on (nats://\S+) and answers", demo_log.read_text()),
                          60, 0.05, "the demo's tables")
        url = said.group(1)
        assert "bee.oldapp.postgres-database" in demo_log.read_text()
        assert getattr(holder(url), "pid", 0) == demo.pid
        assert get(f"http://127.0.0.1:{port}/readyz") == (200, "ok\n")
        _, info = request(url, "$SRV.PING.mesh-provisioner")
        assert info["name"] == "mesh-provisioner"
        _, reply = request(url, "mesh-provisioner.provisioning", b'{"what": "plans", "node": "ace"}')
        assert [e["key"] for e in reply["entries"]] == ["ace.gitea", "ace.keycloak", "ace.mesh-vault", "ace.postgres"]
        # A serve on the demo's server waits as its standby: one writer at a time.
        other_port = free_port()
        other = start("serve", "--nats", url, "--metrics-addr", f"127.0.0.1:{other_port}", log=serve_log)
        wait_until(lambda: "standby" in get(f"http://127.0.0.1:{other_port}/readyz")[1], 30, 0.05, "a standby")
        assert getattr(holder(url), "pid", 0) == demo.pid
        # The demo stopped gives the lease back: the standby takes the seat.
        assert stop(demo, signal.SIGINT) == 0, demo_log.read_text()
    finally:
        stop(demo, signal.SIGKILL)
        if other is not None:
            stop(other, signal.SIGKILL)
    assert "Traceback" not in demo_log.read_text()


def test_4_load_puts_the_sample_mesh_into_ones_own_server(nats_server: NatsServer) -> None:
    done = cli("--nats", nats_server.url, "load", "--router")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"loaded 41 key(s) of the sample mesh into 15 state(s) on {nats_server.url}; "
                                  "created the router's stream asks\n")
    assert done.stderr == ""
    done = cli("--nats", nats_server.url, "reconcile", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert "published ask retire-bee-oldapp-postgres-database" in done.stderr  # the router's stream took it
    shown = cli("--nats", nats_server.url, "show", "provisions", "--state", "retiring")
    assert [line.split()[:2] for line in shown.stdout.splitlines()[1:]] == [["bee.oldapp.postgres-database",
                                                                             "retiring"]]


def test_4_load_refuses_a_file_that_is_not_a_mesh(tmp_path: Path) -> None:
    bad = tmp_path / "mesh.json"
    bad.write_text('{"nodes": []}')
    done = cli("--nats", nothing_listens(), "load", str(bad), timeout=20)
    assert done.returncode == 2
    assert f"{bad}: not a mesh" in done.stderr and len(done.stderr.splitlines()) == 1


# ---- 5. quiet reads, no conflict in a clean demo, the dry run's summary, 404, $SRV.STATS, README, JSON times ----


def test_5_show_prints_what_it_reads_and_logs_nothing(reconciled: str) -> None:
    done = cli("--nats", reconciled, "show", "plans")
    assert done.returncode == 0
    assert done.stdout.startswith("plan ")
    assert done.stderr == ""


def test_5_a_clean_demo_logs_no_conflict_and_no_warning() -> None:
    done = cli("demo", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "conflict" not in done.stderr
    assert not [line for line in done.stderr.splitlines() if " WARNING " in line or " ERROR " in line], done.stderr


def test_5_the_dry_run_counts_what_it_would_write_by_state(loaded: str) -> None:
    done = cli("--nats", loaded, "reconcile", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["state", "puts", "deletes"]
    rows = {line.split()[0]: (int(line.split()[1]), int(line.split()[2])) for line in lines[1:4]}
    assert set(rows) == {"mesh-provisioner.plans", "mesh-provisioner.provisions", "mesh-provisioner.refused"}
    total = int(lines[-1].split()[0])
    assert lines[-1] == f"{total} write(s) would be made"
    assert sum(put + delete for put, delete in rows.values()) == total
    assert any(line.startswith("provisions written, by their state: ") and "retiring" in line for line in lines)
    assert len(lines) < 12  # a summary, not a line a write
    as_json = cli("--nats", loaded, "reconcile", "--dry-run", "--json")
    assert as_json.returncode == 0
    got = json.loads(as_json.stdout)
    assert len(got["writes"]) == total and got["settled"] is True
    assert {state: (c["put"], c["delete"]) for state, c in got["counts"].items()} == rows


def test_5_metrics_404_on_other_paths_and_srv_stats_count_the_verbs_errors(loaded: str, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    p = start("serve", "--nats", loaded, "--metrics-addr", f"127.0.0.1:{port}", log=log)
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, 0.05, "ready")
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        for path in ("/", "/metricz", "/healthz/x"):
            status, body = get(f"http://127.0.0.1:{port}{path}")
            assert status == 404, path
            assert "/metrics, /healthz, /readyz" in body
        for bad in (b"not json", b'{"what": "nope"}'):
            headers, reply = request(loaded, "mesh-provisioner.provisioning", bad)
            assert headers.get("Nats-Service-Error-Code") == "400" and "error" in reply
        _, stats = request(loaded, "$SRV.STATS.mesh-provisioner")
        endpoint = stats["endpoints"][0]
        assert (endpoint["num_requests"], endpoint["num_errors"]) == (2, 2)
        assert endpoint["last_error"].startswith("400 ")
    finally:
        assert stop(p) == 0, log.read_text()


def test_5_a_standby_takes_over_a_clean_exit_within_a_fifth_of_the_lease_as_the_readme_says(
    loaded: str, tmp_path: Path
) -> None:
    lease = 5.0
    readme = (ROOT / "README.md").read_text()
    assert "a standby takes the seat at its next try, within a fifth of the lease time" in readme
    a = start("--nats", loaded, "--lease-seconds", f"{lease:g}", "serve", log=tmp_path / "a.log")
    b = None
    try:
        wait_until(lambda: getattr(holder(loaded), "pid", 0) == a.pid, 30, 0.05, "a holds")
        b = start("--nats", loaded, "--lease-seconds", f"{lease:g}", "serve", log=tmp_path / "b.log")
        wait_until(lambda: "standby" in (tmp_path / "b.log").read_text(), 30, 0.05, "b waits")
        assert stop(a) == 0
        stopped = time.monotonic()
        wait_until(lambda: getattr(holder(loaded), "pid", 0) == b.pid, lease, 0.05, "b takes over")  # type: ignore[union-attr]
        assert time.monotonic() - stopped < lease / 5 + 2
    finally:
        stop(a, signal.SIGKILL)
        if b is not None:
            assert stop(b) == 0


def test_5_the_readme_says_when_the_dry_run_exits_2() -> None:
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `reconcile --dry-run"))
    assert "2 when" in row.split("|")[-2]
    assert "always" not in row


def test_5_json_log_times_have_milliseconds_in_utc(reconciled: str) -> None:
    done = cli("--nats", reconciled, "--log-format", "json", "--log-level", "INFO", "show", "plans")
    assert done.returncode == 0
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert records
    for record in records:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), record
