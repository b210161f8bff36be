"""Fixtures of the actor tests: the sample mesh on a real nats-server, another module's connection, and seats."""

from seatbus import bus, mesh, seats, sup

__all__ = ["bus", "mesh", "seats", "sup"]
