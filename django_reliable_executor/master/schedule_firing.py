"""The master's schedule chore: fire due schedules in bounded rounds, as ordinary tasks."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from ..core.records import TaskInfo
from ..observability import metrics
from ..schedules.planning import fire_task

__all__ = ["SCHEDULES_PER_ROUND", "MAX_TASKS_PER_ROUND", "ScheduleFiring", "fire_task"]

if TYPE_CHECKING:
    from ..service.reliable_executor import ReliableExecutor

logger = logging.getLogger("django_reliable_executor")

SCHEDULES_PER_ROUND = 1000  # schedules planned and fired per round
MAX_TASKS_PER_ROUND = 5000  # catch-ups can plan many runs per schedule: the rest waits a round


class ScheduleFiring:
    """One round: read up to SCHEDULES_PER_ROUND due schedules, plan each by its misfire
    policy, store the runs' tasks and move the schedules on. Safe to run on two masters at once (see
    ``fire_schedules``); only the master runs it."""

    def __init__(self, executor: ReliableExecutor, per_round: int = SCHEDULES_PER_ROUND) -> None:
        self.executor = executor
        self.per_round = per_round

    def run_once(self) -> bool:
        """Fire what is due. True when the round was full (more is due: go again at once)."""
        return self.fire_due()[1] >= self.per_round

    def fire_due(self) -> tuple[list[TaskInfo], int]:
        """One round: the tasks it newly stored, and how many schedules were due (reported
        as a full round when it stopped early at MAX_TASKS_PER_ROUND)."""
        executor = self.executor
        settings = executor.settings
        now = executor.clock.now()
        round_ = executor.storage.fire_due(
            now,
            self.per_round,
            grace=dt.timedelta(seconds=settings.SCHEDULE_MISFIRE_GRACE),
            catch_up_limit=settings.SCHEDULE_CATCH_UP_LIMIT,
            max_tasks=MAX_TASKS_PER_ROUND,
        )
        for schedule_id, error in round_.paused:
            # A definition that no longer plans (say, a time zone gone from the system's
            # database) would be due forever, ahead of the others: paused, visibly.
            logger.error(
                "schedule %s cannot be planned: paused (fix it, then resume it)",
                schedule_id,
                exc_info=(type(error), error, error.__traceback__),
            )
        for schedule_id, count, misfire in round_.skipped:
            logger.warning(
                "schedule %s missed %d run(s) before %s (misfire=%s): not fired",
                schedule_id,
                count,
                now.isoformat(),
                misfire,
            )
            metrics.count_schedule_skipped(count)
        for schedule_id, task_id, count in round_.overlapped:
            logger.warning(
                "schedule %s: %d run(s) due at %s not fired: its previous run %s is not "
                "finished (overlap=skip)",
                schedule_id,
                count,
                now.isoformat(),
                task_id,
            )
            metrics.count_schedule_overlap_skipped(count)
        if round_.overlapped:
            self._count_skips(round_.overlapped, now)
        created = round_.created
        if created:
            metrics.count_schedule_fired([(now - task.run_at).total_seconds() for task in created])
            executor.announcer.submitted(created)
        return created, round_.due

    def _count_skips(self, overlapped: list[tuple[str, str, int]], now: dt.datetime) -> None:
        """Count the round's overlap skips per schedule and hour (the schedule pages' last 24
        hours). Statistics: the round stored its fires already, a failed count must not
        fail it (the next round would fire nothing more, and count nothing either)."""
        try:
            self.executor.storage.add_schedule_skips(
                [(schedule_id, count) for schedule_id, _, count in overlapped], now
            )
        except Exception as exc:
            logger.info("overlap skips of %d schedule(s) not counted: %s", len(overlapped), exc)

    def next_due(self) -> dt.datetime | None:
        """When the earliest active schedule is due next."""
        return self.executor.storage.next_schedule_due()
