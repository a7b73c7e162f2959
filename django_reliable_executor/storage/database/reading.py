"""Reading tasks from the database storage: get, list, counts, has_work, rate_use, throughput."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from django.db import connections
from django.db.models import Count, Min, QuerySet
from django.db.models.functions import Left, Substr, TruncMinute

from ...core.ids import FIRE_ID_PATTERN, FIRE_TIME_PATTERN
from ...core.minute_counts import UTC, MinuteCounts, epoch_minute, minute_start
from ...core.queries import KeyUse, RateUse, TaskQuery, key_uses
from ...core.rate_limits import RateLimit
from ...core.records import TaskInfo, copy_with
from ...core.states import DEAD_LETTER_STATUSES, LIVE_STATUSES, TaskStatus
from ...core.task_count import TaskCount
from ...models import (
    ReliableDependency,
    ReliableRateLog,
    ReliableRetryCount,
    ReliableTask,
    ReliableTaskParameter,
    ReliableTaskTag,
    ReliableUniqueKey,
)
from .access import DatabaseAccess
from .parameter_rows import keeps_rows
from .parameter_search import parameter_filter, parameter_page
from .rows import (
    HELD_SQL,
    WAITING,
    chunks,
    to_info,
)
from .step_rows import steps_of

COUNTED_STATUSES = sorted([TaskStatus.COMPLETED.value, *(s.value for s in DEAD_LETTER_STATUSES)])


class Reading(DatabaseAccess):
    """Queries only; nothing here writes."""

    def unique_holder(self, unique_key: str) -> TaskInfo | None:
        now = self.clock.now()
        row = (
            ReliableUniqueKey.objects.using(self.alias)
            .filter(key=unique_key, expires_at__gt=now)
            .first()
        )
        holder = self.get(row.task_id) if row is not None else None
        if holder is None or not (holder.status in LIVE_STATUSES or holder.handler_running):
            return None
        return holder

    def dependents_of(self, task_id: str, limit: int | None = None) -> list[str]:
        """The tasks that were submitted to wait for ``task_id``, by id (the first ``limit``)."""
        rows = (
            ReliableDependency.objects.using(self.alias)
            .filter(dependency_id=task_id)
            .order_by("dependent_id")
            .values_list("dependent_id", flat=True)
        )
        return list(rows if limit is None else rows[: max(limit, 0)])

    def count_dependents(self, task_id: str) -> int:
        return ReliableDependency.objects.using(self.alias).filter(dependency_id=task_id).count()

    def get_many(self, task_ids: Sequence[str]) -> dict[str, TaskInfo]:
        found: dict[str, TaskInfo] = {}
        for chunk in chunks(list(task_ids)):
            found.update((row.pk, to_info(row)) for row in self._tasks().filter(pk__in=chunk))
        # Their durable steps: one more query per chunk (a listing leaves them out).
        for task_id, steps in steps_of(self.alias, list(found)).items():
            found[task_id] = copy_with(found[task_id], steps=steps)
        return found

    def _list(self, query: TaskQuery) -> list[TaskInfo]:
        qs = self._filtered(query)
        # Two steps: the page's ids from the index alone (an InnoDB secondary index holds the
        # primary key), then only those rows. Skipping ``offset`` tasks then reads index
        # entries, not rows: at 1M rows on MariaDB page 50 went from 18-350 ms to 5 ms and
        # page 500 from 5.8 s to 11 ms (bench/admin_list.py); PostgreSQL is unchanged.
        newest = qs.order_by("-created_at", "-task_id")
        if query.parameter is not None:
            ids = parameter_page(self.vendor, self.alias, newest, query)
        else:
            ids = list(newest.values_list("pk", flat=True)[query.offset : query.end])
        found = self.get_many(ids)  # in chunks: SQLite caps the parameters of one statement
        return [found[task_id] for task_id in ids if task_id in found]

    def _count_tasks(
        self, query: TaskQuery, cap: int, since: dt.datetime | None, until: dt.datetime | None
    ) -> TaskCount:
        """One COUNT over the list's own filters (``_filtered``), the parameter's included,
        of at most ``cap`` rows (a LIMIT inside: the database stops at the cap)."""
        qs = self._filtered(query)
        if query.parameter is not None:
            qs = qs.filter(parameter_filter(self.vendor, query.parameter))
        if since is not None:
            qs = qs.filter(created_at__gte=since)
        if until is not None:
            qs = qs.filter(created_at__lte=until)
        n = qs.order_by().values("pk")[:cap].count()
        return TaskCount(n, complete=n < cap)

    def _filtered(self, query: TaskQuery) -> QuerySet[ReliableTask]:
        """The tasks of every filter of ``query`` but its parameter, in no order."""
        qs = self._tasks()
        if query.statuses is not None and len(query.statuses) == 1:
            qs = qs.filter(status=next(iter(query.statuses)).value)
        elif query.statuses is not None:
            qs = qs.filter(status__in=sorted(s.value for s in query.statuses))
        if query.task_name is not None:
            qs = qs.filter(task_name=query.task_name)
        if query.queue is not None:
            qs = qs.filter(queue=query.queue)
        if query.batch_id is not None:
            qs = qs.filter(batch_id=query.batch_id)
        if query.tag is not None:
            # The tag's rows from the tag table's unique index (tag, task_id).
            tagged = ReliableTaskTag.objects.using(self.alias).filter(tag=query.tag)
            qs = qs.filter(pk__in=tagged.values("task_id"))
        for key, value in query.indexed if keeps_rows(self.vendor) else ():
            # The value's rows from the parameter index's unique index (key, value, task_id);
            # parameter_page checks every pair of the search on the rows they lead to.
            entries = ReliableTaskParameter.objects.using(self.alias).filter(key=key, value=value)
            qs = qs.filter(pk__in=entries.values("task_id"))
        if query.schedule_id is not None:
            # The id's first characters compared exactly (LIKE is case-blind on SQLite), the
            # rest matched as ASCII (MariaDB's REGEXP BINARY counts bytes, not characters).
            head = query.schedule_id + "@"
            qs = qs.annotate(
                run_head=Left("task_id", len(head)), run_time=Substr("task_id", len(head) + 1)
            ).filter(run_head=head, run_time__regex=FIRE_TIME_PATTERN)
        elif query.schedule_runs is True:
            qs = qs.filter(task_id__regex=FIRE_ID_PATTERN)
        elif query.schedule_runs is False:
            qs = qs.exclude(task_id__regex=FIRE_ID_PATTERN)
        return qs

    def count(self, queue: str | None = None) -> dict[TaskStatus, int]:
        qs = self._tasks()
        if queue is not None:
            qs = qs.filter(queue=queue)
        counts = {status: 0 for status in TaskStatus}
        for row in qs.order_by().values("status").annotate(n=Count("pk")):
            counts[TaskStatus(row["status"])] = row["n"]
        return counts

    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]:
        counts: dict[str, dict[TaskStatus, int]] = {}
        rows = self._tasks().order_by().values("queue", "status").annotate(n=Count("pk"))
        for row in rows:
            queue_counts = counts.setdefault(row["queue"], {status: 0 for status in TaskStatus})
            queue_counts[TaskStatus(row["status"])] = row["n"]
        return dict(sorted(counts.items()))

    def oldest_due(self, queue: str | None = None) -> dt.datetime | None:
        qs = self._tasks().filter(available=True, run_at__lte=self.clock.now())
        if queue is not None:
            qs = qs.filter(queue=queue)
        first = qs.order_by("run_at").values_list("run_at", flat=True).first()
        return first

    def has_work(self, queues: Sequence[str], horizon_seconds: float) -> bool:
        horizon = self.clock.now() + dt.timedelta(seconds=horizon_seconds)
        qs = self._tasks().filter(queue__in=list(queues))
        return (
            qs.filter(status=TaskStatus.RUNNING.value).exists()
            or qs.filter(status__in=WAITING, run_at__lte=horizon).exists()
        )

    def rate_use(self, limits: Mapping[str, RateLimit]) -> list[RateUse]:
        now = self.clock.now()
        table = connections[self.alias].ops.quote_name(ReliableRateLog._meta.db_table)
        uses = []
        with connections[self.alias].cursor() as cursor:
            for name, rate in limits.items():
                window_start = now - dt.timedelta(seconds=rate.window_seconds)
                log_start = now - dt.timedelta(seconds=rate.log_window_seconds)
                cursor.execute(
                    "SELECT rate_key, SUM(CASE WHEN claimed_at > %s THEN claims ELSE 0 END), "
                    f"SUM(claims) FROM {table} WHERE name = %s AND claimed_at > %s "
                    "GROUP BY rate_key",
                    [self._dt(window_start), name, self._dt(log_start)],
                )
                rows = [(key, int(recent or 0), int(n)) for key, recent, n in cursor.fetchall()]
                full = [key for key, _, n in rows if n >= rate.count]
                held = 0
                if full:
                    cursor.execute(
                        f"SELECT COUNT(*) FROM {self._table} WHERE available = %s "
                        "AND task_name = %s AND run_at <= %s AND COALESCE(rate_key, '') "
                        f"IN ({', '.join(['%s'] * len(full))})",
                        [True, name, self._dt(now), *full],
                    )
                    (held,) = cursor.fetchone()
                recent = [r for _, r, _ in rows]
                busiest = max(recent, default=0)
                keys = sum(1 for r in recent if r)
                uses.append(RateUse(name, rate, sum(recent), busiest, keys, int(held)))
        return uses

    def key_use(self, limits: Mapping[str, int]) -> list[KeyUse]:
        """One read: the held tasks with a key of these names, counted by name and key (the
        held tasks only, a handful per worker, read by the index of held tasks)."""
        if not limits:
            return []
        marks = ", ".join(["%s"] * len(limits))
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT task_name, concurrency_key, COUNT(*) FROM {self._table} "
                f"WHERE task_name IN ({marks}) AND concurrency_key IS NOT NULL AND (({HELD_SQL}) "
                "OR (status = %s AND available = %s AND lease_expires_at > %s)) "
                "GROUP BY task_name, concurrency_key",
                [*limits, TaskStatus.TIMEOUT.value, False, self._dt(self.clock.now())],
            )
            rows = cursor.fetchall()
        return key_uses(limits, [(name, key, int(n)) for name, key, n in rows])


class ThroughputReading(DatabaseAccess):
    """_minute_counts (TaskStorage.throughput), _completed_by_queue and oldest_due_by_queue:
    queries only."""

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

    def _completed_by_queue(
        self, queues: list[str], first: int, last: int
    ) -> dict[str, dict[int, int]]:
        """One query: the window's completed tasks of ``queues`` grouped by queue and minute, a
        range of the finished index, which holds the queue too (migration 0034): no row is
        read."""
        rows = (
            self._tasks()
            .filter(
                finished_at__gte=minute_start(first),
                finished_at__lt=minute_start(last + 1),
                status=TaskStatus.COMPLETED.value,
                queue__in=queues,
            )
            .annotate(at=TruncMinute("finished_at", tzinfo=UTC))
            .order_by()
            .values("queue", "at")
            .annotate(n=Count("*"))
        )
        counts: dict[str, dict[int, int]] = {}
        for row in rows:
            at = row["at"]
            if at.tzinfo is None:  # backends without time zone support hand back naive UTC
                at = at.replace(tzinfo=UTC)
            minutes = counts.setdefault(row["queue"], {})
            minute = epoch_minute(at)
            minutes[minute] = minutes.get(minute, 0) + row["n"]
        return counts

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
