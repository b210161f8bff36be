"""The fault runner's command line: run scenarios or the soak, keep their figures as JSON, and write the markdown
from the JSON.

    python -m faults --scenario NAME|all [--scale small|goal] --seed S [--count N] [--seconds T] [--runs R]
        [--nodes N] [--pace P] [--json FILE] [--markdown FILE]
    python -m faults --soak MINUTES [--soak-rate R] [--soak-nodes N] [--soak-interval S] [--json FILE] [--markdown FILE]

Each scenario runs `--runs` times, run i with seed S+i, each in a fresh temporary directory with servers of its own
on 127.0.0.1. `--scale` sets every default (faults/scale.py): `small` is three nodes, three runs and each scenario's
own counts; `goal` is the reliability goal in one run of each scenario, on 200 nodes. A flag given overrides the
scale's value; at a scale that asks a scenario for a count of faults, a run that made fewer (its stream ran out of
time) says so among what it lost. The soak (`faults.soak`) runs one seat process under a steady load for MINUTES and
judges whether its memory, file descriptors, threads, tasks and latency stay flat; with `--soak` alone no scenario
runs.

The scenarios and the soak are separate commands: each replaces only its own figures in an existing `--json` file
(the soak its `soak` section, the scenarios the rest), and the markdown is written from the whole file. Every loop
of a run is bounded in count and in time, and the runner stops by itself; it exits 0 when no run lost anything and
the soak (if run) was flat with its load sustained, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import stop_cleanly_on_sigterm
from faults import soak
from faults.report import render
from faults.scale import SATURATION_SOURCE, SCALES, Scale
from faults.scenarios import SCENARIOS
from faults.twin import Params, Run
from mesh_provisioner.bus.embedded import server_binary

log = logging.getLogger("faults")

# The longest soak the runner takes: a day.
MOST_SOAK_MINUTES = 24 * 60


def parser() -> argparse.ArgumentParser:
    """The runner's options."""
    p = argparse.ArgumentParser(prog="python -m faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default=None,
                   help=f"one of {', '.join(SCENARIOS)}, or all (comma-separated list); default: all, or none "
                        "with --soak")
    p.add_argument("--scale", default="small", choices=list(SCALES),
                   help="the defaults of every option below (faults/scale.py): small, or the reliability goal")
    p.add_argument("--seed", type=int, default=20261203, help="the first run's seed; run i has seed+i")
    p.add_argument("--count", type=int, default=None,
                   help="changes per run (bad input: bad values through the live seat; storm: its entries; "
                        "warrants: forged and replayed answers); default: the scale's, else each scenario's own")
    p.add_argument("--seconds", type=float, default=None,
                   help="the bound of each run's stream of changes and faults (small: 60)")
    p.add_argument("--runs", type=int, default=None,
                   help="runs of each scenario (median and worst are over them; small: 3, goal: 1)")
    p.add_argument("--faults", type=int, default=None,
                   help="faults per run where a scenario counts them (restarts, pauses, kills of the process)")
    p.add_argument("--rate", type=float, default=None, help="actor kills per second (kills; small: 40)")
    p.add_argument("--inputs", type=int, default=None,
                   help="bad values through the pure rules (bad-input), shared among its runs (small: 100,000)")
    p.add_argument("--nodes", type=int, default=None, help="nodes of the mesh (small: 3, goal: 200)")
    p.add_argument("--pace", type=float, default=None,
                   help="changes a second of each stream, 0 for as fast as written (small: 0, goal: 100)")
    p.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                   help="run the soak for this many minutes (faults.soak)")
    p.add_argument("--soak-rate", type=float, default=soak.RATE,
                   help=f"the soak's changes a second (default {soak.RATE:g}: half the saturation measured in "
                        "docs/BENCHMARKS.md); 0 measures the saturation first and takes half of it")
    p.add_argument("--soak-nodes", type=int, default=soak.NODES, help="the nodes of the soak's mesh")
    p.add_argument("--soak-interval", type=float, default=soak.INTERVAL, help="seconds between the soak's samples")
    p.add_argument("--soak-warmup", type=float, default=None, metavar="MINUTES",
                   help=f"minutes before the soak's growth is judged (default {soak.WARMUP_SECONDS / 60:g}, or a "
                        "third of a shorter soak)")
    p.add_argument("--soak-shards", type=int, default=soak.SHARDS,
                   help="the soak's seat process holds this many shards, as the saturation was measured (0: a seat "
                        "not partitioned)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the figures as JSON here; an existing file keeps the figures this run did not make")
    p.add_argument("--markdown", type=Path, default=None, help="write the figures as markdown here (from the JSON)")
    p.add_argument("--log", type=Path, default=None, help="the seat's log records go to this file")
    p.add_argument("--log-level", default="WARNING", help="the least level of the records in --log")
    return p


