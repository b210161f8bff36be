"""The process's signals (cli/process.py `Signals`), at any moment of the main thread: each run in a process of its
own, since a handler that hangs would hang the tests' process with it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from types import FrameType

import pytest

from mesh_provisioner.cli.process import Interrupted, Signals, Stop

# A signal sent to the process itself at a random moment, `count` times over, each while the main thread loops on
# `stop.wait(0)`: the handler lands inside `threading.Event.wait`'s bookkeeping, with its lock held, a good part of
# the time. Each loop ends on `stop`: the handler raises neither in a library nor in the frame that installed it.
WAIT_LOOP = """
import os, random, signal, threading
from mesh_provisioner.cli.process import Interrupted, Signals, Stop

ended = raised = 0
for _ in range({count}):
    with Signals() as signals:
        threading.Timer(random.uniform(0, 0.002), os.kill, (os.getpid(), signal.SIGTERM)).start()
        try:
            while not signals.stop.wait(0):
                pass
            ended += 1
        except Interrupted:
            raised += 1
print(ended, raised)
"""

# A signal while the main thread waits for a coroutine on the bus loop: raised there, at once.
LOOP_WAIT = """
import asyncio, os, signal, threading, time
from mesh_provisioner.bus.loop import EventLoopThread
from mesh_provisioner.cli.process import Interrupted, Signals, Stop

with EventLoopThread() as loop, Signals() as signals:
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    began = time.monotonic()
    try:
        loop.run(asyncio.sleep(60), None)
    except Interrupted as got:
        print(got, signals.stop.wait(5), round(time.monotonic() - began))
"""

# `serve` on a server out of reach, a signal 0 to 4 ms after the handlers are in, `count` times over: the first
# milliseconds are spent inside libraries (starting the loops' threads, the sockets), where the handler does not
# raise; then the main thread waits on the bus loop to connect, for as long as it takes, which `stop` does not end.
SERVE_START = """
import os, random, signal, sys, threading, time
import mesh_provisioner.cli as cli
from mesh_provisioner.cli import process

cli.configure_logging = lambda level, form: process.configure_logging("CRITICAL", form)

def signal_soon():
    while not isinstance(getattr(signal.getsignal(signal.SIGTERM), "__self__", None), process.Signals):
        time.sleep(0.0001)
    time.sleep(random.uniform(0, 0.004))
    os.kill(os.getpid(), signal.SIGTERM)

codes = []
for _ in range({count}):
    threading.Thread(target=signal_soon, daemon=True).start()
    codes.append(cli.main(["--nats", "nats://127.0.0.1:1", "serve"]))
print(sorted(set(codes)), len(codes))
"""


# A second signal while the process stops (it has seen `stop` set) exits at once.
TWICE = """
import os, signal
from mesh_provisioner.cli.process import Signals

with Signals() as signals:
    os.kill(os.getpid(), signal.SIGTERM)
    signals.stop.wait(10)
    os.kill(os.getpid(), signal.SIGTERM)
    signals.stop.wait(10)
    print("still running")
"""


def python(script: str) -> subprocess.CompletedProcess[str]:
    """A Python process running `script` (a hang fails within a minute)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=60, check=False)


def run(script: str) -> str:
    """A Python process running `script`; answers what it printed, once it exited 0 and said nothing on stderr."""
    done = python(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    return done.stdout.strip()


def test_a_signal_at_any_moment_of_a_wait_on_stop_sets_stop_and_never_hangs_the_process() -> None:
    # A handler that set `stop` itself waited for the lock the main thread held: the process hung for good (more than
    # half of these runs); one that raised there left the lock's bookkeeping broken ("release unlocked lock").
    assert run(WAIT_LOOP.format(count=300)) == "300 0"


def test_a_signal_while_the_main_thread_waits_on_the_bus_loop_interrupts_that_wait_at_once() -> None:
    # `EventLoopThread.run` waits on a bare lock: `Future.result` would wait inside `threading`, where the handler
    # does not raise.
    assert run(LOOP_WAIT) == "SIGINT True 0"


def test_a_signal_in_the_first_milliseconds_of_serve_stops_it_though_it_came_inside_a_library() -> None:
    # Sent again to the main thread until it is raised: otherwise the wait to connect, begun after it, went on for
    # good (in each of three runs of 100 signals it hung).
    assert run(SERVE_START.format(count=200)) == "[0] 200"


def test_a_second_signal_while_the_process_stops_exits_at_once() -> None:
    done = python(TWICE)
    assert done.returncode == 143 and done.stdout == "", done.stderr
    assert "SIGTERM again while stopping: exiting at once" in done.stderr


# A command that did its work (`show`, say: nothing of it looks at `stop`), signalled as `main` leaves `Signals`.
DONE_THEN_SIGNALLED = """
import os, signal, sys
import mesh_provisioner.cli as cli
from mesh_provisioner.cli.process import Signals

cli.run = lambda args, config, stop: 0
leave = Signals.__exit__

def signalled_then_left(self, *exc):
    os.kill(os.getpid(), signal.SIGTERM)
    return leave(self, *exc)

Signals.__exit__ = signalled_then_left
sys.exit(cli.main(["show", "plans"]))
"""


def test_a_signal_once_a_command_did_its_work_leaves_its_outcome_as_it_was() -> None:
    done = python(DONE_THEN_SIGNALLED)
    assert done.returncode == 0 and "did not finish" not in done.stderr, done.stderr


class Own(Signals):
    """Signals whose handlers take every frame for the package's own code."""

    def _own_code(self, frame: FrameType | None) -> bool:
        return True


def test_a_first_signal_in_the_packages_own_code_is_raised_there() -> None:
    signals = Own()
    with pytest.raises(Interrupted):
        signals._handle(signal.SIGTERM, None)
    assert (signals.signum, signals.late, signals._pending) == (signal.SIGTERM, False, False)


def test_a_signal_once_the_main_thread_saw_stop_raises_nothing_and_is_late() -> None:
    # The command was done (reconcile settled, demo showed its tables) and stops by itself: its clean-up, giving
    # the lease back among it, is not cut short, and its outcome stands.
    signals = Own()
    signals.stop.set()
    assert signals.stop.is_set() and signals.stop.seen
    signals._handle(signal.SIGTERM, None)
    assert (signals.signum, signals.late, signals._pending) == (signal.SIGTERM, True, False)


def test_a_poke_raises_the_pending_signal_only_until_the_main_thread_saw_stop() -> None:
    signals = Own()
    signals.signum, signals._pending = signal.SIGINT, True
    with pytest.raises(Interrupted):
        signals._poked(Signals.POKE, None)
    assert not signals._pending
    signals._poked(Signals.POKE, None)  # raised already: nothing more
    signals._pending = True
    signals.stop.set()
    signals.stop.wait(0)
    signals._poked(Signals.POKE, None)  # seen: the main thread stops by itself


def test_stop_is_seen_by_the_main_thread_only_once_it_set_it_or_found_it_set() -> None:
    # A command that ends sets `stop` on the main thread (Seat.serve, reconcile): a signal after that is late, and
    # the clean-up it is in finishes. Set by another thread (the relay, a command's waiter) it is not seen yet.
    stop = Stop()
    setter = threading.Thread(target=stop.set)
    setter.start()
    setter.join()
    assert not stop.seen
    assert stop.is_set() and stop.seen
    mine = Stop()
    mine.set()
    assert mine.seen
