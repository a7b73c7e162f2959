"""What the schedule pages show of a schedule's future and recent past: its next planned fire
times on its own clock, and its runs of the last 24 hours per hour, drawn as inline SVG bars.

Read through the service (any storage); the fire times are computed, not read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo

from ..core.records import TaskInfo
from ..core.states import FAILURE_STATUSES, TaskStatus
from ..schedules.records import ScheduleInfo
from ..schedules.timing import runs_between
from ..service.reliable_executor import ReliableExecutor

UTC = dt.timezone.utc
HOURS = 24
#: Fire times shown: the list shows the first, the schedule's page all of them.
UPCOMING = 5
#: The runs read per schedule for its 24 hours: the newest ones (the list reads fewer, as it
#: reads them for up to a page of schedules).
SCANNED_DETAIL = 2000
SCANNED_LIST = 200
_MICRO = dt.timedelta(microseconds=1)
# The bars' drawing, in px: HOURS bars of a bar's width with GAP between them; the list's are
# narrower, its table must fit beside the filter in a 1280 px window.
GAP, PAD = 1, 1
BAR_LIST, BAR_DETAIL = 2, 10
HEIGHT_LIST, HEIGHT_DETAIL = 18, 48


@dataclasses.dataclass(frozen=True)
class FireTime:
    """One planned fire: on the schedule's wall clock (with the zone's abbreviation, which
    tells summer from winter time) and in UTC."""

    at: dt.datetime  # aware UTC
    local_date: str  # "Sun 2026-03-29"
    local_clock: str  # "03:00 CEST"
    utc_date: str  # "2026-03-29"
    utc_clock: str  # "01:00 UTC"

    @property
    def local(self) -> str:
        """ "Sun 2026-03-29 03:00 CEST"."""
        return f"{self.local_date} {self.local_clock}"

    @property
    def in_utc(self) -> bool:
        """The schedule's clock is UTC's at that time: the UTC time would repeat it."""
        return self.local_clock.startswith(self.utc_clock.removesuffix(" UTC"))

    @property
    def utc(self) -> str:
        """ "2026-03-29 01:00 UTC"."""
        return f"{self.utc_date} {self.utc_clock}"


def upcoming(schedule: ScheduleInfo, now: dt.datetime, count: int = UPCOMING) -> list[FireTime]:
    """The schedule's next ``count`` planned fire times after ``now`` and from its next run
    on (``timing.next_after``, so DST gaps and repeated hours are those the master fires at).
    Empty when its timing cannot be computed (a time zone gone from the system, say)."""
    # Not before the next run the master holds: a cron schedule whose start_at is still to
    # come fires first at its first cron time from then, not at the ones before.
    after = max(now, schedule.next_run_at - dt.timedelta(microseconds=1))
    try:
        times = runs_between(schedule.timing, after, dt.datetime.max.replace(tzinfo=UTC), count)
        return [fire_time(at, schedule.timezone) for at in times]
    except Exception:  # the pages show the definition as stored rather than fail
        return []


def fire_time(at: dt.datetime, timezone: str) -> FireTime:
    """``at`` on the wall clock of ``timezone`` (raises for an unknown zone) and in UTC."""
    local = at.astimezone(zoneinfo.ZoneInfo(timezone))
    at = at.astimezone(UTC)
    return FireTime(
        at=at,
        local_date=f"{local:%a %Y-%m-%d}",
        local_clock=f"{local:%H:%M}{_seconds(local)} {local.tzname()}",
        utc_date=f"{at:%Y-%m-%d}",
        utc_clock=f"{at:%H:%M}{_seconds(at)} UTC",
    )


def next_fire(schedule: ScheduleInfo) -> FireTime | None:
    """The stored next run (what the master fires next, late or not) on the schedule's clock."""
    try:
        return fire_time(schedule.next_run_at, schedule.timezone)
    except Exception:  # an unknown zone: the page still shows the UTC time
        return None


def _seconds(moment: dt.datetime) -> str:
    """Seconds ":SS" when not zero (an interval's runs need not fall on a minute); the
    microseconds an interval anchored at its creation carries are left out."""
    return f":{moment:%S}" if moment.second else ""


@dataclasses.dataclass(frozen=True)
class Hour:
    """One UTC hour of a schedule's runs."""

    start: dt.datetime
    completed: int
    failed: int
    skipped: int

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.skipped


