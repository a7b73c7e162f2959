"""The master lock: acquire, renew well before expiry, give up on error, release on stop."""

from __future__ import annotations

import logging
import random
import time

from . import metrics
from .connections import drop_unusable_connections, with_reconnect
from .storage.base import MASTER_LOCK_NAME, TaskStorage

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
