"""The schedule half of the public service: define, read, pause, resume and delete schedules."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.utils import timezone as django_timezone

from ..core.ids import validate_schedule_id
from ..core.numbers import is_int
from ..core.options import SCHEDULE, options_of
from ..core.parameter_index import index_entries
from ..core.records import NewTask, TaskInfo, TaskSubmitRequest
from ..exceptions import InvalidScheduleError, UnknownScheduleError
from ..schedules.planning import run_now_task
from ..schedules.records import MISFIRE_POLICIES, ORIGINS, OVERLAP_POLICIES, Schedule, ScheduleInfo
from ..schedules.timing import make_timing

if TYPE_CHECKING:
    from ..conf import ExecutorSettings
    from ..core.clock import Clock
    from ..storage import TaskStorage

_MICRO = dt.timedelta(microseconds=1)

#: Validates a schedule's task options as a submit would: (request, now, settings, index).
PrepareTask = Callable[[TaskSubmitRequest, dt.datetime, "ExecutorSettings", int], NewTask]


class ScheduleOperations:
    """The schedule methods of ``executor``: ReliableExecutor builds one and delegates to it.

    Its dependencies are getters, not values: the service builds its storage on first use (and
    forgets it on ``reset()``) and reads the settings at each call, as its own methods do."""

    def __init__(
        self,
        *,
        storage: Callable[[], TaskStorage],
        clock: Callable[[], Clock],
        settings: Callable[[], ExecutorSettings],
        prepare: PrepareTask,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._settings = settings
        self._prepare = prepare

    def schedule(
        self,
        schedule_id: str,
        task_name: str,
        parameter: Any = None,
        *,
        every: float | dt.timedelta | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        start_at: dt.datetime | None = None,
        misfire: str = "skip",
        overlap: str = "allow",
        **task_options: Any,
    ) -> ScheduleInfo:
        """One schedule, as ``ReliableExecutor.schedule`` documents."""
        unknown = sorted(set(task_options) - set(options_of(SCHEDULE)))
        if unknown:
            raise InvalidScheduleError(
                f"unknown schedule option(s): {', '.join(unknown)}", field=unknown[0]
            )
        spec = Schedule(
            every=every,
            cron=cron,
            timezone=timezone,
            schedule_id=schedule_id,
            task_name=task_name,
            parameter=parameter,
            queue=queue,
            priority=priority,
            start_at=start_at,
            misfire=misfire,
            overlap=overlap,
            **task_options,
        )
        return self.schedule_many([spec])[0]

    def schedule_many(
        self, schedules: Sequence[Schedule], *, origin: str = "api"
    ) -> list[ScheduleInfo]:
        """Create or redefine several schedules at once: every one is validated first (one bad
        definition stores nothing), unchanged ones are not written. Same order as given."""
        return self._save(schedules, origin)[0]

    def _save(self, schedules: Sequence[Schedule], origin: str) -> tuple[list[ScheduleInfo], int]:
        if origin not in ORIGINS:
            raise ValueError(f"origin must be one of {ORIGINS}, got {origin!r}")
        now = self._clock().now()
        settings = self._settings()
        ids: list[str] = []
        for index, spec in enumerate(schedules):
            if not isinstance(spec, Schedule):
                raise InvalidScheduleError(
                    f"schedule #{index} must be a Schedule, got {type(spec).__name__}"
                )
            ids.append(validate_schedule_id(spec.schedule_id))
        if len(set(ids)) != len(ids):
            repeated = next(i for i in ids if ids.count(i) > 1)
            raise InvalidScheduleError(
                f"schedule_id {repeated!r} is given twice", field="schedule_id"
            )
        existing = self._storage().get_schedules(ids) if ids else {}
        infos = [
            self._definition(spec, existing.get(spec.schedule_id or ""), origin, now, settings, i)
            for i, spec in enumerate(schedules)
        ]
        changed = [
            info
            for info in infos
            if info.schedule_id not in existing
            or not info.same_definition(existing[info.schedule_id])
        ]
        keep = {
            info.schedule_id
            for info in changed
            if info.schedule_id in existing and info.same_timing(existing[info.schedule_id])
        }
        # No start given: the anchor is this call's "now" only if nobody stored one meanwhile.
        defaulted = {spec.schedule_id or "" for spec in schedules if spec.start_at is None} & {
            info.schedule_id for info in changed
        }
        if changed:
            self._storage().save_schedules(changed, keep, defaulted)
        return infos, len(changed)

    def _definition(
        self,
        spec: Schedule,
        stored: ScheduleInfo | None,
        origin: str,
        now: dt.datetime,
        settings: ExecutorSettings,
        index: int,
    ) -> ScheduleInfo:
        """Validate one definition and resolve its task options as a submit would."""
        start_at = _checked_start(spec)
        # Without a start, an existing schedule keeps its own: a definition in code is saved
        # again at every start-up and must not move its interval's anchor each time.
        anchor = (start_at or (stored.start_at if stored else now)).astimezone(dt.timezone.utc)
        zone = spec.timezone or django_timezone.get_default_timezone_name()
        timing = make_timing(every=spec.every, cron=spec.cron, timezone=zone, anchor=anchor)
        every = spec.every
        if every is not None and not isinstance(every, dt.timedelta):
            every = dt.timedelta(seconds=every)
        task = self._prepare(_request_of(spec), now, settings, index)
        if every is not None and spec.start_at is None and stored is None:
            next_run = timing.next_after(now)  # one interval from now, not at once
        else:
            next_run = timing.next_after(max(anchor, now) - _MICRO)
        info = ScheduleInfo(
            schedule_id=spec.schedule_id or "",
            task_name=task.task_name,
            parameter=task.parameter,
            every=every,
            cron=spec.cron,
            timezone=zone,
            start_at=anchor,
            misfire=spec.misfire,
            queue=task.queue,
            priority=task.priority,
            retry_limit=task.retry_limit,
            retry_interval=task.retry_interval,
            retry_backoff=task.retry_backoff,
            max_duration_millis=task.max_duration_millis,
            paused=False,
            next_run_at=next_run,
            last_run_at=None,
            last_task_id=None,
            origin=origin,
            created_at=now,
            updated_at=now,
            overlap=spec.overlap,
        )
        return info if stored is None else _redefined(stored, info, now)

    def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """The stored schedule, or None for an unknown id."""
        if not isinstance(schedule_id, str) or not schedule_id:
            return None
        return self._storage().get_schedules([schedule_id]).get(schedule_id)

    def list_schedules(
        self, *, limit: int = 100, offset: int = 0, paused: bool | None = None
    ) -> list[ScheduleInfo]:
        """Schedules by id; ``paused=True`` only the paused, ``False`` only the active ones."""
        for name, value in (("limit", limit), ("offset", offset)):
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        return self._storage().list_schedules(limit=limit, offset=offset, paused=paused)

    def count_schedules(self) -> dict[str, int]:
        """``{"active": n, "paused": m}``."""
        return self._storage().count_schedules()

    def pause_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """Stop firing (a pause survives restarts and redefinitions). None for an unknown id."""
        return self._storage().set_schedule_paused(schedule_id, True, self._clock().now())

    def resume_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """Fire again; the runs missed while paused meet the schedule's misfire policy."""
        return self._storage().set_schedule_paused(schedule_id, False, self._clock().now())

    def delete_schedule(self, schedule_id: str) -> bool:
        """Forget the schedule; the tasks it fired stay. False for an unknown id."""
        return self._storage().delete_schedule(schedule_id)

    def run_schedule_now(self, schedule_id: str) -> tuple[TaskInfo, bool]:
        """Store one run of the schedule due now (``planning.run_now_task``): its task and
        True, or the task of a run started by hand that is not finished yet and False (one
        run for a double click or two callers at once). The schedule is not written: its next
        planned run stays, and fires once. Paused schedules run too. UnknownScheduleError
        for an unknown id, storing nothing."""
        schedule = self.get_schedule(schedule_id)
        if schedule is None:
            raise UnknownScheduleError(f"no schedule {schedule_id!r}", field="schedule_id")
        task = run_now_task(schedule, self._clock().now())
        # Found by a parameter search as a submitted task is (SEARCHABLE_PARAMETERS).
        keys = self._settings().SEARCHABLE_PARAMETERS
        task = dataclasses.replace(task, indexed=index_entries(task.parameter, keys))
        ((info, created),) = self._storage().enqueue([task])
        return info, created

    def sync_declared_schedules(self, declared: Sequence[Schedule]) -> int:
        """Create or update ``declared``, the schedules of ``@reliable_task_handler(schedule=)``
        (the registry's, which the service passes in). Returns how many were written."""
        return self._save(declared, "code")[1]


