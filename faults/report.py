"""The figures as markdown, written from the runner's JSON: one table to take in at a glance, then each run; then
the soak, which a command of its own runs.

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
SOAK_MINUTES = 30
SOAK_COMMAND = f"python -m faults --soak {SOAK_MINUTES} --json docs/reliability.json --markdown docs/RELIABILITY.md"
GOAL_COMMAND = (
    "python -m faults --scenario all --scale goal "
    "--json docs/reliability.json --markdown docs/RELIABILITY.md"
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
    paces = [(name, run["figures"]["changes_per_second"]) for name, s in data["scenarios"].items()
             for run in s["runs"] if (made := run["figures"].get("changes_per_second") or {}).get("made")
             and made.get("asked")]  # a stream not paced (bad input's good changes) has no pace to say
    if pace is not None and paces:
        line += (" The pace each run made while its stream flowed, in changes a second (the stream is held while a "
                 "fault is injected and waited on, and while a paused server is frozen; a cluster's changes wait "
                 "for its new leaders as any writer's do), and from its first change to its last with those waits: "
                 + ", ".join(_pace(name, made) for name, made in paces) + ".")
    bad = [run["figures"]["bad_values_per_second"] for s in data["scenarios"].values() for run in s["runs"]
           if run["figures"].get("bad_values_per_second")]
    if bad:
        line += (" Bad input's stream is its bad values, put as fast as the bus takes them (generating each included): "
                 + ", ".join(f"{rate:g}" for rate in bad) + " a second.")
    return line


def _pace(name: str, made: dict[str, Any]) -> str:
    """A run's pace: while flowing, and overall when the stream was held (a JSON from before says one figure)."""
    overall = made.get("overall")
    return f"{name} {made['made']:g}" + (f" ({overall:g} overall)" if overall and made.get("held_seconds") else "")


def render(data: dict[str, Any]) -> str:
    """The markdown of the runner's JSON: its scenarios' figures and its soak's, each where there are some."""
    scale = data.get("scale", "small") if "scenarios" in data else "small"
    lines = ["# Reliability figures" + ("" if scale == "small" else f" at the {scale} scale"), ""]
    if "scenarios" in data:
        lines += _scenarios(data)
    if "soak" in data:
        lines += _soak(data["soak"])
    return "\n".join(lines)


def _scenarios(data: dict[str, Any]) -> list[str]:
    lost = sum(len(run["lost"]) + len(run.get("errors", [])) for s in data["scenarios"].values() for run in s["runs"])
    small = data.get("scale", "small") == "small"
    soaked = (" A soak, one seat process under a steady load for a long time, judged for growth, is at the end "
              "([Soak](#soak)), from a command of its own." if "soak" in data else "")
    lines = [
        "What the seat does when things go wrong, and what it lost"
        + (": nothing." if not lost else f": **{lost}** finding(s), below.")
        + " Each scenario below breaks something (actors, the server, a cluster, the seat process, the input) "
        "while a stream of changes runs through the seat, then checks the bus once the seat settled again." + soaked,
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
    lines += [
        "",
        f"![After each kind of fault, the time until the seat settled again: one dot a run, {data['runs']} run(s) "
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
        f"The scenarios' figures: `{data['command']}` (seed {data['seed']}, {data['runs']} run(s) of each scenario, "
        f"run *i* with seed {data['seed']}+*i*) on {data['started']}, in {data['took_seconds']:.0f} s; "
        f"{data['machine']}. The picture: `python -m benchmarks.plots --reliability docs/reliability.json --out docs`.",
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
        f"The command that wrote the scenarios' figures (in {data['took_seconds'] / 60:.0f} minutes here):",
        "",
        "```sh",
        LONG_COMMAND if small else GOAL_COMMAND,
        "```",
        "",
        f"The soak is a command of its own (`{SOAK_COMMAND}`{', below' if 'soak' in data else ''}); each replaces "
        "only its own figures in the JSON.",
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
            figures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in run["figures"].items() if k != "while_down")
            lines.append(f"- seed {run['seed']}: {run['faults']} faults, {run['changes']} changes, {settle}, "
                         f"{run['seconds']:.0f} s in all. {run['summary']}." + (f" {figures}." if figures else ""))
            lines += [_down(down) for down in run["figures"].get("while_down", [])]
            lines += [f"  - lost: {what}" for what in run["lost"][:30]]
            lines += [f"  - error escaped: {what}" for what in run.get("errors", [])[:10]]
        lines.append("")
    return lines


def _down(down: dict[str, Any]) -> str:
    """One server of a cluster down (the cluster scenario): how soon the changes made meanwhile were written."""
    alone = "-" if down["alone_seconds"] is None else f"{down['alone_seconds']:.2f} s"
    election = "-" if down["election_seconds"] is None else f"{down['election_seconds']:.2f} s"
    return (f"  - {down['role']} (n{down['server']}) down: the changes made meanwhile written "
            f"{down['settle_seconds']:.2f} s after the last of them; the undisturbed seat on one server took {alone}, "
            f"the cluster's election of new leaders {election}")


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:g} s"
    return f"{seconds / 60:g} minute{'' if seconds == 60 else 's'}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def _load(soak: dict[str, Any]) -> str:
    if "load_average" not in soak:
        return ""
    before, after = soak["load_average"]
    return f"; the machine's load average (one minute) {before:g} at the start and {after:g} at the end"


