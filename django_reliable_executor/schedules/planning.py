"""Which planned runs of a due schedule fire now, by its misfire policy; pure, no I/O."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from typing import TypeVar

from ..core.ids import fire_task_id
from ..core.records import NewTask, build
from ..exceptions import InvalidScheduleError
from .records import ScheduleInfo
from .timing import Timing, runs_between

T = TypeVar("T")
_MICRO = dt.timedelta(microseconds=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _micros(when: dt.datetime) -> int:
    return (when - _EPOCH) // _MICRO


@dataclasses.dataclass(frozen=True)
class Plan:
    """The runs to fire (planned times, oldest first), where the schedule goes next, and how
    many missed runs the policy dropped (exact for intervals; for cron, at least that many)."""

    runs: tuple[dt.datetime, ...]
    next_run_at: dt.datetime
    skipped: int


def plan(
    schedule: ScheduleInfo,
    now: dt.datetime,
    *,
    grace: dt.timedelta,
    catch_up_limit: int,
    timing: Timing | None = None,
) -> Plan:
    """Plan a schedule whose next run (``schedule.next_run_at``) is due at ``now``.

    - ``skip``: runs planned within ``grace`` before now are on time and fire (normally just
      one); older missed runs are dropped.
    - ``run_once``: all missed runs collapse into one fire, at the latest planned time.
    - ``catch_up``: every missed run fires, oldest first, but at most ``catch_up_limit`` (the
      newest ones): an outage of days must not flood the queue.
    The next run is always the first planned time after now, so the schedule never lags.
    """
    if schedule.every is not None:
        # Intervals by integer arithmetic on microseconds (exact, and what the master's round
        # mostly does): no Timing, no datetime per step.
        runs_us, next_us, skipped = plan_interval(
            _micros(schedule.next_run_at),
            schedule.every // _MICRO,
            _micros(schedule.start_at),
            _micros(now),
            schedule.misfire,
            grace=grace // _MICRO,
            catch_up_limit=catch_up_limit,
        )
        planned = tuple(_EPOCH + _MICRO * run for run in runs_us)
        return Plan(planned, _EPOCH + _MICRO * next_us, skipped)
    timing = timing or schedule.timing
    first = schedule.next_run_at
    next_run = timing.next_after(now)
    if first > now:
        return Plan((), first, 0)
    if schedule.misfire == "run_once":
        runs = newest_runs(schedule, timing, first, now, 1)
    elif schedule.misfire == "catch_up":
        runs = newest_runs(schedule, timing, first, now, catch_up_limit)
    else:  # skip
        runs = newest_runs(schedule, timing, max(first, now - grace), now, catch_up_limit)
    skipped = 0
    if not runs or runs[0] != first:
        limit = catch_up_limit + len(runs) + 1
        skipped = max(len(runs_between(timing, first - _MICRO, now, limit)) - len(runs), 1)
    return Plan(tuple(runs), next_run, skipped)


def overlap_runs(overlap: str, runs: tuple[T, ...] | list[T]) -> tuple[list[T], int]:
    """The runs a fire stores under the schedule's ``overlap`` policy, and how many it drops:
    with "skip", runs planned together would overlap each other, so only the newest fires and
    the older ones count as missed (as ``run_once`` would collapse them)."""
    if overlap == "skip" and len(runs) > 1:
        return list(runs[-1:]), len(runs) - 1
    return list(runs), 0


def plan_interval(
    first: int,
    every: int,
    anchor: int,
    now: int,
    misfire: str,
    *,
    grace: int,
    catch_up_limit: int,
) -> tuple[list[int], int, int]:
    """``plan`` of an interval schedule (runs at ``anchor + k * every``, k >= 0) whose next run
    is ``first``, every time in whole microseconds (since the epoch; ``every`` and ``grace``
    as lengths): the runs to fire, oldest first, the next run, and how many runs were dropped
    (exact)."""
    elapsed = now - anchor
    next_run = anchor if elapsed < 0 else anchor + (elapsed // every + 1) * every
    if first > now:
        return [], first, 0
    if misfire == "run_once":
        count, lower = 1, first
    elif misfire == "catch_up":
        count, lower = catch_up_limit, first
    else:  # skip
        count, lower = catch_up_limit, max(first, now - grace)
    runs: list[int] = []
    if count > 0 and lower <= now:
        last = elapsed // every
        low = max(-((anchor - lower) // every), 0, last - count + 1)  # ceiling division
        runs = [anchor + k * every for k in range(low, last + 1)]
    skipped = 0
    if not runs or runs[0] != first:
        missed = elapsed // every + ((anchor - first) // every) + 1  # runs in [first, now]
        skipped = max(missed - len(runs), 1)
    return runs, next_run, skipped


def newest_runs(
    schedule: ScheduleInfo,
    timing: Timing,
    lower: dt.datetime,
    now: dt.datetime,
    count: int,
) -> list[dt.datetime]:
    """The newest ``count`` planned runs of a cron schedule in [lower, now], oldest first."""
    if count <= 0 or lower > now:
        return []
    # Cron: search back from now over a doubling window, so an outage of months reads only
    # about as many run times as it returns.
    window = dt.timedelta(minutes=2)
    while True:
        start = now - window
        if start <= lower:
            return runs_between(timing, lower - _MICRO, now, 10**6)[-count:]
        runs = runs_between(timing, start, now, 10**6)
        if len(runs) >= count:
            return runs[-count:]
        window *= 2


def fire_task(schedule: ScheduleInfo, planned: dt.datetime, now: dt.datetime) -> NewTask:
    """The task of one planned run: due at its planned time, with the schedule's options."""
    max_duration = schedule.max_duration_millis
    # Built without NewTask.__init__: the master builds a thousand per round.
    return build(
        NewTask,
        {
            "task_id": fire_task_id(schedule.schedule_id, planned),
            "task_name": schedule.task_name,
            "queue": schedule.queue,
            "priority": schedule.priority,
            "parameter": schedule.parameter,
            "retry_limit": schedule.retry_limit,
            "retry_interval": schedule.retry_interval,
            "retry_backoff": schedule.retry_backoff,
            "max_duration_millis": max_duration,
            "created_at": now,
            "run_at": planned,
            "deadline_at": now + dt.timedelta(milliseconds=max_duration) if max_duration else None,
        },
    )


