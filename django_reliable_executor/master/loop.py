"""MasterLoop: the worker's chores thread. Each tick it holds (or tries to take) the master
lock and, on a sharded storage, the chore locks of shards, and runs the chores of what it
holds; once per start it saves the schedules declared in code."""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, close_old_connections

from ..connections import drop_unusable_connections
from ..exceptions import ReliableExecutorError, StorageUnavailableError
from ..registry import declared_schedules
from ..service.reliable_executor import ReliableExecutor
from .chores import MasterChores
from .lock import MasterLock, ShardLocks

logger = logging.getLogger("django_reliable_executor")


class MasterLoop:
    """The master's duty as one worker runs it: ``run()`` until ``done`` is set."""

    def __init__(
        self,
        executor: ReliableExecutor,
        worker_id: str,
        *,
        lease_timeout: float,
        master_lock_ttl: float,
        finished_retention: float,
        heartbeat_interval: float,
        done: threading.Event,
    ) -> None:
        self.executor = executor
        self.master_lock_ttl = master_lock_ttl
        self.done = done
        self.master = MasterLock(executor.storage, worker_id, master_lock_ttl)
        # Chores split into shards (a sharded Redis storage): the other shards' chore locks.
        self.shard_locks = (
            ShardLocks(
                executor.storage,
                worker_id,
                master_lock_ttl,
                live_seconds=heartbeat_interval * 3,
            )
            if executor.storage.chore_shards > 1
            else None
        )
        self.chores = MasterChores(
            executor,
            finished_retention,
            max(lease_timeout * 2, 60.0),
            # Long enough for every live worker's heartbeat to come round once more.
            settle_seconds=heartbeat_interval * 1.5,
            # An outage this long can let a live worker's lease lapse (its last renewal came
            # up to a heartbeat interval before the outage, its next one up to one after).
            outage_seconds=lease_timeout / 2,
        )

    def run(self) -> None:
        tick = min(1.0, self.master_lock_ttl / 4)
        was_master = False
        had: frozenset[int] = frozenset()  # the chore shards whose locks were held last round
        synced = False
        while not self.done.is_set():
            busy = False
            wait = tick
            if not synced:
                synced = self.sync_declared_schedules()
            try:
                is_master = self.master.hold()
                if not self.master.reachable:
                    self.chores.storage_failed()
                if self.shard_locks is None:
                    if is_master and not was_master:
                        self.chores.settle()
                    was_master = is_master
                    if is_master:
                        busy = self.chores.run_once()
                        wait = self.chores.seconds_to_next_schedule(tick)
                else:
                    busy, had = self._sharded_round(is_master, had)
                    if is_master:
                        wait = self.chores.seconds_to_next_schedule(tick)
            except Exception:
                logger.exception("chores round failed")
                # No settle here: recovery is held back once the storage is reached again
                # (storage_reached), so errors that keep coming cannot postpone it forever.
                self.chores.storage_failed()
                drop_unusable_connections()
            self.done.wait(0.01 if busy else max(wait, 0.001))
        close_old_connections()

    def _sharded_round(self, is_master: bool, had: frozenset[int]) -> tuple[bool, frozenset[int]]:
        """Hold the shards' chore locks and run the chores of those held (shard 0 with the
        master lock); returns whether a batch was full, and the shards held."""
        assert self.shard_locks is not None
        held = self.shard_locks.hold(is_master)
        if not self.shard_locks.reachable:
            self.chores.storage_failed()
        shards = held | {0} if is_master else held
        if shards - had:  # recovery on a shard just taken waits for heartbeats
            self.chores.settle(shards - had)
        busy = self.chores.run_once(shards, master=is_master) if shards else False
        return busy, shards

    def release(self) -> None:
        """Give up the locks this worker holds, so that another takes over at once."""
        self.master.release()
        if self.shard_locks is not None:
            self.shard_locks.release()

    def sync_declared_schedules(self) -> bool:
        """Save the schedules declared in code, once per start. False to try again next round
        (the storage could not be reached); a definition the storage refuses is logged and
        not tried again — it must never keep this worker from its chores."""
        try:
            written = self.executor.sync_declared_schedules()
        except ReliableExecutorError as exc:
            if isinstance(exc, StorageUnavailableError):
                logger.warning("cannot save the schedules declared in code yet: %s", exc)
                return False
            logger.error("the schedules declared in code were not saved: %s", exc)
            return True
        except DatabaseError as exc:
            logger.warning("cannot save the schedules declared in code yet: %s", exc)
            drop_unusable_connections()
            return False
        if written:
            logger.info(
                "saved %d schedule(s) declared in code: %s",
                written,
                ", ".join(str(spec.schedule_id) for spec in declared_schedules()),
            )
        return True
