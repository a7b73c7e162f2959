"""The master's schedule chore: fire due schedules in bounded batches, as ordinary tasks."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from .. import metrics
from ..records import NewTask, TaskInfo
from .ids import fire_task_id
from .planning import plan
from .records import ScheduleFire, ScheduleInfo

if TYPE_CHECKING:
    from ..service import ReliableExecutor

logger = logging.getLogger("django_reliable_executor")

BATCH = 1000  # schedules planned and fired per round
MAX_TASKS_PER_ROUND = 5000  # catch-ups can plan many runs per schedule: the rest waits a round


def fire_task(schedule: ScheduleInfo, planned: dt.datetime, now: dt.datetime) -> NewTask:
    """The task of one planned run: due at its planned time, with the schedule's options."""
    max_duration = schedule.max_duration_millis
    return NewTask(
        task_id=fire_task_id(schedule.schedule_id, planned),
        task_name=schedule.task_name,
        queue=schedule.queue,
        priority=schedule.priority,
        parameter=schedule.parameter,
        retry_limit=schedule.retry_limit,
        retry_interval=schedule.retry_interval,
        retry_backoff=schedule.retry_backoff,
        max_duration_millis=max_duration,
        created_at=now,
        run_at=planned,
        deadline_at=now + dt.timedelta(milliseconds=max_duration) if max_duration else None,
    )


class ScheduleFiring:
    """One round: read up to BATCH due schedules, plan each by its misfire policy, store the
    runs' tasks and move the schedules on. Safe to run on two masters at once (see
    ``fire_schedules``); only the master runs it."""

    def __init__(self, executor: ReliableExecutor, batch: int = BATCH) -> None:
        self.executor = executor
        self.batch = batch

    def run_once(self) -> bool:
        """Fire what is due. True when the batch was full (more is due: go again at once)."""
        return self.fire_due()[1] >= self.batch

    def fire_due(self) -> tuple[list[TaskInfo], int]:
        """One round: the tasks it newly stored, and how many schedules were due (reported
        as a full batch when the round stopped early at MAX_TASKS_PER_ROUND)."""
        executor = self.executor
        settings = executor.settings
        grace = dt.timedelta(seconds=settings.SCHEDULE_MISFIRE_GRACE)
        limit = settings.SCHEDULE_CATCH_UP_LIMIT
        now = executor.clock.now()
        due = executor.storage.due_schedules(now, self.batch)
        fires: list[ScheduleFire] = []
        planned_tasks = 0
        reported = len(due)
        for schedule in due:
            if planned_tasks >= MAX_TASKS_PER_ROUND:
                reported = self.batch  # more is due: the next round comes at once
                break
            try:
                outcome = plan(schedule, now, grace=grace, catch_up_limit=limit)
            except Exception:
                # A definition that no longer plans (say, a time zone gone from the system's
                # database) would be due forever, ahead of the others: pause it, visibly.
                logger.exception(
                    "schedule %s cannot be planned: paused (fix it, then resume it)",
                    schedule.schedule_id,
                )
                executor.storage.set_schedule_paused(schedule.schedule_id, True, now)
                continue
            tasks = tuple(fire_task(schedule, run, now) for run in outcome.runs)
            planned_tasks += len(tasks)
            if outcome.skipped:
                logger.warning(
                    "schedule %s missed %d run(s) before %s (misfire=%s): not fired",
                    schedule.schedule_id,
                    outcome.skipped,
                    now.isoformat(),
                    schedule.misfire,
                )
                metrics.observe_schedule_skipped(outcome.skipped)
            fires.append(
                ScheduleFire(
                    schedule_id=schedule.schedule_id,
                    expected_next_run_at=schedule.next_run_at,
                    next_run_at=outcome.next_run_at,
                    tasks=tasks,
                    last_run_at=outcome.runs[-1] if outcome.runs else None,
                    last_task_id=tasks[-1].task_id if tasks else None,
                )
            )
        created = executor.storage.fire_schedules(fires, now) if fires else []
        if created:
            metrics.observe_schedule_fired(
                [(now - task.run_at).total_seconds() for task in created]
            )
            executor.announce_submitted(created)
        return created, reported

    def next_due(self) -> dt.datetime | None:
        """When the earliest active schedule is due next."""
        return self.executor.storage.next_schedule_due()
