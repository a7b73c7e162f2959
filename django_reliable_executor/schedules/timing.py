"""When a schedule runs: fixed intervals and cron expressions on a time zone's wall clock."""

from __future__ import annotations

import abc
import datetime as dt
import functools
import math
import zoneinfo

from ..core.numbers import is_number
from ..exceptions import InvalidScheduleError
from .cron import CronSpec, parse_cron

UTC = dt.timezone.utc
_MICROSECOND = dt.timedelta(microseconds=1)
_SECOND = dt.timedelta(seconds=1)
_MINUTE = dt.timedelta(minutes=1)
# Where next_after samples the zone's offsets to bound how far wall and UTC can drift apart;
# one transition per 26 hours is more than any zone has ever had.
_OFFSET_PROBES = tuple(dt.timedelta(hours=hours) for hours in (-26, -13, 0, 13, 26))


def validate_timezone(name: str) -> str:
    """Return ``name`` if it is a known IANA zone, else raise InvalidScheduleError."""
    _zone(name)
    return name


def _zone(name: str) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise InvalidScheduleError(f"unknown time zone {name!r}", field="timezone")
    try:
        return zoneinfo.ZoneInfo(name)
    # ValueError/OSError: keys such as "../x" or a directory; not found: simply unknown.
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidScheduleError(f"unknown time zone {name!r}", field="timezone")


@functools.lru_cache(maxsize=4096)
def _parsed(expression: str) -> CronSpec:
    return parse_cron(expression)


