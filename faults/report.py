"""The figures as markdown, written from the runner's JSON: one table to take in at a glance, then each run.

`python -m faults.report FIGURES.json > RELIABILITY.md` writes it again from a JSON the runner wrote.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

LONG_COMMAND = (
    "python -m faults --scenario all --seed 20261203 --runs 3 "
    "--json docs/reliability.json --markdown docs/RELIABILITY.md"
)
GOAL_COMMAND = (
    "python -m faults --scenario all --scale goal "
    "--json docs/reliability-goal.json --markdown docs/RELIABILITY-goal.md"
)


def _seconds(values: list[float]) -> tuple[str, str]:
    if not values:
        return "-", "-"
    return f"{statistics.median(values):.2f} s", f"{max(values):.2f} s"


def _span(xs: list[int]) -> str:
    return "-" if not xs else str(xs[0]) if len(xs) == 1 else f"{xs[0]}–{xs[-1]}"


def _lost(runs: list[dict[str, Any]], what: str = "lost") -> str:
    found = [x for run in runs for x in run.get(what, [])]
    return ("nothing" if what == "lost" else "none") if not found else f"**{len(found)}** (see below)"


def _scale(data: dict[str, Any]) -> str:
    """The scale's line: its name, the mesh's nodes, the stream's pace and the runs (a JSON from before scales was
    of the small one)."""
    scale, nodes, pace = data.get("scale", "small"), data.get("nodes", 3), data.get("pace")
    paced = "written as fast as the runner writes it" if pace is None else f"paced at {pace:g} changes a second"
    line = (f"Scale: **{scale}**, a mesh of **{nodes} nodes**, each run's stream of changes {paced}, "
            f"{data['runs']} run(s) of each scenario.")
    if data.get("pace_source"):
        line += f" The pace: {data['pace_source']}."
    made = [f"{name} {run['figures']['changes_per_second']['made']:g}" for name, s in data["scenarios"].items()
            for run in s["runs"] if (run["figures"].get("changes_per_second") or {}).get("made")]
    if pace is not None and made:
        line += (" The pace each run made, in changes a second from its first change to its last (the waits of its "
                 "faults within, and the bad values between bad input's): " + ", ".join(made) + ".")
    return line


def render(data: dict[str, Any]) -> str:
    """The markdown of a run of the runner."""
    lost = sum(len(run["lost"]) + len(run.get("errors", [])) for s in data["scenarios"].values() for run in s["runs"])
    small = data.get("scale", "small") == "small"
    lines = [
        "# Reliability figures" + ("" if small else f" at the {data['scale']} scale"),
        "",
        "What the seat does when things go wrong, and what it lost"
        + (": nothing." if not lost else f": **{lost}** finding(s), below.")
        + " Each scenario below breaks something (actors, the server, a cluster, the seat process, the input) "
        "while a stream of changes runs through the seat, then checks the bus once the seat settled again.",
        "",
        _scale(data),
        "",
        "| scenario | faults injected (per run) | changes (per run) | settle after the last fault: median | worst "
        "| lost | errors escaped |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in data["scenarios"].items():
        runs = s["runs"]
        faults = sorted({run["faults"] for run in runs})
        changes = sorted({run["changes"] for run in runs})
        median, worst = _seconds([run["settle_seconds"] for run in runs if run["settle_seconds"] is not None])
        lines.append(f"| {name} | {_span(faults)} {s['faults']} | {_span(changes)} | {median} | {worst} | "
                     f"{_lost(runs)} | {_lost(runs, 'errors')} |")
    if small:
        lines += [
            "",
            f"![After each kind of fault, the time until the seat settled again: one dot a run, {data['runs']} runs "
            "each](reliability.png)",
        ]
    lines += [
        "",
        "**Settle** runs from the last fault (or the last change, when it came later) until the disturbed seat is "
        "settled: every change on the bus in its cache, every mailbox empty, no write pending (for the seat "
        "processes of *sigkill*: until their bus holds what the undisturbed one holds and stops moving; of *shards*: "
        "until every shard is held, the bus stops moving and holds what `settle()` of its inputs says). **Lost** "
        "counts what the checks found missing or wrong; **errors escaped** counts exceptions that escaped an actor.",
        "",
        "The checks, the same for every scenario, on nats-servers of the fault runner's own on 127.0.0.1: once "
        "settled, every plan, provision and refusal is what the pure `settle()` computes from the inputs the bus "
        "ends with, key by key, but what the contract leaves to history (`meshcheck/settled.py`), and `settle()` over "
        "the bus writes nothing; the bus is at a fixed point (a fresh seat writes nothing); every plan, needed "
        "(non-retiring) provision and refusal also equals that of an undisturbed seat given the same changes (`at`, "
        "`v` and `since` aside: it speaks for the keys `settle()` leaves to history); no ask was published twice "
        "(each `Nats-Msg-Id` once in the router's stream); every write of the seat's states, recorded from its "
        "streams as the run went, was sent by a seat process (told by the compare-and-set it logged) and, where the "
        "seat holds a lease (*pause*, *sigkill*, *shards*), by the holder of the key's lease (`holder`, or its "
        "shard's `shard.<i>`) when the server stored it (`meshcheck/history.py`; *pause* counts apart the writes "
        "its frozen server stored past the lease, as `stored after lease`); the seat still answers (its verb, or a "
        "composition asked of it); and no exception escaped an actor (no ERROR record of the `pykka` or "
        "`mesh_provisioner` loggers but the deliberate kills').",
        "",
        f"Produced by `{data['command']}` (seed {data['seed']}, {data['runs']} run(s) of each scenario, run *i* with "
        f"seed {data['seed']}+*i*) on {data['started']}, in {data['took_seconds']:.0f} s; {data['machine']}."
        + (" The picture: `python -m benchmarks.plots --reliability docs/reliability.json --out docs`." if small
           else ""),
    ]
    pure = [run["figures"].get("pure_inputs", 0) for s in data["scenarios"].values() for run in s["runs"]]
    if any(pure):
        lines += ["", f"Bad input also went through the pure rules: {sum(pure):,} hypothesis-generated values in all "
                      "(each put in a view of the sample mesh, what it wakes composed, judged and decided, every write "
                      "checked, every 500th settled whole)."]
    lines += [
        "",
        "## Running it again",
        "",
        f"The long version, which wrote this file (in {data['took_seconds'] / 60:.0f} minutes here):",
        "",
        "```sh",
        LONG_COMMAND if small else GOAL_COMMAND,
        "```",
        "",
        "One scenario, smaller: `python -m faults --scenario storm --seed 7 --runs 1 --count 500`. The options:",
        "`--count` changes per run (bad input: bad values through the live seat; storm: its entries; warrants: "
        "forged and replayed answers), `--seconds` the bound of each run's stream, `--faults` faults per run where "
        "a scenario counts them, `--rate` kills per second, `--inputs` bad values through the pure rules (shared "
        "among the runs), `--nodes` the mesh's nodes, `--pace` the stream's changes a second; `--scale small|goal` "
        "sets all of them at once (`faults/scale.py`: `goal` is the reliability goal on 200 nodes, one run of each "
        f"scenario, `{GOAL_COMMAND}`), and a flag given overrides the scale's value. CI runs a "
        "bounded version of every scenario (`tests/faults/`).",
        "",
        "## Each run",
        "",
    ]
    for name, s in data["scenarios"].items():
        lines += [f"### {name}", "", f"Faults: {s['faults']}.", ""]
        for run in s["runs"]:
            settle = "did not settle" if run["settle_seconds"] is None else f"settled in {run['settle_seconds']:.2f} s"
            figures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in run["figures"].items())
            lines.append(f"- seed {run['seed']}: {run['faults']} faults, {run['changes']} changes, {settle}, "
                         f"{run['seconds']:.0f} s in all. {run['summary']}." + (f" {figures}." if figures else ""))
            lines += [f"  - lost: {what}" for what in run["lost"][:30]]
            lines += [f"  - error escaped: {what}" for what in run.get("errors", [])[:10]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render(json.loads(Path(sys.argv[1]).read_text())))