#: How long a run started by hand (``run_now_task``) keeps later "run now" requests of its
#: schedule to itself while it is not finished: a day, so a double click, two operators at
#: once or a retried HTTP call give one run, and a run that never ends blocks no more than that.
RUN_NOW_WINDOW = dt.timedelta(days=1)


def run_now_task(schedule: ScheduleInfo, now: dt.datetime, timing: Timing | None = None) -> NewTask:
    """The task of a run started by hand at ``now``: a fire planned at ``now`` to the
    microsecond (its id ``<schedule_id>@<now>Z``, in the namespace submits refuse), due at
    once, with the schedule's options; the next microsecond when ``now`` is one of the
    schedule's planned times, so that it never takes a planned run's id (the planned run
    still fires, once). It holds a unique key of its schedule (``run_now_key``) for
    RUN_NOW_WINDOW: while it is not finished, storing another run now of the schedule
    returns it instead."""
    planned = now
    try:
        timing = timing or schedule.timing
    except InvalidScheduleError:
        timing = None  # a time zone gone from the system: the master plans no run to meet
    if timing is not None and timing.next_after(now - _MICRO) == now:
        planned = now + _MICRO
    task = fire_task(schedule, planned, now)
    return build(
        NewTask,
        {
            **{field.name: getattr(task, field.name) for field in dataclasses.fields(NewTask)},
            "run_at": now,
            "unique_key": run_now_key(schedule),
            "unique_until": now + RUN_NOW_WINDOW,
        },
    )


def run_now_key(schedule: ScheduleInfo) -> str:
    """The unique key digest runs started by hand of ``schedule`` share. Its text differs from
    every key ``uniqueness.unique_digest`` makes ("run-now", not "key" or "parameter", after
    the task name), so no submitted task can hold it."""
    text = f"{schedule.task_name}\0run-now\0{schedule.schedule_id}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
