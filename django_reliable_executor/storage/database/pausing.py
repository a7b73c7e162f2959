"""Paused queues on the database storage: a row each in reliable_executor_paused_queue."""

from __future__ import annotations

from django.db import transaction

from ...models import ReliablePausedQueue
from .access import DatabaseAccess


class Pausing(DatabaseAccess):
    """pause_queue, resume_queue, paused_queues. The claim leaves the paused queues out in
    its own statement (Claiming._pick_sql), so a pause holds from the next claim of every
    worker, with no cache to go stale."""

    def pause_queue(self, queue: str) -> bool:
        _, created = ReliablePausedQueue.objects.using(self.alias).get_or_create(
            queue=queue, defaults={"paused_at": self.clock.now()}
        )
        return created

    def resume_queue(self, queue: str) -> bool:
        with transaction.atomic(using=self.alias):
            deleted, _ = ReliablePausedQueue.objects.using(self.alias).filter(queue=queue).delete()
            if deleted:
                # Its waiting tasks are claimable again: wake idle workers as a submit does.
                self._work_committed([queue])
        return bool(deleted)

    def paused_queues(self) -> set[str]:
        return set(ReliablePausedQueue.objects.using(self.alias).values_list("queue", flat=True))
