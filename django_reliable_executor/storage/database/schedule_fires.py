"""Firing due schedules in the database storage: the schedules locked, moved on and their tasks
stored in one transaction, a run whose previous one is still live skipped (overlap="skip")."""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Sequence

from django.db import connections, transaction
from django.db.models import Q

from ...conf import get_settings
from ...core.parameter_index import with_entries
from ...core.records import TaskInfo
from ...schedules.records import ScheduleFire
from .access import DatabaseAccess
from .rows import LIVE


class ScheduleFires(DatabaseAccess):
    """fire_schedules: what the master's schedule firing stores (master/schedule_firing.py)."""

    def fire_schedules(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]] | None = None,
    ) -> builtins.list[TaskInfo]:
        if not fires:
            return []
        skips: builtins.list[tuple[str, str, int]] = []

        def fire() -> builtins.list[TaskInfo]:
            skips.clear()  # a deadlock retry runs the whole transaction again
            return self._fire(fires, now, skips)

        created = self._retrying(fire)
        if overlapped is not None:
            overlapped.extend(skips)
        return created

    def _fire(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]],
    ) -> builtins.list[TaskInfo]:
        by_id = {fire.schedule_id: fire for fire in fires}
        with transaction.atomic(using=self.alias):
            # Lock the schedules first (in id order, so two masters cannot deadlock), then
            # keep only the fires whose schedule still expects them: a schedule paused,
            # redefined or already fired by another master meanwhile is left alone. (SQLite
            # has no FOR UPDATE; its writers take turns, and a stale read fails the commit.)
            rows = (
                self._schedules()
                .select_for_update()
                .filter(pk__in=sorted(by_id))
                .order_by("pk")
                .values_list("schedule_id", "next_run_at", "paused", "last_task_id")
            )
            hits: builtins.list[ScheduleFire] = []
            previous: dict[str, str] = {}  # overlap="skip" fires: schedule id -> previous run
            for schedule_id, next_run_at, paused, last_task_id in rows:
                fire = by_id[schedule_id]
                if paused or next_run_at != fire.expected_next_run_at:
                    continue
                hits.append(fire)
                if fire.overlap == "skip" and fire.tasks and last_task_id:
                    previous[schedule_id] = last_task_id
            running = self._still_running(previous)
            skipped = [fire for fire in hits if fire.schedule_id in running]
            hits = [fire for fire in hits if fire.schedule_id not in running]
            self._skip_overlapping(skipped, now)
            overlapped += [(f.schedule_id, running[f.schedule_id], len(f.tasks)) for f in skipped]
            if hits:
                self._move_on(hits)
            # A run gets its parameter index rows here: no submit prepared it (fire_task).
            keys = get_settings().SEARCHABLE_PARAMETERS
            tasks = [with_entries(task, keys) for fire in hits for task in fire.tasks]
            if not tasks:
                return []
            return [info for info, created in self._enqueue(tasks) if created]

    def _move_on(self, hits: Sequence[ScheduleFire]) -> None:
        """Set the fired schedules' next run, and their latest run where they fired one."""
        with connections[self.alias].cursor() as cursor:
            cursor.executemany(
                f"UPDATE {self._schedule_table} SET next_run_at = %s, last_run_at = COALESCE(%s, "
                "last_run_at), last_task_id = COALESCE(%s, last_task_id) "
                "WHERE schedule_id = %s",
                [
                    (
                        self._dt(fire.next_run_at),
                        None if fire.last_run_at is None else self._dt(fire.last_run_at),
                        fire.last_task_id,
                        fire.schedule_id,
                    )
                    for fire in hits
                ],
            )

    def _still_running(self, previous: dict[str, str]) -> dict[str, str]:
        """Of ``{schedule id: its previous run's task id}``, those whose task has not ended: not
        terminal, or terminal while its timed-out handler runs on (its lease kept). A task
        purged since has ended by then."""
        if not previous:
            return {}
        not_ended = Q(status__in=LIVE) | Q(lease_expires_at__isnull=False)
        live = set(
            self._tasks()
            .filter(not_ended, pk__in=sorted(set(previous.values())))
            .values_list("pk", flat=True)
        )
        return {schedule: task_id for schedule, task_id in previous.items() if task_id in live}

    def _skip_overlapping(self, fires: Sequence[ScheduleFire], now: dt.datetime) -> None:
        """Move these schedules on without firing: their previous run is still live."""
        if not fires:
            return
        with connections[self.alias].cursor() as cursor:
            cursor.executemany(
                f"UPDATE {self._schedule_table} SET next_run_at = %s, "
                "overlap_skipped = overlap_skipped + %s, last_skipped_at = %s "
                "WHERE schedule_id = %s",
                [
                    (self._dt(fire.next_run_at), len(fire.tasks), self._dt(now), fire.schedule_id)
                    for fire in fires
                ],
            )
