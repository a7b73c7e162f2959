"""The database storage's counts of runs skipped by a schedule's overlap policy, per UTC hour."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from contextlib import nullcontext

from django.db import DatabaseError, connections, transaction

from ...models import ReliableScheduleSkip
from ..schedule_base import SKIP_HOURS, epoch_hour, hour_start
from .access import DatabaseAccess

logger = logging.getLogger("django_reliable_executor")


class ScheduleSkips(DatabaseAccess):
    """``reliable_executor_schedule_skip``: a row per schedule and hour with skips, upserted
    by the master's round that skipped, rows older than a day deleted by the next one."""

    def add_schedule_skips(self, skips: Sequence[tuple[str, int]], now: dt.datetime) -> None:
        counted = [(schedule_id, n) for schedule_id, n in skips if n > 0]
        if not counted:
            return
        connection = connections[self.alias]
        table = connection.ops.quote_name(ReliableScheduleSkip._meta.db_table)
        if connection.vendor == "mysql":
            sql = (
                f"INSERT INTO {table} (schedule_id, hour, skipped) VALUES (%s, %s, %s) "
                "ON DUPLICATE KEY UPDATE skipped = skipped + VALUES(skipped)"
            )
        else:  # PostgreSQL, SQLite 3.24+
            sql = (
                f"INSERT INTO {table} (schedule_id, hour, skipped) VALUES (%s, %s, %s) "
                f"ON CONFLICT (schedule_id, hour) DO UPDATE "
                f"SET skipped = {table}.skipped + EXCLUDED.skipped"
            )
        hour = epoch_hour(now)
        # A savepoint inside a caller's transaction: a failed count must not break it.
        savepoint = (
            transaction.atomic(using=self.alias) if connection.in_atomic_block else nullcontext()
        )
        try:
            with savepoint, connection.cursor() as cursor:
                cursor.executemany(sql, [(sid, hour, n) for sid, n in counted])
            ReliableScheduleSkip.objects.using(self.alias).filter(
                hour__lt=hour - SKIP_HOURS
            ).delete()
        except DatabaseError as exc:
            logger.info("overlap skips of hour %s not counted: %s", hour, exc)

    def schedule_skips(self, schedule_id: str, since: dt.datetime) -> dict[dt.datetime, int]:
        rows = ReliableScheduleSkip.objects.using(self.alias).filter(
            schedule_id=schedule_id, hour__gte=epoch_hour(since)
        )
        return {hour_start(hour): n for hour, n in rows.values_list("hour", "skipped")}
