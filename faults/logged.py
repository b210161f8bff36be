"""`python -m faults.logged WRITES ARGS...`: the seat process `python -m mesh_provisioner ARGS...`, every write it
sends to the seat's states logged to the file WRITES first (faults/spies.py `CasSpy`), one JSON line a write: the
process's pid, the key's subject and the revision the write expects. The write history's checker
(meshcheck/history.py) tells by these lines which process made each write the server stored.

The seat is not changed: only its runtime's connection is wrapped, as the in-process scenarios wrap it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from faults.spies import CasSpy, spied_runtimes
from mesh_provisioner.cli import main as seat_main


def main(argv: Sequence[str]) -> int:
    """Run the seat process with its writes logged; its exit code."""
    if not argv:
        sys.stderr.write("usage: python -m faults.logged WRITES ARGS...\n")
        return 2
    with open(Path(argv[0]), "a", encoding="utf-8") as sink, spied_runtimes(CasSpy(sink=sink)):
        return seat_main(list(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
