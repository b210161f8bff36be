"""The fault runner of mesh-provisioner: faults, load and bad input against a real seat on real nats-servers.

Each scenario (`faults.scenarios`) runs the seat on a bus of its own on 127.0.0.1, makes a seeded stream of changes
of the other modules' states, injects its faults (actors killed, the server restarted or paused, the seat process
killed, shard processes of a partitioned seat killed and joining, a cluster server lost, a storm of entries, bad
input, forged answers), records every write of the seat's states as it goes, and ends with the same check
(`meshcheck.check`): the plans and provisions `settle()` computes from the final inputs, a fixed point, the same as an
undisturbed run on the same changes, no ask published twice, every write made by a seat process holding the key's
lease (`meshcheck.history`), a seat that still answers, no exception escaped. `python -m faults` runs them and writes
the figures (`faults.runner`, `faults.report`); `python -m faults --soak MINUTES` runs one seat process under a steady
load for that long and judges whether it stays flat (`faults.soak`).
"""
