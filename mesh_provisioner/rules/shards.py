"""A partitioned seat's shards (contract 8.1): which shard a node is in, which process writes a key, and how many
shards each live process holds.

Pure: the leases themselves are on the bus (bus/shards.py). The split is a stable hash of the node's name, so every
process of a mesh, whatever its start or its language, puts a node in the same shard; the share is the same for
every process of a mesh, so the processes agree without talking to each other but through their leases.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping

from mesh_provisioner.contract import MEMBER_KEY_PREFIX, NEEDS, OWN, REGISTRY, SHARD_KEY_PREFIX


@functools.lru_cache(maxsize=1 << 16)  # asked at each change a partitioned process routes, for a few thousand nodes
def shard_of(node: str, shards: int) -> int:
    """The shard a node is in: the first 8 bytes of the SHA-256 of its name, big-endian, modulo the shard count."""
    if shards <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big") % shards


def shard_of_write(state: str, key: str, shards: int) -> int | None:
    """The shard whose holder writes a key of the seat's states: its first token's for plans, provisions and
    refusals (and so the asks for those keys), shard 0's for the registry and the retired needs; None for a state
    that is not one of section 4's."""
    if state in OWN:
        return shard_of(key.partition(".")[0], shards)
    if state in (REGISTRY, NEEDS):
        return 0
    return None


def shard_key(shard: int) -> str:
    """The key of a shard's lease in the seat's bucket."""
    return f"{SHARD_KEY_PREFIX}{shard}"


def member_key(holder: str) -> str:
    """The key a process announces itself under in the seat's bucket."""
    return f"{MEMBER_KEY_PREFIX}{holder}"


def parse_shard_key(key: str, shards: int) -> int | None:
    """The shard a lease key is of; None for a key that is no shard of this count (another count's, or not one)."""
    index = key.removeprefix(SHARD_KEY_PREFIX)
    if index == key or not index.isdigit() or (len(index) > 1 and index[0] == "0"):
        return None
    shard = int(index)
    return shard if shard < shards else None


def fair_share(shards: int, members: int, rank: int = 0) -> int:
    """The most shards the `rank`th of `members` live processes (in order of their ids) holds: the count spread
    evenly, the first processes one more each while some are left over. The shares add up to the count exactly, so
    that once every process took its share no process is left with none while another holds two more."""
    members = max(members, 1)
    return shards // members + (1 if rank < shards % members else 0)


def in_shards(held: Collection[int], shards: int) -> Callable[[str], bool]:
    """Whether a node is in one of the shards `held` (of `shards`)."""
    return lambda node: shard_of(node, shards) in held


def rebalance(
    shards: int, mine: str, holders: Mapping[int, str], members: Iterable[str]
) -> tuple[list[int], list[int]]:
    """Which shards a process takes and which it gives back, from who holds each shard now (`holders`, by shard).

    Live processes are those announced (`members`) and those holding a shard. A process takes free shards up to its
    fair share and gives back those it holds past it, so that a process that joins finds shards to take once the
    others gave theirs back. Each prefers its own stretch of the shards, by its place among the live processes:
    processes starting together do not race for the same free shards, and every process reaches the same split.
    A shard whose holder is "" is held by a process that is not counted (one of another shard count): not free, and
    not a live process.
    """
    share, start = _share(shards, mine, holders, members)
    preferred = [*range(start, shards), *range(start)]  # this process's stretch first
    place = {s: i for i, s in enumerate(preferred)}
    held = sorted((s for s, h in holders.items() if h == mine), key=place.__getitem__)
    give = sorted(held[share:])
    free = [s for s in preferred if s not in holders]
    take = sorted(free[: max(share - len(held), 0)])
    return take, give


def wanting(shards: int, mine: str, holders: Mapping[int, str], members: Iterable[str]) -> int:
    """How many shards past those it holds a process's fair share wants: shards others hold yet, being given back
    (`rebalance` takes only free ones), or lapsed and not yet aged out."""
    share, _ = _share(shards, mine, holders, members)
    return max(share - sum(1 for h in holders.values() if h == mine), 0)


def _share(shards: int, mine: str, holders: Mapping[int, str], members: Iterable[str]) -> tuple[int, int]:
    """A process's fair share among the live processes (`rebalance`), and the shard its own stretch begins at."""
    live = sorted(set(members) | {h for h in holders.values() if h} | {mine})
    rank = live.index(mine)
    return fair_share(shards, len(live), rank), sum(fair_share(shards, len(live), i) for i in range(rank)) % shards
