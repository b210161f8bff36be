"""Typed messages: the bus records of the contract, the writes rules return, and the actors' protocol."""
