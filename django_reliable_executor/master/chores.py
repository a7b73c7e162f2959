"""The master's chores, each idempotent and bounded per round: fire due schedules, promote due
tasks, recover expired leases, time out tasks past their max duration, purge finished tasks and
batches past retention."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Literal, Protocol

from ..core.records import Transition
from ..service.reliable_executor import ReliableExecutor
from ..storage.base import TaskStorage
from .schedule_firing import ScheduleFiring

logger = logging.getLogger("django_reliable_executor")

ROWS_PER_ROUND = 500  # most tasks one chore handles per round (the rest: the next round)
PURGE_EVERY_SECONDS = 60.0
# The sweep of waits for tasks of other shards: a missed ending (a shard out of reach for
# seconds, at one precise moment) is rare, so its waiter may wait this long for it.
SETTLE_WAITS_EVERY_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Round:
    """What one round of chores runs on."""

    storage: TaskStorage  # the shards this worker holds the chore locks of (all: not sharded)
    everything: TaskStorage  # the whole storage, for the master's control duties
    shards: frozenset[int] | None  # None: every shard (or not sharded)
    master: bool  # this worker holds the master lock


class Chore(Protocol):
    """One chore: idempotent and bounded per round; True when it had more to do (a full round)."""

    def run(self, work: Round) -> bool: ...


class FireSchedules:
    """Fire the schedules that are due (the master only)."""

    def __init__(self, firing: ScheduleFiring) -> None:
        self.firing = firing

    def run(self, work: Round) -> bool:
        return self.firing.run_once() if work.master else False


class PromoteDue:
    """Make due the delayed tasks and retries whose time came (PENDING to claimable)."""

    def run(self, work: Round) -> bool:
        return work.storage.promote_due(ROWS_PER_ROUND) >= ROWS_PER_ROUND


class DeliverMessages:
    """Messages between a sharded Redis's shards that the writer could not deliver itself (it
    died, or the target was unreachable): at least once, applied once. One that cannot be
    applied stays in its outbox and holds up none of the other chores."""

    def run(self, work: Round) -> bool:
        try:
            return work.storage.deliver_messages(ROWS_PER_ROUND) >= ROWS_PER_ROUND
        except Exception:
            logger.exception("delivering messages between shards failed; they stay queued")
            return False


class SettleWaits:
    """Every SETTLE_WAITS_EVERY_SECONDS: a bounded step through the durable waits for tasks of
    other shards (sharded Redis; elsewhere a no-op), waking those whose tasks ended unseen."""

    def __init__(self) -> None:
        self._next = 0.0

    def run(self, work: Round) -> bool:
        if time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + SETTLE_WAITS_EVERY_SECONDS
        try:
            return work.storage.settle_waits(ROWS_PER_ROUND) >= ROWS_PER_ROUND
        except Exception:  # a shard out of reach: the next sweep tries again
            logger.exception("sweeping the waits for tasks of other shards failed")
            return False


class RecoverExpired:
    """Take back the tasks whose lease expired (their worker died or froze), once settling
    allows it (MasterChores.settle)."""

    def __init__(self, chores: MasterChores) -> None:
        self.chores = chores

    def run(self, work: Round) -> bool:
        self.chores.storage_reached()  # may settle: then recovery waits, from this round on
        settled = self.chores.recoverable(work.shards)
        if settled is False:
            return False
        if settled is None or settled == work.shards:
            recovered = work.storage.recover_expired(ROWS_PER_ROUND)
        else:
            recovered = work.everything.chores_on(settled).recover_expired(ROWS_PER_ROUND)
        for transition in recovered:
            self.chores.executor.announcer.transition(transition)
        return len(recovered) >= ROWS_PER_ROUND


class ExpireOverdue:
    """Time out the running tasks past their max duration."""

    def __init__(self, executor: ReliableExecutor) -> None:
        self.executor = executor

    def run(self, work: Round) -> bool:
        expired: list[Transition] = work.storage.expire_overdue(ROWS_PER_ROUND)
        for transition in expired:
            self.executor.announcer.transition(transition)
        return len(expired) >= ROWS_PER_ROUND


class PurgeFinished:
    """Every PURGE_EVERY_SECONDS (at once again while rounds come full): delete finished
    tasks past retention, then (the master) finished batches, and forget silent workers."""

    def __init__(
        self, executor: ReliableExecutor, retention_seconds: float, worker_ttl_seconds: float
    ) -> None:
        self.executor = executor
        self.retention_seconds = retention_seconds
        self.worker_ttl_seconds = worker_ttl_seconds
        self._next_purge = 0.0

    def run(self, work: Round) -> bool:
        if time.monotonic() < self._next_purge:
            return False
        cutoff = self.executor.clock.now() - dt.timedelta(seconds=self.retention_seconds)
        purged = work.storage.purge_finished(cutoff, ROWS_PER_ROUND)
        if purged:
            logger.info("purged %d finished tasks older than %s", purged, cutoff.isoformat())
        # Batches once the tasks are caught up: their members, finished before them, are
        # gone first, so a batch's member index is empty (or nearly) when it is dropped.
        everything = work.everything
        batches = (
            everything.purge_batches(cutoff, ROWS_PER_ROUND)
            if work.master and purged < ROWS_PER_ROUND
            else 0
        )
        if batches:
            logger.info("purged %d finished batches older than %s", batches, cutoff.isoformat())
        if work.master:
            silent_since = self.executor.clock.now() - dt.timedelta(seconds=self.worker_ttl_seconds)
            everything.forget_workers(silent_since)
        if purged >= ROWS_PER_ROUND or batches >= ROWS_PER_ROUND:
            return True
        self._next_purge = time.monotonic() + PURGE_EVERY_SECONDS
        return False


class MarkLimited:
    """Every PURGE_EVERY_SECONDS (the master): waiting tasks of a name that gained or lost its
    rate_limit or max_concurrency since they were stored (this process's registry says
    which) set right, so that the claim that takes them (by name, or of all other names)
    sees them."""

    def __init__(self) -> None:
        self._next_mark = 0.0

    def run(self, work: Round) -> bool:
        if not work.master or time.monotonic() < self._next_mark:
            return False
        everything = work.everything
        marked = everything.mark_limited(everything.flow_limits.names(), ROWS_PER_ROUND)
        if marked:
            logger.info("%d waiting tasks moved between the claims by name", marked)
        if marked >= ROWS_PER_ROUND:
            return True
        self._next_mark = time.monotonic() + PURGE_EVERY_SECONDS
        return False


class MasterChores:
    """The chores only the master (the holder of the master lock) runs, one round per call of
    ``run_once``; the storage's ``Chores`` part does each one atomically. Where the chores
    split into shards (``chore_shards``), the holder of a shard's chore lock runs that shard's
    promote, recover, expire and purge (master_lock.ShardLocks)."""

    def __init__(
        self,
        executor: ReliableExecutor,
        retention_seconds: float,
        worker_ttl_seconds: float = 120.0,
        settle_seconds: float = 0.0,
        outage_seconds: float = 0.0,
    ) -> None:
        self.executor = executor
        self.retention_seconds = retention_seconds
        self.worker_ttl_seconds = worker_ttl_seconds
        self.settle_seconds = settle_seconds
        self._recover_from = 0.0
        self._shard_recover_from: dict[int, float] = {}  # settle() of some shards only
        # Storage outages as this worker's lease writes (heartbeat, master lock) saw them.
        self.outage_seconds = outage_seconds
        self._outage_lock = threading.Lock()
        self._reached_at: float | None = None
        self._failing = False
        self.firing = ScheduleFiring(executor)
        self.chores: list[Chore] = [
            FireSchedules(self.firing),
            PromoteDue(),
            DeliverMessages(),
            SettleWaits(),
            RecoverExpired(self),
            ExpireOverdue(executor),
            PurgeFinished(executor, retention_seconds, worker_ttl_seconds),
            MarkLimited(),
        ]

    def settle(self, shards: frozenset[int] | None = None) -> None:
        """Hold lease recovery back for ``settle_seconds`` from now (on ``shards`` only, when
        given). Called when this worker becomes master, takes a shard's chore lock, or the
        storage is reachable again after an outage (``storage_reached``): live workers first
        get a heartbeat in, so their leases are not taken for expired just because nobody
        could renew them (which would re-run, or even fail, tasks whose handlers succeeded
        meanwhile)."""
        until = time.monotonic() + self.settle_seconds
        if shards is None:
            self._recover_from = until
        else:
            self._shard_recover_from.update(dict.fromkeys(shards, until))

    def storage_failed(self) -> None:
        """A lease write of this worker (heartbeat, master lock) failed."""
        with self._outage_lock:
            self._failing = True

    def storage_reached(self) -> None:
        """A lease write of this worker succeeded. When it is the first after failures that
        lasted ``outage_seconds`` or more since the last success (long enough for live workers'
        leases to lapse meanwhile), settle once. Only a success after such an outage settles,
        never an error: errors that keep coming, or writes that fail every other time, cannot
        push recovery back again and again."""
        now = time.monotonic()
        with self._outage_lock:
            outage = self._failing and (
                self._reached_at is None or now - self._reached_at >= self.outage_seconds
            )
            self._failing = False
            self._reached_at = now
        if outage:
            logger.info("storage reachable again: lease recovery waits for live workers to renew")
            self.settle()

    def run_once(self, shards: frozenset[int] | None = None, *, master: bool = True) -> bool:
        """One round of every chore, in order. Returns True when a chore had a full round (more work
        waits).

        ``shards``: those of the storage's ``chore_shards`` whose lock this worker holds (None:
        all of them); ``master``: it holds the master lock, so it runs the control duties too
        (schedules, batches, the worker registry)."""
        everything = self.executor.storage
        storage = everything if shards is None else everything.chores_on(shards)
        work = Round(storage, everything, shards, master)
        busy = False
        for chore in self.chores:
            busy = chore.run(work) or busy  # every chore runs, whatever the ones before found
        return busy

    def recoverable(self, shards: frozenset[int] | None) -> frozenset[int] | None | Literal[False]:
        """Which of ``shards`` lease recovery may run on now that settling is over: ``shards``
        itself (all of them), a part of them, or False for none (see settle)."""
        now = time.monotonic()
        if now < self._recover_from:
            return False
        if shards is None or not self._shard_recover_from:
            return shards
        settled = frozenset(s for s in shards if now >= self._shard_recover_from.get(s, 0))
        return settled if settled else False

    def seconds_to_next_schedule(self, longest: float) -> float:
        """How long the master may sleep before a schedule is due (at most ``longest``): the
        rounds then fire within milliseconds of the planned time, not up to a tick late."""
        next_due = self.firing.next_due()
        if next_due is None:
            return longest
        seconds = (next_due - self.executor.clock.now()).total_seconds()
        return min(max(seconds, 0.0), longest)
