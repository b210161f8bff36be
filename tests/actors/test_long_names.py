"""A name too long to be a key is bad input (contract 7): named, never written, and the seat keeps its connection.

A placement (or manifest) naming a module of a hundred thousand characters made the seat write a refusal at the key
`<node>.<that name>`: a subject past the server's 4 KB control line. The server answers such a publish with an error
and drops the client, and nats-py closes a connection on a server error for good: the seat never wrote again.
Found by the fault runner's bad input (megabyte strings). A token is now at most 256 characters.
"""

from __future__ import annotations

from seatbus import Bus, assert_fixed_point, settle

from mesh_provisioner.contract import PLACEMENT, REFUSED
from mesh_provisioner.rules.keys import MAX_TOKEN, is_token
from mesh_provisioner.runtime import Runtime

LONG = "a" * 100_000


def test_a_token_has_at_most_max_token_characters() -> None:
    assert is_token("a" * MAX_TOKEN)
    assert not is_token("a" * (MAX_TOKEN + 1))


def test_a_placed_module_of_a_long_name_is_named_and_the_seat_goes_on(sup: Runtime, mesh: Bus) -> None:
    mesh.put(PLACEMENT, "cat", {"node": "cat", "modules": [{"module": LONG}, {"module": "minio"}]})
    settle(sup)
    assert sup.nc.is_connected
    assert all(len(key) < 1000 for key in mesh.entries(REFUSED))
    # minio is not registered: held, and said so at its own key, written as the seat writes any refusal.
    held = mesh.refusal("cat.minio")
    assert held is not None and "minio" in held.why
    # The seat still writes: cat's placement changed again is composed again.
    mesh.put(PLACEMENT, "cat", {"node": "cat", "modules": []})
    settle(sup)
    assert mesh.refusal("cat.minio") is None
    assert sup.store.counts()["failed writes"] == 0
    assert_fixed_point(mesh)
