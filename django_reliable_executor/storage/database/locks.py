"""The named leases of the database storage (the master lock), taken by conditional UPDATE,
and the API's one-time nonces, rows of reliable_executor_api_nonce."""

from __future__ import annotations

import datetime as dt
import threading
import time

from django.db import IntegrityError, transaction
from django.db.models import Q

from ...models import ReliableApiNonce, ReliableLock
from .access import DatabaseAccess

PURGE_EVERY = 60.0  # seconds between purges of expired nonce rows, per process
_purge_lock = threading.Lock()
_last_purge = 0.0


class Locks(DatabaseAccess):
    """Named leases: a row per name, taken by conditional UPDATE or a first INSERT."""

    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        now = self.clock.now()
        expires = now + dt.timedelta(seconds=ttl_seconds)
        locks = ReliableLock.objects.using(self.alias)
        if locks.filter(Q(owner=owner) | Q(expires_at__lt=now), name=name).update(
            owner=owner, expires_at=expires
        ):
            return True
        try:
            with transaction.atomic(using=self.alias):
                locks.create(name=name, owner=owner, expires_at=expires)
            return True
        except IntegrityError:
            return False

    def release_lock(self, name: str, owner: str) -> None:
        ReliableLock.objects.using(self.alias).filter(name=name, owner=owner).update(
            owner="", expires_at=self.clock.now() - dt.timedelta(seconds=1)
        )

    def lock_owner(self, name: str) -> str | None:
        row = ReliableLock.objects.using(self.alias).filter(name=name).first()
        if row is None or not row.owner or row.expires_at < self.clock.now():
            return None
        return row.owner

    def spend_nonce(self, name: str, ttl_seconds: float) -> bool:
        # Wall time, not self.clock: a nonce's window is the signed request's, in real time.
        now = dt.datetime.now(dt.timezone.utc)
        _purge_expired(self.alias, now)
        rows = ReliableApiNonce.objects.using(self.alias)
        expires_at = now + dt.timedelta(seconds=ttl_seconds)
        for _ in range(2):
            try:
                with transaction.atomic(using=self.alias):
                    rows.create(key=name, expires_at=expires_at)
                return True
            except IntegrityError:
                # Taken, unless only by an expired row the purge has not reached yet.
                if not rows.filter(key=name, expires_at__lte=now).delete()[0]:
                    return False
        return False


def _purge_expired(alias: str, now: dt.datetime) -> None:
    """Delete expired nonce rows, at most once every PURGE_EVERY seconds in this process."""
    global _last_purge
    with _purge_lock:
        if time.monotonic() - _last_purge < PURGE_EVERY and _last_purge:
            return
        _last_purge = time.monotonic()
    ReliableApiNonce.objects.using(alias).filter(expires_at__lte=now).delete()
