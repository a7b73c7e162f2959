"""Frozen records of schedules: what is stored, and one round's fire of a schedule."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Literal

from ..core.records import NewTask, TaskInfo
from .timing import Timing, make_timing

Misfire = Literal["skip", "run_once", "catch_up"]
MISFIRE_POLICIES: tuple[str, ...] = ("skip", "run_once", "catch_up")
#: What a run falling due while the schedule's previous run is not terminal does: "allow"
#: fires it anyway; "skip" does not fire it (counted on the schedule and logged).
OVERLAP_POLICIES: tuple[str, ...] = ("allow", "skip")
ORIGINS: tuple[str, ...] = ("api", "code")


@dataclasses.dataclass(frozen=True)
class ScheduleInfo:
    """One stored schedule. Datetimes are aware UTC.

    The task options (queue, priority, retries, max duration) were resolved against the
    handler and the settings when the schedule was saved: each fire submits exactly these.
    ``last_run_at`` is the planned time of the latest fire and ``last_task_id`` its task.
    ``overlap_skipped`` counts the runs not fired because that task was still live
    (``overlap="skip"``), the latest such skip at ``last_skipped_at``.
    """

    schedule_id: str
    task_name: str
    parameter: Any
    every: dt.timedelta | None
    cron: str | None
    timezone: str
    start_at: dt.datetime
    misfire: str
    queue: str
    priority: int
    retry_limit: int
    retry_interval: int
    retry_backoff: str
    max_duration_millis: int | None
    paused: bool
    next_run_at: dt.datetime
    last_run_at: dt.datetime | None
    last_task_id: str | None
    origin: str
    created_at: dt.datetime
    updated_at: dt.datetime
    overlap: str = "allow"
    overlap_skipped: int = 0
    last_skipped_at: dt.datetime | None = None

    @property
    def timing(self) -> Timing:
        """The rule giving this schedule's run times."""
        return make_timing(
            every=self.every, cron=self.cron, timezone=self.timezone, anchor=self.start_at
        )

    def describe(self) -> str:
        """ "every 5 minutes", "cron 0 3 * * * (Europe/Paris)": for people."""
        return self.timing.describe()

    def same_timing(self, other: ScheduleInfo) -> bool:
        """Whether both give the same run times (then a redefinition keeps the next run)."""
        return (self.every, self.cron, self.timezone, self.start_at) == (
            other.every,
            other.cron,
            other.timezone,
            other.start_at,
        )

    def same_definition(self, other: ScheduleInfo) -> bool:
        """Everything a caller defines is equal (state such as paused or next run aside)."""
        return all(getattr(self, name) == getattr(other, name) for name in DEFINITION_FIELDS)


#: The fields a caller defines; the others are state the storage and the master keep.
DEFINITION_FIELDS: tuple[str, ...] = (
    "task_name",
    "parameter",
    "every",
    "cron",
    "timezone",
    "start_at",
    "misfire",
    "queue",
    "priority",
    "retry_limit",
    "retry_interval",
    "retry_backoff",
    "max_duration_millis",
    "origin",
    "overlap",
)


@dataclasses.dataclass(frozen=True)
class ScheduleFire:
    """What one master round does to one due schedule: store ``tasks`` (one per planned run,
    ids derived from the schedule id and the planned time) and move the schedule on to
    ``next_run_at`` — only if it still expects ``expected_next_run_at`` and is not paused, so
    a second master with the same plan changes nothing.

    ``overlap`` "skip": if the schedule's previous run (its stored ``last_task_id``) is not
    terminal, store no task, count the runs skipped on the schedule and still move it on."""

    schedule_id: str
    expected_next_run_at: dt.datetime
    next_run_at: dt.datetime
    tasks: tuple[NewTask, ...]
    last_run_at: dt.datetime | None
    last_task_id: str | None
    overlap: str = "allow"


@dataclasses.dataclass(frozen=True)
class FiringRound:
    """What one round of the master's firing did (``ScheduleStorage.fire_due``).

    ``created``: the tasks newly stored. ``due``: how many due schedules the round read (the
    whole ``limit`` when it stopped early at its task cap: more is due). ``skipped``: per
    schedule whose misfire policy dropped runs, (schedule id, runs dropped, policy).
    ``paused``: per schedule that could not be planned and was paused, (schedule id, error).
    ``overlapped``: per schedule whose runs were not fired because its previous run was still
    live (``overlap="skip"``), (schedule id, that run's task id, runs skipped).
    """

    created: list[TaskInfo]
    due: int
    skipped: list[tuple[str, int, str]]
    paused: list[tuple[str, Exception]]
    overlapped: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule as a caller defines it: in code (``@reliable_task_handler(schedule=...)``,
    where ``schedule_id`` and ``task_name`` default to the handler's name) or in bulk through
    ``executor.schedule_many``. Give exactly one of ``every`` (seconds or a timedelta) and
    ``cron``; options left as None take the handler's, then the settings' value."""

    every: float | dt.timedelta | None = None
    cron: str | None = None
    timezone: str | None = None
    schedule_id: str | None = None
    task_name: str | None = None
    parameter: Any = None
    queue: str | None = None
    priority: int | None = None
    start_at: dt.datetime | None = None
    misfire: str = "skip"
    retry_limit: int | None = None
    retry_interval: int | None = None
    retry_backoff: str | None = None
    max_duration_millis: int | None = None
    overlap: str = "allow"
