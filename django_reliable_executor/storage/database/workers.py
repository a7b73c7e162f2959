"""The live-worker registry of the database storage: a row per worker, kept fresh by heartbeats."""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction

from ...core.records import WorkerInfo
from ...models import ReliableWorker
from .access import DatabaseAccess


class Workers(DatabaseAccess):
    """worker_seen, worker_gone, workers, worker_last_seen, forget_workers over
    ``reliable_executor_worker``."""

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

    def worker_last_seen(self, worker_id: str) -> dt.datetime | None:
        workers = ReliableWorker.objects.using(self.alias).filter(pk=worker_id)
        return workers.values_list("last_seen_at", flat=True).first()

    def forget_workers(self, seen_before: dt.datetime) -> int:
        workers = ReliableWorker.objects.using(self.alias)
        return workers.filter(last_seen_at__lt=seen_before).delete()[0]