def _require_aware(value: dt.datetime, what: str) -> None:
    if not isinstance(value, dt.datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")


class Timing(abc.ABC):
    """Answers "when is the next run?" for one schedule; pure, no storage."""

    @abc.abstractmethod
    def next_after(self, after: dt.datetime) -> dt.datetime:
        """First run strictly after ``after`` (aware, any tz), as an aware UTC datetime."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Human text for the admin, e.g. "every 5 minutes"."""


def _plural(count: int, unit: str) -> str:
    return f"{count} {unit}" if count == 1 else f"{count} {unit}s"


class IntervalTiming(Timing):
    """Runs at ``anchor + k * every`` for integers k >= 0, in elapsed (UTC) time."""

    def __init__(self, every: dt.timedelta, anchor: dt.datetime) -> None:
        if not isinstance(every, dt.timedelta):
            raise InvalidScheduleError(
                f"every must be a timedelta, not {type(every).__name__}", field="every"
            )
        if every < _SECOND:
            raise InvalidScheduleError(
                f"every must be at least 1 second, got {every}", field="every"
            )
        if not isinstance(anchor, dt.datetime) or anchor.utcoffset() is None:
            raise InvalidScheduleError(
                f"anchor must be a timezone-aware datetime, got {anchor!r}", field="anchor"
            )
        self.every = every
        self.anchor = anchor.astimezone(UTC)
        # Whole microseconds so that millions of periods add up exactly (no float drift).
        self._every_us = every // _MICROSECOND

    def next_after(self, after: dt.datetime) -> dt.datetime:
        _require_aware(after, "after")
        elapsed_us = (after - self.anchor) // _MICROSECOND
        if elapsed_us < 0:
            return self.anchor
        periods = elapsed_us // self._every_us + 1
        return self.anchor + dt.timedelta(microseconds=periods * self._every_us)

    def describe(self) -> str:
        total_us = self._every_us
        days, rest = divmod(total_us, 86_400 * 10**6)
        hours, rest = divmod(rest, 3_600 * 10**6)
        minutes, rest = divmod(rest, 60 * 10**6)
        parts = []
        if days:
            parts.append(_plural(days, "day"))
        if hours:
            parts.append(_plural(hours, "hour"))
        if minutes:
            parts.append(_plural(minutes, "minute"))
        if rest:
            seconds = f"{rest / 10**6:f}".rstrip("0").rstrip(".")
            parts.append(f"{seconds} second" + ("" if seconds == "1" else "s"))
        if len(parts) == 1 and parts[0].startswith("1 "):
            return f"every {parts[0][2:]}"  # "every minute", not "every 1 minute"
        return "every " + " ".join(parts)

    def __repr__(self) -> str:
        return f"IntervalTiming(every={self.every!r}, anchor={self.anchor.isoformat()!r})"


class CronTiming(Timing):
    """A cron expression read on ``timezone``'s wall clock, answered in UTC.

    DST: a wall time skipped by a gap fires once at the first instant after the gap; a wall
    time that occurs twice fires at both occurrences when the hour field starts with "*",
    otherwise only at the first.
    """

    def __init__(self, expression: str, timezone: str) -> None:
        # The master builds one timing per due schedule and round: parse each expression once.
        self._spec: CronSpec = (
            _parsed(expression) if isinstance(expression, str) else parse_cron(expression)
        )
        self._zone = _zone(timezone)
        self.expression = expression
        self.timezone = timezone

    def describe(self) -> str:
        return f"cron {' '.join(self.expression.split())} ({self.timezone})"

    def __repr__(self) -> str:
        return f"CronTiming({self.expression!r}, {self.timezone!r})"

    def _offset(self, instant: dt.datetime) -> dt.timedelta:
        offset = self._zone.utcoffset(instant.astimezone(self._zone))
        assert offset is not None  # a ZoneInfo always knows its offset
        return offset

    def _gap_end(self, earliest: dt.datetime, latest: dt.datetime) -> dt.datetime:
        """The instant a gap ends: the offset changes in (earliest, latest]. Bisection on
        whole seconds, as tzdata transitions are; gaps are rare, so the cost does not matter."""
        after_offset = self._offset(latest)
        low, high = 0, (latest - earliest) // _SECOND
        while high - low > 1:
            middle = (low + high) // 2
            if self._offset(earliest + dt.timedelta(seconds=middle)) == after_offset:
                high = middle
            else:
                low = middle
        return earliest + dt.timedelta(seconds=high)

    def _instants(self, wall: dt.datetime) -> tuple[list[dt.datetime], bool]:
        """The UTC instants a matching naive wall time fires at, and whether it lies in a gap."""
        first = self._zone.utcoffset(wall)  # fold=0: the offset in force before a transition
        second = self._zone.utcoffset(wall.replace(fold=1))
        assert first is not None and second is not None
        early = (wall - first).replace(tzinfo=UTC)
        if first == second:
            return [early], False
        late = (wall - second).replace(tzinfo=UTC)
        if first > second:  # repeated wall time: early is the first occurrence
            return ([early, late] if self._spec.hour_star else [early]), False
        # Skipped wall time: "late" (new offset) falls before the transition, "early" after it.
        return [self._gap_end(late, early)], True

    def next_after(self, after: dt.datetime) -> dt.datetime:
        _require_aware(after, "after")
        after = after.astimezone(UTC)
        offsets = [self._offset(after + probe) for probe in _OFFSET_PROBES]
        lowest, highest = min(offsets), max(offsets)
        # A wall time w fires no earlier than w - highest and no later than w - lowest, so
        # nothing before (after + lowest) on the wall can fire after `after`.
        wall = (after + lowest).replace(tzinfo=None, second=0, microsecond=0)
        best: dt.datetime | None = None
        while True:
            found = self._spec.next_wall(wall)
            if found is None or (best is not None and found - highest >= best.replace(tzinfo=None)):
                break
            instants, in_gap = self._instants(found)
            for instant in instants:
                if instant > after and (best is None or instant < best):
                    best = instant
            wall = found + _MINUTE
            if in_gap:
                # Every wall time of this gap fires at the same instant: jump past the gap.
                end_wall = instants[0].astimezone(self._zone).replace(tzinfo=None)
                wall = max(wall, end_wall)
        if best is None:
            raise OverflowError(f"{self!r} has no run after {after.isoformat()} before year 9999")
        return best


def make_timing(
    *,
    every: float | int | dt.timedelta | None,
    cron: str | None,
    timezone: str,
    anchor: dt.datetime,
) -> Timing:
    """Build the Timing of a schedule definition; raises InvalidScheduleError naming the field."""
    if (every is None) == (cron is None):
        raise InvalidScheduleError("give exactly one of every= or cron=", field="every")
    validate_timezone(timezone)
    if cron is not None:
        return CronTiming(cron, timezone)
    if not (is_number(every) or isinstance(every, dt.timedelta)):
        raise InvalidScheduleError(
            f"every must be seconds (int or float) or a timedelta, not {type(every).__name__}",
            field="every",
        )
    if not isinstance(every, dt.timedelta):
        if not math.isfinite(every):
            raise InvalidScheduleError(f"every must be a finite number, got {every}", field="every")
        try:
            every = dt.timedelta(seconds=every)
        except OverflowError:
            raise InvalidScheduleError(f"every is too large: {every}", field="every")
    return IntervalTiming(every, anchor)


def runs_between(
    timing: Timing, after: dt.datetime, until: dt.datetime, limit: int
) -> list[dt.datetime]:
    """Planned runs r with after < r <= until, oldest first, at most the ``limit`` oldest."""
    runs: list[dt.datetime] = []
    current = after
    while len(runs) < limit:
        current = timing.next_after(current)
        if current > until:
            break
        runs.append(current)
    return runs
