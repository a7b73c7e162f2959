"""Which planned runs of a due schedule fire now, by its misfire policy; pure, no I/O."""

from __future__ import annotations

import dataclasses
import datetime as dt

from .records import ScheduleInfo
from .timing import Timing, runs_between

_MICRO = dt.timedelta(microseconds=1)


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
        skipped = max(_missed(schedule, timing, first, now, limit) - len(runs), 1)
    return Plan(tuple(runs), next_run, skipped)


def newest_runs(
    schedule: ScheduleInfo,
    timing: Timing,
    lower: dt.datetime,
    now: dt.datetime,
    count: int,
) -> list[dt.datetime]:
    """The newest ``count`` planned runs in [lower, now], oldest first."""
    if count <= 0 or lower > now:
        return []
    if schedule.every is not None:
        return _interval_runs(schedule.start_at, schedule.every, lower, now, count)
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


def _interval_runs(
    anchor: dt.datetime,
    every: dt.timedelta,
    lower: dt.datetime,
    now: dt.datetime,
    count: int,
) -> list[dt.datetime]:
    """Runs anchor + k*every in [lower, now], by integer arithmetic on microseconds."""
    step = every // _MICRO
    last = (now - anchor) // _MICRO // step
    first = -(-((lower - anchor) // _MICRO) // step)  # ceiling division
    first = max(first, 0, last - count + 1)
    return [anchor + dt.timedelta(microseconds=k * step) for k in range(first, last + 1)]


def _missed(
    schedule: ScheduleInfo, timing: Timing, first: dt.datetime, now: dt.datetime, limit: int
) -> int:
    """How many planned runs lie in [first, now]: exact for an interval, for cron counted up to
    ``limit`` only (walking a long outage run by run would cost more than the fire itself)."""
    if schedule.every is not None:
        step = schedule.every // _MICRO
        anchor = schedule.start_at
        total = (now - anchor) // _MICRO // step - (-(-((first - anchor) // _MICRO) // step)) + 1
        return int(total)
    return len(runs_between(timing, first - _MICRO, now, limit))
