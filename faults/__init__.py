"""The fault runner of mesh-provisioner: faults, load and bad input against a real seat on real nats-servers.

Each scenario (`faults.scenarios`) runs the seat on a bus of its own on 127.0.0.1, makes a seeded stream of changes
of the other modules' states, injects its faults (actors killed, the server restarted or paused, the seat process
killed, a cluster server lost, a storm of entries, bad input, forged answers), and ends with the same check
(`meshcheck.check`): a fixed point, the same plans and provisions as an undisturbed run on the same changes, no ask
published twice, a seat that still answers, no exception escaped. `python -m faults` runs them and writes the
figures (`faults.runner`, `faults.report`).
"""