def _checked_start(spec: Schedule) -> dt.datetime | None:
    """The definition's ``start_at``, after checking it and its misfire and overlap policies."""
    if spec.misfire not in MISFIRE_POLICIES:
        raise InvalidScheduleError(
            f"misfire must be one of {MISFIRE_POLICIES}, got {spec.misfire!r}",
            field="misfire",
        )
    if not isinstance(spec.overlap, str) or spec.overlap not in OVERLAP_POLICIES:
        raise InvalidScheduleError(
            f"overlap must be one of {OVERLAP_POLICIES}, got {spec.overlap!r}",
            field="overlap",
        )
    start_at = spec.start_at
    if start_at is not None and (not isinstance(start_at, dt.datetime) or start_at.tzinfo is None):
        raise InvalidScheduleError(
            f"start_at must be an aware datetime, got {start_at!r}", field="start_at"
        )
    return start_at


def _request_of(spec: Schedule) -> TaskSubmitRequest:
    """The submit a run of ``spec`` makes: its task options are checked as a submit's are."""
    return TaskSubmitRequest(
        task_name=spec.task_name or "",
        task_parameter=spec.parameter,
        queue=spec.queue,
        priority=spec.priority,
        retry_limit=spec.retry_limit,
        retry_interval=spec.retry_interval,
        retry_backoff=spec.retry_backoff,
        max_duration_millis=spec.max_duration_millis,
    )


def _redefined(stored: ScheduleInfo, info: ScheduleInfo, now: dt.datetime) -> ScheduleInfo:
    """``info``, the new definition of ``stored``, keeping its state: paused, last run, runs
    skipped for overlap, when it was created, and its next run while the timing is the same."""
    return dataclasses.replace(
        info,
        paused=stored.paused,
        next_run_at=stored.next_run_at if info.same_timing(stored) else info.next_run_at,
        last_run_at=stored.last_run_at,
        last_task_id=stored.last_task_id,
        overlap_skipped=stored.overlap_skipped,
        last_skipped_at=stored.last_skipped_at,
        created_at=stored.created_at,
        updated_at=now if not info.same_definition(stored) else stored.updated_at,
    )
