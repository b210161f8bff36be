"""Importing the package changes nothing of nats-py: no module global, no class attribute, no client of a host's.

Run in a fresh interpreter, as a host would import the seat: every nats-py module is imported and every module
global and class attribute of it noted, then every module of the package is imported, and each is compared.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What the package rebound or replaced before (MSG_RE and HMSG_RE of nats-py's parser, a client's `request` and
# `_build_message`), checked by name; then every other attribute of nats-py, by the same snapshot.
PROBE = r"""
import importlib, inspect, pkgutil, sys
import nats, nats.aio.client, nats.protocol.parser as p

for info in pkgutil.walk_packages(nats.__path__, "nats."):
    try:
        importlib.import_module(info.name)
    except ImportError:
        pass  # an optional dependency of nats-py (nkeys, aiohttp) that is not installed

def snapshot():
    seen = {}
    for name, module in list(sys.modules.items()):
        if name != "nats" and not name.startswith("nats."):
            continue
        for attr, value in list(vars(module).items()):
            seen[f"{name}.{attr}"] = value
            if inspect.isclass(value) and value.__module__ == name:
                for inner, member in vars(value).items():
                    seen[f"{name}.{attr}.{inner}"] = member
    return seen

named = (p.MSG_RE, p.HMSG_RE, p.Parser.parse, nats.aio.client.Client.request,
         nats.aio.client.Client._build_message, nats.aio.client.Client._read_loop, nats.aio.client.Client.close)
before = snapshot()
host = nats.aio.client.Client()
host_attributes = dict(vars(host))

import mesh_provisioner
for info in pkgutil.walk_packages(mesh_provisioner.__path__, "mesh_provisioner."):
    if not info.name.endswith(".__main__"):  # runs the program
        importlib.import_module(info.name)

assert (p.MSG_RE, p.HMSG_RE, p.Parser.parse, nats.aio.client.Client.request, nats.aio.client.Client._build_message,
        nats.aio.client.Client._read_loop, nats.aio.client.Client.close) == named, "a named attribute was rebound"
after = snapshot()
changed = sorted(k for k in before if k not in after or after[k] is not before[k])
added = sorted(after.keys() - before.keys())
assert not changed, f"rebound: {changed}"
assert not added, f"added: {added}"
assert vars(host) == host_attributes, "a host's client was changed"
print(f"unchanged: {len(before)} attributes of nats-py")
"""


def test_importing_every_module_of_the_package_rebinds_no_attribute_of_nats_py() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("unchanged: "), run.stdout
