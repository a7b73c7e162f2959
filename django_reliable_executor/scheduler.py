"""Leader-only chores, each idempotent and bounded per round: promote due tasks, recover expired
leases, time out tasks past their max duration, purge finished tasks past retention."""

from __future__ import annotations

import datetime as dt
import logging
import time

from .service import ReliableExecutor

logger = logging.getLogger("django_reliable_executor")

BATCH = 500
PURGE_EVERY_SECONDS = 60.0


class Scheduler:
    def __init__(
        self,
        executor: ReliableExecutor,
        retention_seconds: float,
        worker_ttl_seconds: float = 120.0,
    ) -> None:
        self.executor = executor
        self.retention_seconds = retention_seconds
        self.worker_ttl_seconds = worker_ttl_seconds
        self._next_purge = 0.0

    def run_once(self) -> bool:
        """One round of every chore. Returns True when a batch was full (more work waits)."""
        storage = self.executor.storage
        busy = storage.promote_due(BATCH) >= BATCH
        recovered = storage.recover_expired(BATCH)
        for transition in recovered:
            self.executor.announce(transition)
        expired = storage.expire_overdue(BATCH)
        for transition in expired:
            self.executor.announce(transition)
        busy = busy or len(recovered) >= BATCH or len(expired) >= BATCH
        if time.monotonic() >= self._next_purge:
            cutoff = self.executor.clock.now() - dt.timedelta(seconds=self.retention_seconds)
            purged = storage.purge_finished(cutoff, BATCH)
            if purged:
                logger.info("purged %d finished tasks older than %s", purged, cutoff.isoformat())
            silent_since = self.executor.clock.now() - dt.timedelta(seconds=self.worker_ttl_seconds)
            storage.forget_workers(silent_since)
            if purged >= BATCH:
                busy = True
            else:
                self._next_purge = time.monotonic() + PURGE_EVERY_SECONDS
        return busy
