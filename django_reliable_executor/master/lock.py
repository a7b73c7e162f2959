"""The master lock and the shards' chore locks: acquire, renew before expiry, give up on error."""

from __future__ import annotations

import datetime as dt
import logging
import random
import time

from ..connections import drop_unusable_connections, with_reconnect
from ..observability import metrics
from ..storage.base import TaskStorage
from ..storage.lock_names import MASTER_LOCK_NAME, chore_lock_name

logger = logging.getLogger("django_reliable_executor")


class MasterLock:
    """A lease in the storage; only its holder (the master) runs the chores.

    Holding it is an optimisation, not a safety property: every chore is an atomic, idempotent
    compare-and-set, so two workers that both believe they are master do no harm.
    """

    def __init__(self, storage: TaskStorage, owner: str, ttl_seconds: float) -> None:
        self.storage = storage
        self.owner = owner
        self.ttl = ttl_seconds
        self.is_master = False
        # Whether the last take-or-renew reached the storage (False after an error).
        self.reachable = True
        self._renew_due = 0.0

    def hold(self) -> bool:
        """Take or renew the lock when due; returns whether this worker is master now."""
        now = time.monotonic()
        if self.is_master and now < self._renew_due:
            return True
        try:
            # A connection the server killed (restart, failover, idle timeout) fails once:
            # take or renew again at once on a new one rather than give up mastership.
            acquired = with_reconnect(
                lambda: self.storage.acquire_lock(MASTER_LOCK_NAME, self.owner, self.ttl)
            )
            self.reachable = True
        except Exception:
            logger.exception("master lock: storage error, giving up mastership")
            acquired = False
            self.reachable = False
            drop_unusable_connections()  # the next round reconnects
        metrics.set_master(acquired)
        if acquired != self.is_master:
            logger.info("worker %s %s the master lock", self.owner, "took" if acquired else "lost")
        self.is_master = acquired
        # Renew at about a third of the TTL, jittered so workers do not renew in lockstep.
        self._renew_due = now + self.ttl / 3 * random.uniform(0.8, 1.0)
        return acquired

    def release(self) -> None:
        if not self.is_master:
            return
        self.is_master = False
        metrics.set_master(False)
        try:
            self.storage.release_lock(MASTER_LOCK_NAME, self.owner)
        except Exception:
            logger.exception("master lock: could not release (it will expire)")
            drop_unusable_connections()


class ShardLocks:
    """The chore locks of shards 1..N-1 of a storage whose chores split into N shards
    (``chore_shards``; shard 0's lock is the master lock). Each worker holds about its share,
    N over the live workers of the registry, so the shards' chores spread over them and one
    worker's round does not grow with N.

    Every round (a third of the TTL, jittered) a worker renews what it holds up to its share,
    gives up the rest (not taken again by it for a TTL, so that a worker below its share gets
    it), and takes free locks while below its share. A lock free for a whole TTL is taken by
    any worker, whatever its share: a dead worker still counted live (until its heartbeats
    are missed) cannot keep its shards' chores from running beyond that."""

    def __init__(
        self, storage: TaskStorage, owner: str, ttl_seconds: float, live_seconds: float
    ) -> None:
        self.storage = storage
        self.owner = owner
        self.ttl = ttl_seconds
        self.live_seconds = live_seconds
        self.names = {shard: chore_lock_name(shard) for shard in range(1, storage.chore_shards)}
        self.held: frozenset[int] = frozenset()
        self.reachable = True
        self._round_due = 0.0
        self._free_since: dict[int, float] = {}
        self._given_up_at: dict[int, float] = {}

    def hold(self, is_master: bool) -> frozenset[int]:
        """Take, renew or give up shard locks when due; returns the shards whose locks this
        worker holds now (not shard 0, the master's)."""
        now = time.monotonic()
        if not self.names or now < self._round_due:
            return self.held
        self._round_due = now + self.ttl / 3 * random.uniform(0.8, 1.0)
        try:
            held = with_reconnect(lambda: self._round(now, is_master))
            self.reachable = True
        except Exception:
            logger.exception("chore locks: storage error, giving up the shards' chores")
            held = frozenset()
            self.reachable = False
            drop_unusable_connections()
        if held != self.held:
            logger.info(
                "worker %s holds the chore locks of shards %s",
                self.owner,
                ", ".join(map(str, sorted(held))) or "none",
            )
        self.held = held
        return held

    def _round(self, now: float, is_master: bool) -> frozenset[int]:
        storage = self.storage
        owners = storage.lock_owners(list(self.names.values()))
        seen_since = storage.clock.now() - dt.timedelta(seconds=self.live_seconds)
        live = {w.worker_id for w in storage.workers() if w.last_seen_at >= seen_since}
        share = -(-(len(self.names) + 1) // len(live | {self.owner}))  # ceil
        room = share - int(is_master)
        mine = sorted(s for s, name in self.names.items() if owners[name] == self.owner)
        held: set[int] = set()
        for shard in mine:
            if len(held) < room and storage.acquire_lock(self.names[shard], self.owner, self.ttl):
                held.add(shard)
            elif shard not in held:
                storage.release_lock(self.names[shard], self.owner)
                self._given_up_at[shard] = now
        free = [s for s, name in self.names.items() if owners[name] is None]
        self._free_since = {s: self._free_since.get(s, now) for s in free}
        for shard in sorted(free, key=self._free_since.__getitem__):
            if now - self._given_up_at.get(shard, -self.ttl) < self.ttl:
                continue
            wanted = len(held) < room or now - self._free_since[shard] >= self.ttl
            if wanted and storage.acquire_lock(self.names[shard], self.owner, self.ttl):
                held.add(shard)
        return frozenset(held)

    def release(self) -> None:
        held, self.held = self.held, frozenset()
        for shard in sorted(held):
            try:
                self.storage.release_lock(self.names[shard], self.owner)
            except Exception:
                logger.exception("chore locks: could not release shard %d (it expires)", shard)
                drop_unusable_connections()
                return
