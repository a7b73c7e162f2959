"""The master lock and the live-worker registry of the database storage."""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction
from django.db.models import Q

from ...models import ReliableLock, ReliableWorker
from ...records import WorkerInfo
from .access import DatabaseAccess


class Leases(DatabaseAccess):
    """Named leases taken by conditional UPDATE; worker rows kept fresh by heartbeats."""

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

    def worker_seen(self, worker_id: str, info: dict[str, object]) -> None:
        now = self.clock.now()
        workers = ReliableWorker.objects.using(self.alias)
        if workers.filter(pk=worker_id).update(last_seen_at=now):
            return
        try:
            with transaction.atomic(using=self.alias):
                workers.create(
                    worker_id=worker_id,
                    hostname=str(info.get("hostname", "")),
                    pid=int(info.get("pid", 0)),  # type: ignore[call-overload]
                    queues=",".join(info.get("queues", [])),  # type: ignore[arg-type]
                    started_at=now,
                    last_seen_at=now,
                )
        except IntegrityError:
            workers.filter(pk=worker_id).update(last_seen_at=now)

    def worker_gone(self, worker_id: str) -> None:
        ReliableWorker.objects.using(self.alias).filter(pk=worker_id).delete()

    def workers(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                worker_id=row.worker_id,
                hostname=row.hostname,
                pid=row.pid,
                queues=tuple(q for q in row.queues.split(",") if q),
                started_at=row.started_at,
                last_seen_at=row.last_seen_at,
            )
            for row in ReliableWorker.objects.using(self.alias).order_by("pk")
        ]

    def forget_workers(self, seen_before: dt.datetime) -> int:
        workers = ReliableWorker.objects.using(self.alias)
        return workers.filter(last_seen_at__lt=seen_before).delete()[0]