@dataclasses.dataclass(frozen=True)
class Bar:
    """One stacked rectangle of the drawing."""

    x: int
    y: float
    width: int
    height: float
    kind: str  # "completed", "failed" or "skipped": its CSS class
    title: str


@dataclasses.dataclass(frozen=True)
class Activity:
    """The last HOURS UTC hours of a schedule's runs (the current hour last) and their
    drawing: completed, failed (FAILED, TIMEOUT, ERROR) by when they finished, and runs
    skipped by the overlap policy by when they were skipped. ``partial``: only the newest
    ``scanned`` runs were read and older runs of the period may be left out."""

    hours: list[Hour]
    bars: list[Bar]
    width: int
    height: int
    completed: int
    failed: int
    skipped: int
    partial: bool
    scanned: int
    title: str

    @property
    def baseline(self) -> float:
        """Where the bars stand: a line drawn under them, so an empty day still shows."""
        return self.height - PAD + 0.5


def activity(
    executor: ReliableExecutor,
    schedule: ScheduleInfo,
    now: dt.datetime,
    scanned: int,
    height: int = HEIGHT_DETAIL,
    bar: int = BAR_DETAIL,
) -> Activity:
    """Read the schedule's newest ``scanned`` runs and its skips per hour, and count them
    into the last HOURS UTC hours."""
    first = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(
        hours=HOURS - 1
    )
    runs = executor.list_tasks(
        task_name=schedule.task_name, schedule_id=schedule.schedule_id, limit=scanned
    )
    skips = executor.storage.schedule_skips(schedule.schedule_id, first)
    partial = len(runs) >= scanned and runs[-1].created_at >= first
    return count_hours(runs, skips, first, partial, scanned, height, bar)


def count_hours(
    runs: list[TaskInfo],
    skips: dict[dt.datetime, int],
    first: dt.datetime,
    partial: bool,
    scanned: int,
    height: int = HEIGHT_DETAIL,
    bar: int = BAR_DETAIL,
) -> Activity:
    """Count ``runs`` and ``skips`` (runs skipped, by the UTC hour's start) into the HOURS
    hours from ``first`` on, and draw them."""
    completed = [0] * HOURS
    failed = [0] * HOURS
    for run in runs:
        if run.finished_at is None or run.finished_at < first:
            continue
        index = int((run.finished_at - first) // dt.timedelta(hours=1))
        if index >= HOURS:
            continue
        if run.status is TaskStatus.COMPLETED:
            completed[index] += 1
        elif run.status in FAILURE_STATUSES:
            failed[index] += 1
    hours = [
        Hour(
            start=first + dt.timedelta(hours=i),
            completed=completed[i],
            failed=failed[i],
            skipped=skips.get(first + dt.timedelta(hours=i), 0),
        )
        for i in range(HOURS)
    ]
    return draw(hours, partial, scanned, height, bar)


def draw(
    hours: list[Hour], partial: bool, scanned: int, height: int, bar: int = BAR_DETAIL
) -> Activity:
    """Stacked bars, one per hour, scaled to the busiest hour: completed at the bottom, then
    failed, then skipped (the template draws the baseline they stand on)."""
    peak = max((hour.total for hour in hours), default=0)
    usable = height - 2 * PAD
    bars: list[Bar] = []
    for index, hour in enumerate(hours):
        x = PAD + index * (bar + GAP)
        label = f"{hour.start:%H}:00 UTC"
        title = (
            f"{label}: {hour.completed} completed, {hour.failed} failed, "
            f"{hour.skipped} skipped (overlap)"
        )
        bottom = float(height - PAD)
        for kind, value in (
            ("completed", hour.completed),
            ("failed", hour.failed),
            ("skipped", hour.skipped),
        ):
            if not value:
                continue
            size = max(round(usable * value / peak, 1), 1.0)
            bottom -= size
            bars.append(Bar(x, round(bottom, 1), bar, size, kind, title))
    totals = [sum(getattr(hour, kind) for hour in hours) for kind in ("completed", "failed")]
    skipped = sum(hour.skipped for hour in hours)
    title = (
        f"Last {HOURS} hours: {totals[0]} completed, {totals[1]} failed, "
        f"{skipped} skipped (overlap)"
    )
    if partial:
        title += f" (counted among the newest {scanned} runs only)"
    return Activity(
        hours=hours,
        bars=bars,
        width=2 * PAD + HOURS * (bar + GAP) - GAP,
        height=height,
        completed=totals[0],
        failed=totals[1],
        skipped=skipped,
        partial=partial,
        scanned=scanned,
        title=title,
    )
