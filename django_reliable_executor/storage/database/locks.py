"""The named leases of the database storage (the master lock), taken by conditional UPDATE."""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction
from django.db.models import Q

from ...models import ReliableLock
from .access import DatabaseAccess


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
