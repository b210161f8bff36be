"""A seat checked from outside, on a real bus: what the tests and the fault runner (faults/) share.

`meshcheck.bus` is another module's connection to a bus (`Bus`): it writes the other modules' states, plays the
router of asks, and reads the seat's states back from the server, never from the seat's memory; with it `until`,
the one deadline-bounded wait, and `seat_config`. `meshcheck.check` holds the checks a settled seat must pass: a
fixed point, the same plans and provisions as an undisturbed run, every ask published once, a seat that still
answers, no exception escaped.
"""
