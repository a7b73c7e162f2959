"""Schedules in the database storage: the schedule table, and fires in one transaction."""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Sequence

from django.db import transaction

from ...models import ReliableSchedule
from ...schedules.records import DEFINITION_FIELDS, ScheduleInfo
from .rows import chunks
from .schedule_skips import ScheduleSkips

_MICRO = dt.timedelta(microseconds=1)
# Definition fields as model columns (``every`` is stored in microseconds).
_DEFINITION_COLUMNS = [
    "every_micros" if name == "every" else name for name in DEFINITION_FIELDS
] + ["updated_at"]


def schedule_from_row(row: ReliableSchedule) -> ScheduleInfo:
    return ScheduleInfo(
        schedule_id=row.schedule_id,
        task_name=row.task_name,
        parameter=row.parameter,
        every=None if row.every_micros is None else dt.timedelta(microseconds=row.every_micros),
        cron=row.cron,
        timezone=row.timezone,
        start_at=row.start_at,
        misfire=row.misfire,
        queue=row.queue,
        priority=row.priority,
        retry_limit=row.retry_limit,
        retry_interval=row.retry_interval,
        retry_backoff=row.retry_backoff,
        max_duration_millis=row.max_duration_millis,
        paused=row.paused,
        next_run_at=row.next_run_at,
        last_run_at=row.last_run_at,
        last_task_id=row.last_task_id,
        origin=row.origin,
        created_at=row.created_at,
        updated_at=row.updated_at,
        overlap=row.overlap,
        overlap_skipped=row.overlap_skipped,
        last_skipped_at=row.last_skipped_at,
    )


def row_from_schedule(info: ScheduleInfo) -> ReliableSchedule:
    return ReliableSchedule(
        schedule_id=info.schedule_id,
        task_name=info.task_name,
        parameter=info.parameter,
        every_micros=None if info.every is None else info.every // _MICRO,
        cron=info.cron,
        timezone=info.timezone,
        start_at=info.start_at,
        misfire=info.misfire,
        queue=info.queue,
        priority=info.priority,
        retry_limit=info.retry_limit,
        retry_interval=info.retry_interval,
        retry_backoff=info.retry_backoff,
        max_duration_millis=info.max_duration_millis,
        paused=info.paused,
        next_run_at=info.next_run_at,
        last_run_at=info.last_run_at,
        last_task_id=info.last_task_id,
        origin=info.origin,
        created_at=info.created_at,
        updated_at=info.updated_at,
        overlap=info.overlap,
        overlap_skipped=info.overlap_skipped,
        last_skipped_at=info.last_skipped_at,
    )


class Schedules(ScheduleSkips):
    """The ``reliable_executor_schedule`` table; fires store tasks and advance schedules in
    one transaction."""

    def _save_schedules(
        self, schedules: Sequence[ScheduleInfo], keep: set[str], anchored: set[str]
    ) -> None:
        with transaction.atomic(using=self.alias):
            for chunk in chunks(list(schedules)):
                ids = [info.schedule_id for info in chunk]
                existing = {
                    pk: timing
                    for pk, *timing in self._schedules()
                    .select_for_update()
                    .filter(pk__in=ids)
                    .values_list("pk", "every_micros", "cron", "timezone")
                }
                self._schedules().bulk_create(
                    [row_from_schedule(i) for i in chunk if i.schedule_id not in existing]
                )
                for info in chunk:
                    if info.schedule_id not in existing:
                        continue
                    row = row_from_schedule(info)
                    columns = list(_DEFINITION_COLUMNS)
                    if info.schedule_id in anchored and existing[info.schedule_id] == [
                        row.every_micros,
                        row.cron,
                        row.timezone,
                    ]:
                        # Saved by another process after this caller read: its grid stays.
                        columns.remove("start_at")
                    elif info.schedule_id not in keep:
                        columns.append("next_run_at")
                    self._schedules().filter(pk=info.schedule_id).update(
                        **{column: getattr(row, column) for column in columns}
                    )

    def get_schedules(self, schedule_ids: Sequence[str]) -> dict[str, ScheduleInfo]:
        found: dict[str, ScheduleInfo] = {}
        for chunk in chunks(list(schedule_ids)):
            for row in self._schedules().filter(pk__in=chunk):
                found[row.pk] = schedule_from_row(row)
        return found

    def list_schedules(
        self, *, limit: int = 100, offset: int = 0, paused: bool | None = None
    ) -> builtins.list[ScheduleInfo]:
        rows = self._schedules().order_by("schedule_id")
        if paused is not None:
            rows = rows.filter(paused=paused)
        return [schedule_from_row(row) for row in rows[offset : offset + limit]]

    def count_schedules(self) -> dict[str, int]:
        paused = self._schedules().filter(paused=True).count()
        return {"active": self._schedules().count() - paused, "paused": paused}

    def delete_schedule(self, schedule_id: str) -> bool:
        deleted, _ = self._schedules().filter(pk=schedule_id).delete()
        return deleted > 0

    def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: dt.datetime
    ) -> ScheduleInfo | None:
        with transaction.atomic(using=self.alias):
            self._schedules().filter(pk=schedule_id).exclude(paused=paused).update(
                paused=paused, updated_at=now
            )
            row = self._schedules().filter(pk=schedule_id).first()
        return None if row is None else schedule_from_row(row)

    def due_schedules(self, now: dt.datetime, limit: int) -> builtins.list[ScheduleInfo]:
        rows = self._schedules().filter(paused=False, next_run_at__lte=now)
        return [schedule_from_row(row) for row in rows.order_by("next_run_at")[:limit]]

    def next_schedule_due(self) -> dt.datetime | None:
        row = self._schedules().filter(paused=False).order_by("next_run_at").first()
        return None if row is None else row.next_run_at
