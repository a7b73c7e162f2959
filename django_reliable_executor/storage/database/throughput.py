"""Reading for the admin's summary on the database storage: tasks ended per minute, oldest due."""

from __future__ import annotations

import datetime as dt

from django.db.models import Count, Min
from django.db.models.functions import TruncMinute

from ...core.minute_counts import UTC, MinuteCounts, epoch_minute, minute_start
from ...core.states import DEAD_LETTER_STATUSES, TaskStatus
from ...models import ReliableRetryCount
from .access import DatabaseAccess

COUNTED_STATUSES = sorted([TaskStatus.COMPLETED.value, *(s.value for s in DEAD_LETTER_STATUSES)])


class ThroughputReading(DatabaseAccess):
    """_minute_counts (TaskStorage.throughput) and oldest_due_by_queue: queries only."""

    def _minute_counts(self, first: int, last: int) -> dict[int, MinuteCounts]:
        """Two queries: the finished tasks of the window grouped by minute and status (a range
        of the finished index, which holds both: no row is read), and the retry counts of its
        minutes (a primary key range)."""
        counts: dict[int, dict[str, int]] = {}
        rows = (
            self._tasks()
            .filter(
                finished_at__gte=minute_start(first),
                finished_at__lt=minute_start(last + 1),
                status__in=COUNTED_STATUSES,
            )
            .annotate(at=TruncMinute("finished_at", tzinfo=UTC))
            .order_by()
            .values("at", "status")
            .annotate(n=Count("*"))  # not COUNT(task_id): the index alone answers COUNT(*)
        )
        for row in rows:
            at = row["at"]
            if at.tzinfo is None:  # backends without time zone support hand back naive UTC
                at = at.replace(tzinfo=UTC)
            minute = counts.setdefault(epoch_minute(at), {})
            minute[row["status"]] = minute.get(row["status"], 0) + row["n"]
        retries = (
            ReliableRetryCount.objects.using(self.alias)
            .filter(minute__gte=first, minute__lte=last)
            .values_list("minute", "retried")
        )
        for minute_number, retried in retries:
            counts.setdefault(minute_number, {})["RETRIED"] = retried
        return {
            minute: MinuteCounts(
                minute=minute_start(minute),
                completed=n.get(TaskStatus.COMPLETED.value, 0),
                failed=sum(n.get(s.value, 0) for s in DEAD_LETTER_STATUSES),
                retried=n.get("RETRIED", 0),
            )
            for minute, n in counts.items()
        }

    def oldest_due_by_queue(self) -> dict[str, dt.datetime]:
        """One GROUP BY over the waiting, unclaimed tasks that are due (the claim index)."""
        rows = (
            self._tasks()
            # "IN (true)", not "= true": Django writes the latter as a bare "available" on
            # SQLite, which then scans the (queue, status) index instead of the claim index
            # (1M tasks: 5 s instead of 50 ms).
            .filter(available__in=[True], run_at__lte=self.clock.now())
            .order_by()
            .values("queue")
            .annotate(oldest=Min("run_at"))
        )
        return {row["queue"]: row["oldest"] for row in sorted(rows, key=lambda r: r["queue"])}