def run_scenario(name: str, params: Params) -> Run:
    """One run of one scenario; a run that raised is a run that lost what it could not check."""
    started = time.monotonic()
    try:
        out: Run = SCENARIOS[name].run(params)
    except Exception as err:
        log.exception("%s (seed %d) failed", name, params.seed)
        out = Run(name, params.seed, lost=[f"the run could not finish: {type(err).__name__}: {err}"])
    out.seconds = time.monotonic() - started
    return out


def pick(*values: Any) -> Any:
    """The first value given (not None)."""
    return next((v for v in values if v is not None), None)


def params_of(name: str, scale: Scale, args: argparse.Namespace, runs: int, seed: int, work: Path) -> Params:
    """One run's parameters: each flag given, else the scale's value for the scenario, else the scale's own."""
    s = scale.setting(name)
    pace = pick(args.pace, scale.pace)
    return Params(seed=seed, work=work, changes=pick(args.count, s.changes), seconds=pick(args.seconds, scale.seconds),
                  faults=pick(args.faults, s.faults), rate=pick(args.rate, s.rate, scale.rate),
                  inputs=-(-pick(args.inputs, s.inputs, scale.inputs) // runs), nodes=pick(args.nodes, scale.nodes),
                  pace=pace or None)


def short(name: str, params: Params, out: Run) -> list[str]:
    """A run that made fewer faults than its parameters ask for (kills: at least; bad input and warrants count
    theirs with --count), said as a finding."""
    asked = params.changes if name in ("bad-input", "warrants") else params.faults
    if asked is None or out.faults >= asked:
        return []
    return [f"the run made {out.faults} of the {asked} faults asked for (its stream ran out of time, "
            f"{params.seconds:g} s)"]


def run_all(names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Every run of every scenario named; answers the figures as the JSON keeps them."""
    scale = SCALES[args.scale]
    runs_of = pick(args.runs, scale.runs)
    results: dict[str, Any] = {}
    for name in names:
        module = SCENARIOS[name]
        runs = []
        for i in range(runs_of):
            seed = args.seed + i
            with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as work:
                params = params_of(name, scale, args, runs_of, seed, Path(work))
                log.info("%s: run %d of %d, seed %d, %d nodes", name, i + 1, runs_of, seed, params.nodes)
                out = run_scenario(name, params)
                out.lost += short(name, params, out)
            settle = "-" if out.settle_seconds is None else f"{out.settle_seconds:.2f} s"
            log.info("%s seed %d: %d faults, %d changes, settled %s after the last, %d lost, %d errors, in %.1f s%s",
                     name, seed, out.faults, out.changes, settle, len(out.lost), len(out.errors), out.seconds,
                     "".join(f"\n  lost: {what}" for what in out.lost[:20])
                     + "".join(f"\n  error: {what}" for what in out.errors[:10]))
            runs.append(out.as_json())
        results[name] = {"faults": module.FAULTS, "runs": runs}
    return results


def machine() -> str:
    """The machine, the interpreter and the nats-server, as the figures name them."""
    return f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, {nats_version()}"


def stamp(when: datetime) -> str:
    """A moment as the figures give it."""
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def run_soak(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The soak asked for, as the JSON's `soak` section keeps it."""
    started = datetime.now(UTC)
    # The machine's load average over the last minute, before and after: what else ran beside the soak.
    before = os.getloadavg()[0]
    section = soak.soak(args.soak, rate=args.soak_rate, nodes=args.soak_nodes, interval=args.soak_interval,
                        seed=args.seed, shards=args.soak_shards,
                        warmup=None if args.soak_warmup is None else args.soak_warmup * 60)
    return {"command": command, "started": stamp(started),
            "took_seconds": round((datetime.now(UTC) - started).total_seconds(), 1), "machine": machine(),
            "load_average": [round(before, 2), round(os.getloadavg()[0], 2)], **section}


def nats_version() -> str:
    """The nats-server's version, as it says it."""
    try:
        return subprocess.run([server_binary(), "--version"], capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()
    except Exception as err:
        return f"unknown ({err})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenarios asked for; 0 when nothing was lost."""
    args = parser().parse_args(argv)
    # Stopped from outside, the runner still stops the servers it started (each run's context managers close them).
    stop_cleanly_on_sigterm()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    log.setLevel(logging.INFO)
    seat_logs = logging.getLogger("mesh_provisioner")
    seat_logs.propagate = False
    if args.log is not None:
        handler = logging.FileHandler(args.log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.setLevel(args.log_level.upper())
        seat_logs.setLevel(min(seat_logs.getEffectiveLevel(), handler.level))
        seat_logs.addHandler(handler)
        logging.getLogger("pykka").addHandler(handler)
    logging.getLogger("pykka").propagate = False
    asked = args.scenario or ("" if args.soak is not None else "all")
    names = list(SCENARIOS) if asked == "all" else [n.strip() for n in asked.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        log.error("no scenario is named %s; the scenarios are %s", ", ".join(unknown), ", ".join(SCENARIOS))
        return 2
    if args.soak is not None and not 0 < args.soak <= MOST_SOAK_MINUTES:
        log.error("--soak takes minutes from more than 0 to %d", MOST_SOAK_MINUTES)
        return 2
    command = "python -m faults " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    # The figures this run does not make are kept from an existing file: the scenarios and the soak are run apart.
    data: dict[str, Any] = {}
    if args.json is not None and args.json.exists():
        data = json.loads(args.json.read_text())
    ok = True
    if names:
        started = datetime.now(UTC)
        results = run_all(names, args)
        scale = SCALES[args.scale]
        pace = pick(args.pace, scale.pace) or None
        kept = {"soak": data["soak"]} if "soak" in data else {}
        data = {
            "command": command,
            "scale": scale.name,
            "nodes": pick(args.nodes, scale.nodes),
            "pace": pace,
            "pace_source": SATURATION_SOURCE if pace is not None and args.pace is None else None,
            "seed": args.seed,
            "runs": pick(args.runs, scale.runs),
            "seconds": pick(args.seconds, scale.seconds),
            "count": args.count,
            "inputs": pick(args.inputs, scale.inputs),
            "rate": pick(args.rate, scale.rate),
            "settings": {name: asdict(scale.setting(name)) for name in names},
            "started": stamp(started),
            "took_seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
            "machine": machine(),
            "scenarios": results,
            **kept,
        }
        lost = sum(len(run["lost"]) for s in results.values() for run in s["runs"])
        errors = sum(len(run["errors"]) for s in results.values() for run in s["runs"])
        log.info("%d scenario(s), %d run(s): %d thing(s) lost, %d error(s) escaped", len(results),
                 sum(len(s["runs"]) for s in results.values()), lost, errors)
        ok = not lost and not errors
    if args.soak is not None:
        data["soak"] = run_soak(args, command)
        ok = ok and soak.passed(data["soak"])
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(render(data))
    return 0 if ok else 1