def _soak(soak: dict[str, Any]) -> list[str]:
    """The soak's section: what ran, the verdict and its figures, a row a minute, and the command."""
    v = soak["verdict"]
    load = soak["load"]
    minutes = soak["minutes"]
    warmup = v["warmup_seconds"]
    if v["flat"]:
        said = "**flat**"
    elif not v["judged"]:
        said = f"**not judged**: {v['why']}"
    else:
        said = f"**not flat**: {v['why']}"
    sustained = ("sustained" if load["sustained"] else f"**not sustained**: {load['why_not_sustained']}")
    shards = (f"`benchmarks.seat_proc --shards {soak['shards']}`, one process of a partitioned seat started as "
              "`serve` starts it, as the saturation was measured" if soak["shards"]
              else "`benchmarks.seat_proc`, a seat not partitioned")
    lines = [
        "## Soak",
        "",
        f"One seat process ({shards}) on the benchmarks' mesh of {soak['nodes']:,} nodes, under "
        f"{soak['rate']:g} changes a second ({soak['rate_source']}) for {minutes:g} minutes, on a nats-server of its "
        f"own on 127.0.0.1; sampled every {soak['interval_seconds']:g} s. The verdict: {said}. The load was "
        f"{sustained}.",
        "",
        f"Growth is judged after a warm-up of {_duration(warmup)}, from the start of what follows to its end: "
        f"{v['rule']}. Resident memory, open file descriptors and threads are read from /proc; the asyncio tasks "
        "not done on the seat's loops from its `/metrics` (`mesh_provisioner_loop_tasks`, summed over its loops); "
        "the latency is that of each change to the write it causes, as the load saw the writes.",
        "",
    ]
    if v["resources"] or v["p99"]:
        lines += [
            f"| | after the warm-up ({_duration(warmup)}; a median of {v['ends']} samples) | at the end (a median of "
            f"the last {v['ends']}) | growth | flat |",
            "|---|---|---|---|---|",
        ]
        names = {"rss_bytes": "resident memory", "fds": "open file descriptors", "threads": "threads",
                 "tasks": "asyncio tasks"}
        for name, words in names.items():
            r = v["resources"].get(name, {})
            if not r.get("judged"):
                lines.append(f"| {words} | - | - | - | not judged |")
                continue
            show = _mib if name == "rss_bytes" else (lambda x: f"{x:,g}")
            lines.append(f"| {words} | {show(r['start'])} | {show(r['end'])} | "
                         f"{r['growth']:+.1%} | {'yes' if r['flat'] else '**no**'} |")
        p = v["p99"]
        if p.get("judged"):
            lines.append(f"| change-to-write p99 (of the first and the last fifth of the samples after the "
                         f"warm-up: {p['writes_first']:,} and {p['writes_last']:,} writes) | {_ms(p['first_ms'])} | "
                         f"{_ms(p['last_ms'])} | "
                         f"{p['ratio']:.2f} times | {'yes' if p['flat'] else '**no**'} |")
        else:
            lines.append("| change-to-write p99 | - | - | - | not judged |")
        lines.append("")
    cold = soak["cold"]
    lines += [
        "![The soak: the seat process's memory, file descriptors, threads, tasks and change-to-write latency, "
        "sampled as the load ran](soak.png)",
        "",
        f"The load: {load['changes']:,} changes in {load['seconds']:.0f} s, {load['writes']:,} writes timed "
        f"(p50 {_ms(load['p50_ms'])}, p99 {_ms(load['p99_ms'])}, the slowest {_ms(load['max_ms'])}), "
        f"{load['missed']:,} never came within 5 s. Before it, the cold start: {cold['seconds']:.1f} s, "
        f"{cold['writes']:,} writes, {cold['keys']:,} keys in the cache.",
        "",
    ]
    samples = soak["samples"]
    if samples:
        step = max(1, round(60 / soak["interval_seconds"]))
        step = step if len(samples) > step else 1
        shown = samples[step - 1 :: step] if len(samples) >= step else samples
        if shown[-1] is not samples[-1]:
            shown.append(samples[-1])
        lines += [
            "| s | resident memory | fds | threads | tasks | CPU, s | changes | writes | p50 | p99 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for x in shown:
            tasks = "-" if x["tasks"] is None else x["tasks"]
            lines.append(f"| {x['seconds']:.0f} | {_mib(x['rss_bytes'])} | {x['fds']} | {x['threads']} | {tasks} | "
                         f"{x['cpu_seconds']:.0f} | {x['changes']:,} | {x['writes']:,} | {_ms(x['p50_ms'])} | "
                         f"{_ms(x['p99_ms'])} |")
        lines += ["", f"A row every {step * soak['interval_seconds']:g} s, and the last; a row's changes, writes "
                      f"and latency are those of its {soak['interval_seconds']:g}-second window, its CPU the seat "
                      "process's since it started.", ""]
    lines += [
        f"The soak's figures: `{soak['command']}` on {soak['started']}, in {soak['took_seconds']:.0f} s; "
        f"{soak['machine']}{_load(soak)}. The picture: "
        "`python -m benchmarks.plots --reliability docs/reliability.json --out docs`. "
        f"The soak the seat is held to runs {SOAK_MINUTES} minutes at half saturation on 1,000 nodes:",
        "",
        "```sh",
        SOAK_COMMAND,
        "```",
        "",
        "It exits 1 when the soak is not flat or its load not sustained; it replaces only the soak's figures in the "
        "JSON. Smaller: `python -m faults --soak 1 --soak-nodes 100 --soak-interval 2`; `--soak-rate R` another "
        "rate (0: measure the saturation first, then soak at half of it), `--soak-warmup MINUTES` another warm-up.",
        "",
    ]
    return lines


if __name__ == "__main__":
    sys.stdout.write(render(json.loads(Path(sys.argv[1]).read_text())))
