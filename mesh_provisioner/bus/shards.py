"""A partitioned seat's leases (contract 8.1): the `shard.<i>` keys of `mesh-provisioner.seat` this process holds.

Each shard's lease is the seat's lease (bus/lease.py) for the nodes of one shard: created when free, renewed by
compare-and-set a quarter of the lease time apart, aged out by the bucket when its holder stops, deleted on a
clean exit or when it is given to a process that joined. A process announces itself under `member.<holder>` first,
so that the others count it live before it holds anything, and takes free shards up to its fair share of the live
processes (rules/shards.py): NATS KV is the coordinator, there is none of our own. It looks at the bucket on a timer
(a lease that ages out says nothing on the bus) and follows it with a watch, so that a process joining or leaving
cleanly, or a shard given back, moves the shares at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Collection
from datetime import UTC, datetime

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from mesh_provisioner.bus.lease import ATTEMPT, SAFETY, SeatLease, described, read_leases, renew_key
from mesh_provisioner.bus.watch import Watch, drop_watch
from mesh_provisioner.contract import HOLDER_KEY, LEASE_SECONDS, MEMBER_KEY_PREFIX, SEAT, SHARD_KEY_PREFIX
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules.shards import (
    member_key,
    parse_shard_key,
    rebalance,
    shard_key,
    shard_of,
    shard_of_write,
    wanting,
)

log = logging.getLogger("mesh_provisioner.bus.shards")

_BUS_ERRORS = (nats.errors.Error, nats.js.errors.Error, TimeoutError)


class ShardLeases(SeatLease):
    """The shards this process holds, each with its own revision and deadline; the seat's lease for their nodes."""

    def __init__(self, nc: Client, shards: int, seconds: float = LEASE_SECONDS, *, holder: str = "") -> None:
        super().__init__(nc, seconds, holder=holder)
        self.shards = shards
        self._revisions: dict[int, int] = {}  # each shard held: the revision this process wrote
        self._deadlines: dict[int, float] = {}  # each shard held: monotonic time until which this process writes it
        self._renewed: dict[int, float] = {}  # each shard held: when its lease was last written
        # Shards given back whose keys wait for the writes in flight under them (`_hand_over`), by shard.
        self._handing: dict[int, asyncio.Task[None]] = {}
        # One change of what is held at a time: a take, a look (renewals and rebalance), a rebalance the bucket's watch
        # asked for, a giving back. Each awaits the bus between reading what is held and writing it.
        self._holding = asyncio.Lock()
        self._following: asyncio.Task[None] | None = None  # the watch of the bucket (`_follow`), from the first take
        self._members: set[str] = set()  # the other processes the watch has seen announced
        # Shards held whose nodes this process composes: what it keeps of them was read since it took them (`ready`).
        self._ready: set[int] = set()
        self._dropped: set[int] = set()  # shards no longer held since last asked (`dropped`)
        # How many shards past those held this process's fair share wants, as the last rebalance saw.
        self.missing = 0

    def record(self) -> r.Lease:
        """The lease record this process writes, with the shard count it runs with (8.1: the same for every process)."""
        return msgspec.structs.replace(super().record(), shards=self.shards)

    # ---- what this process may do now ---------------------------------------------------------------------

    def waiting_for(self) -> str:
        """Why this process holds no shard now, for the log and `/readyz`."""
        if self.blocker:
            return f"{self.blocker}: this process takes no shard until it is given back"
        return "this process holds no shard of the seat (every shard is held by others): it waits for its share"

    @property
    def renew_every(self) -> float:
        """How often the shards are looked at: each renewed when due (a quarter of the lease time), and free ones
        taken, or ones past the fair share given back, within a second of a process leaving or joining (at once when
        it announced itself or left cleanly: `_follow`)."""
        return min(self.seconds / 5, 1.0)

    @property
    def poll_every(self) -> float:
        """How often a process holding no shard asks for one."""
        return min(self.seconds / 5, 1.0)

    @property
    def held(self) -> bool:
        """Whether this process holds any shard now, with the safety margin."""
        now = time.monotonic()
        return any(now < d for d in list(self._deadlines.values()))  # a copy: the lease loop changes it meanwhile

    def mine(self) -> list[int]:
        """The shards this process holds now, in order."""
        now = time.monotonic()
        return sorted(s for s, d in list(self._deadlines.items()) if now < d)

    def left(self) -> float:
        """Seconds until the first of this process's shards counts as lapsed; 0 when it holds none."""
        now = time.monotonic()
        return max(min((d - now for d in list(self._deadlines.values())), default=0.0), 0.0)

    def lapse(self) -> None:
        """Count every shard as lapsed now."""
        self._deadlines = dict.fromkeys(self._deadlines, 0.0)

    def holds(self, node: str) -> bool:
        """Whether this process keeps in memory what only a node's own judgments read: its shard is held (contract
        8.1), renewed or about to be. A shard whose renewal is late stays held until the renewal fails or the shard is
        given back, while its writes wait for the renewal (`guard`)."""
        return shard_of(node, self.shards) in self._revisions

    def owns(self, node: str) -> bool:
        """Whether this process composes a node: its shard is held, and what is kept of its nodes was read since it
        was taken (`ready`). Composed before, a node would be judged from providers' entries missing from memory and
        its keys written wrong until then."""
        shard = shard_of(node, self.shards)
        return shard in self._revisions and shard in self._ready

    async def ready(self, shards: Collection[int]) -> None:
        """What is kept of the shards' nodes is read: this process composes them from now on, while it holds them.
        On the lease's loop, as every change of what is held: a shard let go meanwhile stays unready, and so does one
        taken again since (`taken` hands it over again, to be read again)."""
        self._ready |= {shard for shard in shards if shard in self._revisions and shard not in self._taken}

    def dropped(self) -> set[int]:
        """The shards no longer held (given back, lapsed or lost) since this was last asked: memory lets go of what
        only their nodes' judgments read (runtime.py `gave`)."""
        dropped, self._dropped = self._dropped, set()
        return dropped

    def shard_of(self, write: Write) -> int | None:
        """The shard whose lease a write is made under (contract 8.1); None for a state that is not the seat's."""
        return shard_of_write(write.state, write.key, self.shards)

    def guard(self, write: Write | None = None) -> str:
        """Why this process may not make a write ("" when it may): its key's shard is not held (contract 8.1)."""
        if write is None:
            return "" if self.held else "this process holds no shard of the seat"
        shard = self.shard_of(write)
        if shard is None:
            return f"{write.state} is not a state of the seat"
        if time.monotonic() < self._deadlines.get(shard, 0.0):
            return ""
        return f"this process does not hold shard {shard} of the seat"

    # ---- taking, renewing, giving back ----------------------------------------------------------------------

    async def take(self) -> bool:
        """Announce this process, then take free shards up to its fair share; answers whether it holds any. From the
        first take on, the bucket is followed (`_follow`): shards freed later are taken as they are freed."""
        kv = await self._bucket()
        self._keep_following(kv)
        async with self._holding:
            await self._announce(kv)
            await self._rebalance(kv)
        return self.held

    def _keep_following(self, kv: KeyValue) -> None:
        """Follow the bucket (`_follow`) unless it is followed already: from the first take on, and again at each look
        after a watch that ended (a bus error)."""
        if self._following is None or self._following.done():
            self._following = asyncio.create_task(self._follow(kv), name="follow the shard leases")

    async def renew(self) -> bool:
        """Renew each shard due (a quarter of the lease time after its last renewal), then rebalance: take free
        shards up to the fair share, give back those past it. Answers False when this process holds no shard now.

        A shard whose renewal fails is lost alone: its writes stop at once, the others' go on.
        """
        self.taken_over = False  # unknown until the bucket is read
        try:
            kv = await self._bucket()
        except _BUS_ERRORS as err:
            log.warning("the seat's shards are not renewed (%s)", err or type(err).__name__)
            self._forget_lapsed()
            return self.held
        self._keep_following(kv)
        async with self._holding:
            return await self._renew_all(kv)

    async def _renew_all(self, kv: KeyValue) -> bool:
        """`renew`'s renewals and rebalance, nothing else changing what is held meanwhile."""
        due = time.monotonic() - self.seconds / 4
        renewing = [s for s, at in self._renewed.items() if at <= due]
        # Renewed together: on a cluster, each may wait for the same leader election.
        outcomes = await asyncio.gather(*(self._renew(kv, s) for s in renewing), return_exceptions=True)
        lost = []
        for shard, outcome in zip(renewing, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("shard %d's lease is not renewed (%s): this process stops writing its nodes", shard,
                            outcome or type(outcome).__name__)
                lost.append(shard)
        for shard in lost:
            self._drop(shard)
        self._forget_lapsed()  # those whose keys are still this process's are taken back now
        try:
            await self._announce(kv)
            await self._rebalance(kv)
        except _BUS_ERRORS as err:
            log.warning("the shard leases could not be read (%s): this process takes none and gives none back until "
                        "its next look", err or type(err).__name__)
        self._forget_lapsed()
        return self.held

    async def _renew(self, kv: KeyValue, shard: int) -> None:
        """Renew one shard's lease by compare-and-set, tried again while it holds (`renew_key`). A shard renewed after
        its lease lapsed here counts as taken again: writes of its nodes were refused meanwhile."""
        asked = time.monotonic()
        lapsed = asked >= self._deadlines[shard]
        self._revisions[shard] = await renew_key(kv, shard_key(shard), r.encode(self.record()),
                                                 self._revisions[shard], self.holder, self._deadlines[shard])
        if lapsed:
            self._taken.add(shard)
        self._deadlines[shard] = asked + self.seconds * (1 - SAFETY)
        self._renewed[shard] = asked

    async def give_back(self) -> None:
        """Delete every shard lease and the member key of this process (a clean exit): others take them at once."""
        following, self._following = self._following, None  # nothing given back is taken again (`_follow`)
        if following is not None:
            following.cancel()
            await asyncio.wait({following}, timeout=ATTEMPT)
        async with self._holding:  # a rebalance under way ends first: what it took is given back too
            await self._give_back()

    async def _give_back(self) -> None:
        """`give_back`, nothing else changing what is held meanwhile."""
        held = sorted(self._revisions)
        let_go = [(shard, *self._let_go(shard)) for shard in held]
        try:
            kv = await self._bucket()
        except _BUS_ERRORS as err:
            log.info("the seat's shards are not given back (%s); they age out", err or type(err).__name__)
            return
        await asyncio.gather(*(self._hand_over(kv, *shard) for shard in let_go), *self._handing.values())
        try:
            await kv.delete(member_key(self.holder))
        except _BUS_ERRORS as err:
            log.info("this process's member key is not deleted (%s); it ages out", err or type(err).__name__)
        if held:
            log.info("gave shards %s of the seat back", _listed(held))

    def _handed(self, shard: int, _: asyncio.Task[None]) -> None:
        self._handing.pop(shard, None)

    def _let_go(self, shard: int) -> tuple[int, float]:
        """Stop writing a shard's nodes at once, before another process can take it; answers its key's revision and
        when the key would age out (monotonic time)."""
        revision, renewed = self._revisions.get(shard, 0), self._renewed.get(shard, 0.0)
        self._drop(shard)
        return revision, renewed + self.seconds

    async def _hand_over(self, kv: KeyValue, shard: int, revision: int, ages_out: float) -> None:
        """Delete the key of a shard let go once the writes sent under it are answered (unanswered.py), so that none is
        stored after another process took the shard; one still unanswered when the key would age out anyway, or a
        bus that does not answer, leaves the key to age out."""
        try:
            if not await self.unanswered.cleared({shard}, ages_out - time.monotonic()):
                log.info("shard %d is left to age out: writes sent under its lease are not answered", shard)
                return
            await _delete(kv, shard_key(shard), revision)
        except _BUS_ERRORS as err:
            log.info("shard %d is not given back (%s); it ages out", shard, err or type(err).__name__)

    async def _follow(self, kv: KeyValue) -> None:
        """Rebalance as soon as the bucket says another process joined or left cleanly, or a shard was freed, not at the
        next look (a second later): two processes started together otherwise split the shards a look apart, and the
        one that took them all composes nodes whose consumers the other then composes again. Changes that come while a
        rebalance runs are answered by one more. A watch that fails leaves the looks to do it."""
        me = asyncio.current_task()
        moved = asyncio.Event()

        async def rebalancing() -> None:
            # Ends when the bucket is no longer followed, cancelled or not: on Python 3.11 a cancel that meets the
            # answer of one of nats-py's requests (`asyncio.wait_for`) is lost.
            while self._following is me:
                await moved.wait()
                moved.clear()
                try:
                    async with self._holding:
                        if self._following is not me:  # given back meanwhile: nothing is taken again
                            return
                        await self._rebalance(kv)
                except _BUS_ERRORS as err:
                    log.debug("a rebalance the shard leases' watch asked for failed (%s)", err or type(err).__name__)

        worker = asyncio.create_task(rebalancing(), name="rebalance the shards")
        watcher: Watch | None = None
        js = self.nc.jetstream(timeout=ATTEMPT)
        try:
            watcher = await Watch.start(js, SEAT, headers_only=True)
            while self._following is me:
                update = await anext(watcher)
                if self._moves(update.key, update.value is None):
                    moved.set()
        except StopAsyncIteration:
            pass  # the watch was stopped: the next look follows the bucket again
        except _BUS_ERRORS as err:
            log.info("the shard leases are not followed (%s): they are looked at every %.1f s", err or
                     type(err).__name__, self.renew_every)
        finally:
            worker.cancel()
            moved.set()  # a cancel lost, the worker still sees it is over
            if watcher is not None:
                await drop_watch(self.nc, js, watcher)

    def _moves(self, key: str, deleted: bool) -> bool:
        """Whether a change of the bucket may move the shares: another process announced for the first time or gone,
        or a shard's key deleted. A renewal moves nothing."""
        if key.startswith(SHARD_KEY_PREFIX):
            return deleted
        if not key.startswith(MEMBER_KEY_PREFIX):
            return False
        holder = key.removeprefix(MEMBER_KEY_PREFIX)
        if deleted:
            self._members.discard(holder)
            return True
        if holder == self.holder or holder in self._members:
            return False
        self._members.add(holder)
        return True

    async def _announce(self, kv: KeyValue) -> None:
        """Say this process is live (`member.<holder>`), renewed with its leases; it ages out with them."""
        await kv.put(member_key(self.holder), r.encode(self.record()))

    async def _rebalance(self, kv: KeyValue) -> None:
        """Take free shards up to the fair share and give back those past it (rules/shards.py `rebalance`); called
        holding `_holding`."""
        holders, revisions, members, others = await self._read(kv)
        # Holding nothing with no shard key of this process's left on the bus, holding is over (`taken_over`).
        self.taken_over = not any(h == self.holder for h in holders.values())
        for shard in self._handing:
            holders[shard] = ""  # being given back: neither this process's nor free, until its key is deleted
        for shard, holder in holders.items():
            if holder and holder != self.holder and shard in self._revisions:
                self._drop(shard)  # someone else holds it: ours lapsed and was taken
            elif holder == self.holder and shard not in self._revisions and not others:
                await self._take_back(kv, shard, revisions[shard])
        take, give = rebalance(self.shards, self.holder, holders, members)
        if others:
            # Processes of two shard counts would split the nodes two ways, each writing some of the other's: while one
            # of another count holds any lease, this one takes nothing, and gives back all if that one was first.
            take = []
            if others < (self._since or datetime.max.replace(tzinfo=UTC), self.holder):
                give = sorted(self._revisions)
        # All at once: a shard just given back is taken over its delete marker in three requests (nats-py's `create`),
        # and 32 of them one after the other took 0.4 s of a start. Every take is waited for, failed or not, so that
        # none changes what is held once this rebalance is over; the first failure is raised after.
        results = await asyncio.gather(*(self._take(kv, shard) for shard in take), return_exceptions=True)
        taken = [result for result in results if isinstance(result, int)]
        held = {**holders, **dict.fromkeys(taken, self.holder)}
        self.missing = 0 if others else wanting(self.shards, self.holder, held, members)
        for shard in give:
            # Its key is deleted meanwhile (`_hand_over`): renewals of the others go on while its writes are answered.
            handing = asyncio.create_task(self._hand_over(kv, shard, *self._let_go(shard)), name=f"give back {shard}")
            handing.add_done_callback(functools.partial(self._handed, shard))
            self._handing[shard] = handing
        if taken:
            log.info("this process took shards %s of the seat, and holds %d of %d (holder %s)", _listed(taken),
                     len(self._revisions), self.shards, self.holder)
        if give:
            log.info("gave shards %s of the seat back to the processes that joined", _listed(give))
        if failed := next((result for result in results if isinstance(result, BaseException)), None):
            raise failed

    async def _take(self, kv: KeyValue, shard: int) -> int | None:
        """Take one free shard: its key created with this process's lease; answers the shard, None when another
        process took it first."""
        asked = time.monotonic()
        lease = self.record()  # since this process first took a shard, held since without a break
        try:
            revision = await kv.create(shard_key(shard), r.encode(lease))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None  # another process took it first
        except nats.js.errors.APIError as err:
            if err.err_code in (10071, 10164):
                return None
            raise
        self._since = self._since or lease.since
        self._revisions[shard] = revision
        self._deadlines[shard] = asked + self.seconds * (1 - SAFETY)
        self._renewed[shard] = asked
        self._taken.add(shard)
        return shard

    async def _take_back(self, kv: KeyValue, shard: int, revision: int) -> None:
        """Take back a shard whose lease lapsed here while its key, this process's, is still on the bus: no one else
        can have taken it, and waiting for it to age out would leave its nodes uncomposed that long."""
        asked = time.monotonic()
        try:
            self._revisions[shard] = await renew_key(kv, shard_key(shard), r.encode(self.record()), revision,
                                                     self.holder, asked + self.seconds * (1 - SAFETY))
        except _BUS_ERRORS as err:
            log.info("shard %d is not taken back (%s)", shard, err or type(err).__name__)
            return
        self._deadlines[shard] = asked + self.seconds * (1 - SAFETY)
        self._renewed[shard] = asked
        self._taken.add(shard)
        log.info("this process took shard %d of the seat back: its lease had lapsed here, not on the bus", shard)

    async def _read(
        self, kv: KeyValue
    ) -> tuple[dict[int, str], dict[int, int], set[str], tuple[datetime, str] | None]:
        """Who holds each shard now and its key's revision, the processes announced live, as the bucket says; and the
        earliest lease held by a process of another shard count (since when, and its holder id), None when there is
        none."""
        holders: dict[int, str] = {}
        revisions: dict[int, int] = {}
        members: set[str] = set()
        others: list[tuple[datetime, str]] = []
        blocker = ""  # set once read: `waiting_for` may be asked meanwhile, on another thread
        for key, (lease, revision) in (await read_leases(self.nc, self.seconds)).items():
            shard = parse_shard_key(key, self.shards)
            if key == HOLDER_KEY or (key.startswith(SHARD_KEY_PREFIX) and lease.shards != self.shards):
                # A lease of another shard count (the whole seat's `holder` is one): not counted live, and held.
                what = ("holds the whole seat (--shards 1)" if key == HOLDER_KEY
                        else f"holds {key} (--shards {lease.shards or 1})")
                self._other(lease, what)
                blocker = blocker if others else described(lease, what)
                others.append((lease.since or datetime.min.replace(tzinfo=UTC), lease.holder))
                if shard is not None:
                    holders[shard] = ""
            elif lease.shards != self.shards:
                self._other(lease, f"runs with --shards {lease.shards or 1}")  # announced only: not counted live
            elif shard is not None:
                holders[shard] = lease.holder
                revisions[shard] = revision
            elif key.startswith(MEMBER_KEY_PREFIX):
                members.add(lease.holder)
        self.blocker = blocker
        return holders, revisions, members, min(others, default=None)

    def _drop(self, shard: int) -> None:
        if shard in self._revisions:
            self._dropped.add(shard)
        self._ready.discard(shard)  # taken again, it is ready once what is kept of it was read again
        self._revisions.pop(shard, None)
        self._deadlines.pop(shard, None)
        self._renewed.pop(shard, None)
        if not self._revisions:
            self._since = None  # holding nothing: a shard taken later is held since then

    def _forget_lapsed(self) -> None:
        """Forget the shards whose deadline passed: their keys age out or were taken."""
        now = time.monotonic()
        lapsed = [s for s, d in self._deadlines.items() if d <= now]
        for shard in lapsed:
            self._drop(shard)
        if lapsed:
            log.warning("shards %s of the seat lapsed: this process stops writing their nodes", _listed(lapsed))


async def _delete(kv: KeyValue, key: str, revision: int) -> None:
    """Delete a lease key this process wrote at `revision`; one someone else wrote since is left alone."""
    if not revision:
        return
    try:
        await kv.delete(key, last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        pass
    except nats.js.errors.APIError as err:
        if err.err_code not in (10071, 10164):
            raise


def _listed(shards: list[int]) -> str:
    """Shards as a short list for the log."""
    return ", ".join(map(str, shards)) if len(shards) <= 8 else f"{shards[0]}..{shards[-1]} ({len(shards)})"
