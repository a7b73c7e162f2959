"""The schedule half of the storage interface: keep schedules, find due ones, fire them."""

from __future__ import annotations

import abc
import builtins
import datetime as dt
from collections.abc import Collection, Sequence

from ..core.records import TaskInfo, build
from ..schedules.planning import fire_task, overlap_runs, plan
from ..schedules.records import FiringRound, ScheduleFire, ScheduleInfo

#: Hours a schedule's overlap skips are counted for (the schedule pages' last 24 hours), and
#: how long their counters are kept: one more, so that the oldest hour shown is whole.
SKIP_HOURS = 24
_HOUR = dt.timedelta(hours=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def epoch_hour(moment: dt.datetime) -> int:
    """The UTC hour of ``moment``, counted from the epoch."""
    return (moment - _EPOCH) // _HOUR


def hour_start(hour: int) -> dt.datetime:
    """The aware UTC start of an ``epoch_hour``."""
    return _EPOCH + hour * _HOUR


class ScheduleStorage(abc.ABC):
    """Schedules live beside the tasks they fire, in the same storage. Only the master fires;
    ``fire_schedules`` is still safe to race: a fire is a compare-and-set on the schedule's
    next run, and its tasks' ids derive from the schedule id and the planned time."""

    def save_schedules(
        self,
        schedules: Sequence[ScheduleInfo],
        keep_next_run: Collection[str] = (),
        keep_anchor: Collection[str] = (),
    ) -> None:
        """Insert new schedules as given. An existing one gets the new definition and
        ``updated_at``, and the given ``next_run_at`` unless its id is in ``keep_next_run``;
        its state (paused, last run and task, created_at) is left as stored.

        ``keep_anchor``: ids whose definition gave no start (its ``start_at`` is the caller's
        "now"). One stored by then with the same every, cron and time zone (another process
        saved it after this caller read) keeps its ``start_at`` and its next run: two workers
        first saving a declared interval together must not move its grid."""
        self._save_schedules(schedules, set(keep_next_run), set(keep_anchor))

    @abc.abstractmethod
    def _save_schedules(
        self, schedules: Sequence[ScheduleInfo], keep: set[str], anchored: set[str]
    ) -> None:
        """``save_schedules`` with the id collections as sets."""

    @abc.abstractmethod
    def get_schedules(self, schedule_ids: Sequence[str]) -> dict[str, ScheduleInfo]:
        """The stored schedules among these ids, by id (unknown ids left out)."""

    @abc.abstractmethod
    def list_schedules(
        self, *, limit: int = 100, offset: int = 0, paused: bool | None = None
    ) -> builtins.list[ScheduleInfo]:
        """Schedules by id, optionally only the paused (True) or active (False) ones."""

    @abc.abstractmethod
    def count_schedules(self) -> dict[str, int]:
        """``{"active": n, "paused": m}``."""

    @abc.abstractmethod
    def delete_schedule(self, schedule_id: str) -> bool:
        """Forget a schedule (tasks it fired stay). False when there was none."""

    @abc.abstractmethod
    def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: dt.datetime
    ) -> ScheduleInfo | None:
        """Pause (fires nothing) or resume a schedule; its next run is kept, so on resume the
        runs missed meanwhile meet its misfire policy. None for an unknown id."""

    @abc.abstractmethod
    def due_schedules(self, now: dt.datetime, limit: int) -> builtins.list[ScheduleInfo]:
        """Up to ``limit`` active schedules whose next run is at or before ``now``, earliest
        first."""

    @abc.abstractmethod
    def next_schedule_due(self) -> dt.datetime | None:
        """The earliest next run of any active schedule."""

    @abc.abstractmethod
    def fire_schedules(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]] | None = None,
    ) -> builtins.list[TaskInfo]:
        """Store each fire's tasks (an existing id is left alone) and move its schedule on, if
        the schedule still expects that fire. Returns the tasks newly created.

        A fire with ``overlap="skip"`` whose schedule's previous run (its stored
        ``last_task_id``) is not terminal stores nothing: in the same atomic step the schedule
        moves on, counts the runs skipped (``overlap_skipped``, ``last_skipped_at``), and
        (schedule id, that run's task id, runs skipped) is appended to ``overlapped``."""

    @abc.abstractmethod
    def add_schedule_skips(self, skips: Sequence[tuple[str, int]], now: dt.datetime) -> None:
        """Count runs skipped by overlap, (schedule id, runs), in the UTC hour of ``now``, and
        forget the counts older than SKIP_HOURS + 1 hours (bounded: at most that many counters
        per schedule). Statistics: a count that cannot be written is logged and dropped."""

    @abc.abstractmethod
    def schedule_skips(self, schedule_id: str, since: dt.datetime) -> dict[dt.datetime, int]:
        """The schedule's runs skipped by overlap per UTC hour from ``since`` on, by the
        hour's start (hours without skips left out)."""

    def fire_due(
        self,
        now: dt.datetime,
        limit: int,
        *,
        grace: dt.timedelta,
        catch_up_limit: int,
        max_tasks: int,
    ) -> FiringRound:
        """One round of the master's firing: read up to ``limit`` due schedules, plan each by
        its misfire policy (``schedules.planning.plan``), then store the runs' tasks and move
        the schedules on with ``fire_schedules`` (so racing a second master stays safe). The
        round stops planning once it holds ``max_tasks`` tasks. A schedule that cannot be
        planned is paused, so it never holds the others up. A storage may do the same round
        its own faster way, with the same outcome."""
        due = self.due_schedules(now, limit)
        fires: list[ScheduleFire] = []
        skipped: list[tuple[str, int, str]] = []
        paused: list[tuple[str, Exception]] = []
        planned = 0
        reported = len(due)
        for schedule in due:
            if planned >= max_tasks:
                reported = limit  # more is due: the next round comes at once
                break
            try:
                outcome = plan(schedule, now, grace=grace, catch_up_limit=catch_up_limit)
            except Exception as exc:
                self.set_schedule_paused(schedule.schedule_id, True, now)
                paused.append((schedule.schedule_id, exc))
                continue
            runs, dropped = overlap_runs(schedule.overlap, outcome.runs)
            tasks = tuple(fire_task(schedule, run, now) for run in runs)
            planned += len(tasks)
            if outcome.skipped + dropped:
                skipped.append((schedule.schedule_id, outcome.skipped + dropped, schedule.misfire))
            fires.append(
                build(
                    ScheduleFire,
                    {
                        "schedule_id": schedule.schedule_id,
                        "expected_next_run_at": schedule.next_run_at,
                        "next_run_at": outcome.next_run_at,
                        "tasks": tasks,
                        "last_run_at": runs[-1] if runs else None,
                        "last_task_id": tasks[-1].task_id if tasks else None,
                        "overlap": schedule.overlap,
                    },
                )
            )
        overlapped: list[tuple[str, str, int]] = []
        created = self.fire_schedules(fires, now, overlapped) if fires else []
        return FiringRound(
            created=created, due=reported, skipped=skipped, paused=paused, overlapped=overlapped
        )
