"""The seat's rules as pure functions over a read-only view of the bus: no I/O, no clock, no threads."""
