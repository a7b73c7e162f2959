"""A schedule's timing in plain words ("every weekday at 09:00 (Europe/Paris)"), for people.

Pure, no I/O. The words must never be wrong: a cron expression whose fields make no short
sentence falls back to a literal reading of its fields ("at minute 5,17 past hours 1-3"),
which is longer but exact. Cron is read as ``schedules.cron`` runs it (Vixie cron's rule: when
both day fields are restricted and neither starts with "*", either may match).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .cron import CronSpec, parse_cron
from .records import ScheduleInfo
from .timing import IntervalTiming

__all__ = ["describe_cron", "describe_every", "describe_schedule"]

DAY_WORDS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MONTH_WORDS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
ALL_MINUTES = tuple(range(60))
ALL_HOURS = tuple(range(24))
ALL_DAYS = tuple(range(1, 32))
ALL_MONTHS = tuple(range(1, 13))
ALL_WEEKDAYS = frozenset(range(7))
WEEKDAYS = frozenset(range(1, 6))
# Up to this many clock times (hours x minutes) are listed ("at 08:00 and 17:00"); more read
# better as their fields.
MAX_TIMES = 4
# Up to this many values of a field are named one by one ("every Monday and Thursday").
MAX_NAMED = 4


def describe_schedule(schedule: ScheduleInfo) -> str:
    """The schedule's timing in plain words: its interval, or its cron expression read on its
    time zone's clock (the zone named when the words give a time of day or a day)."""
    if schedule.cron is not None:
        return describe_cron(schedule.cron, schedule.timezone)
    assert schedule.every is not None  # a stored schedule has exactly one of the two
    return describe_every(schedule.every)


def describe_every(every: dt.timedelta) -> str:
    """ "every 15 minutes", "every hour", "every 1 hour 30 minutes"."""
    return IntervalTiming(every, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)).describe()


def describe_cron(expression: str, timezone: str | None = None) -> str:
    """A cron expression in words; raises InvalidScheduleError as ``parse_cron`` does."""
    spec = parse_cron(expression)
    times, clock = _times(spec)
    days = _days(spec)
    if days is None:
        text = f"{times} {_literal_days(spec)}"
    else:
        every_form, on_form = days
        if clock and every_form:
            text = f"{every_form} {times}"  # "every weekday at 09:00"
        else:
            text = " ".join(part for part in (times, on_form) if part)
    minute_only = (
        spec.hours == ALL_HOURS
        and spec.days == ALL_DAYS
        and spec.months == ALL_MONTHS
        and spec.weekdays == ALL_WEEKDAYS
    )
    if minute_only and timezone and not _on_the_hour_everywhere(spec.minutes, timezone):
        minute_only = False  # "at minute 5" in India is minute 35 in UTC: say which clock
    return text if minute_only or not timezone else f"{text} ({timezone})"


def _on_the_hour_everywhere(minutes: Sequence[int], timezone: str) -> bool:
    """Whether minutes-only words read true on any clock: they name no minute (every minute,
    every n minutes, every hour), or ``timezone`` is a whole number of hours off UTC (its
    January and July offsets this year; an unknown zone counts as not)."""
    if minutes in (ALL_MINUTES, (0,)) or _step_from_zero(minutes, 60):
        return True
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    year = dt.date.today().year
    for month in (1, 7):
        offset = dt.datetime(year, month, 1, tzinfo=zone).utcoffset() or dt.timedelta()
        if offset % dt.timedelta(hours=1):
            return False
    return True


# -- times of day -----------------------------------------------------------------------------
def _times(spec: CronSpec) -> tuple[str, bool]:
    """The time-of-day part, and whether it names clock times ("at 09:00")."""
    minutes, hours = spec.minutes, spec.hours
    step = _step_from_zero(minutes, 60)
    if hours == ALL_HOURS:
        if minutes == ALL_MINUTES:
            return "every minute", False
        if step:
            return f"every {step} minutes", False
        if minutes == (0,):
            return "every hour", False
        if len(minutes) <= MAX_NAMED:
            label = "minute" if len(minutes) == 1 else "minutes"
            return f"every hour at {label} {_and(str(m) for m in minutes)}", False
        return f"at minute {_compact(minutes)} past every hour", False
    hour_step = _step_from_zero(hours, 24)
    if hour_step and len(hours) > 2 and len(minutes) == 1:
        minute = minutes[0]
        tail = f" at minute {minute}" if minute else ""
        return f"every {hour_step} hours{tail}", False
    if len(hours) * len(minutes) <= MAX_TIMES:
        return "at " + _and(_clock(h, m) for h in hours for m in minutes), True
    if _contiguous(hours):
        first, last = _clock(hours[0], minutes[0]), _clock(hours[-1], minutes[-1])
        if minutes == ALL_MINUTES:
            return f"every minute from {first} to {last}", False
        if step:
            return f"every {step} minutes from {first} to {last}", False
        if len(minutes) == 1:
            return f"every hour from {first} to {last}", False
    if minutes == ALL_MINUTES:
        return f"every minute of hours {_compact(hours)}", False
    return f"at minute {_compact(minutes)} past hours {_compact(hours)}", False


def _step_from_zero(values: Sequence[int], size: int) -> int | None:
    """n > 1 when ``values`` are 0, n, 2n, ... up to ``size`` and n divides ``size`` (so the
    runs are evenly spaced, also across the hour or the day)."""
    if len(values) < 2 or values[0] != 0:
        return None
    step = values[1]
    if step < 2 or size % step or tuple(range(0, size, step)) != tuple(values):
        return None
    return step


def _contiguous(values: Sequence[int]) -> bool:
    return tuple(values) == tuple(range(values[0], values[-1] + 1))


def _clock(hour: int, minute: int) -> str:
    return f"{hour:02d}:{minute:02d}"


# -- days -------------------------------------------------------------------------------------
def _days(spec: CronSpec) -> tuple[str, str] | None:
    """The day part as ("every ..." form or "", "on ..." form); None when it takes the
    literal form."""
    days_all = spec.days == ALL_DAYS
    weekdays_all = spec.weekdays == ALL_WEEKDAYS
    either = not (spec.day_star or spec.weekday_star)  # Vixie's OR rule
    if either and (days_all or weekdays_all):
        days_all = weekdays_all = True  # one field matching every day: every day matches
    months = _months(spec.months)
    if days_all and weekdays_all:
        return ("every day" + months, months.strip()) if months else ("every day", "")
    if days_all:  # weekdays only
        named = _weekdays(spec.weekdays)
        if named is None:
            return None
        every_form, on_form = named
        return every_form + months, on_form + months
    if weekdays_all:  # days of the month only
        dates = _dates(spec.days, spec.months)
        return None if dates is None else ("", dates)
    if not either:
        return None  # both restricted and both must match: literal
    dates = _dates(spec.days, spec.months)
    named = _weekdays(spec.weekdays)
    if dates is None or named is None:
        return None
    return "", f"{dates} and {named[1]}{months}"


def _weekdays(weekdays: frozenset[int]) -> tuple[str, str] | None:
    """("every weekday", "on weekdays"), ("every Monday and Thursday", "on Mondays and
    Thursdays"), ("every Monday to Wednesday", "on Monday to Wednesday")."""
    if weekdays == WEEKDAYS:
        return "every weekday", "on weekdays"
    if weekdays == frozenset({0, 6}):
        return "every Saturday and Sunday", "on Saturdays and Sundays"
    ordered = sorted(weekdays, key=lambda day: (day - 1) % 7)  # Monday first, Sunday last
    if len(ordered) <= MAX_NAMED:
        every_form = _and(DAY_WORDS[day] for day in ordered)
        return f"every {every_form}", "on " + _and(DAY_WORDS[day] + "s" for day in ordered)
    monday_based = [(day - 1) % 7 for day in ordered]
    if _contiguous(monday_based):
        span = f"{DAY_WORDS[ordered[0]]} to {DAY_WORDS[ordered[-1]]}"
        return f"every {span}", f"on {span}"
    return None


def _dates(days: Sequence[int], months: Sequence[int]) -> str | None:
    """ "on the 1st of each month", "on the 1st and 15th of January"."""
    if len(days) <= MAX_NAMED:
        named = _and(_ordinal(day) for day in days)
    elif _contiguous(days):
        named = f"{_ordinal(days[0])} to {_ordinal(days[-1])}"
    else:
        return None
    if tuple(months) == ALL_MONTHS:
        return f"on the {named} of each month"
    listed = _month_names(months)
    return None if listed is None else f"on the {named} of {listed}"


def _months(months: Sequence[int]) -> str:
    """ " in January and July" (empty for every month; the literal form when long)."""
    if tuple(months) == ALL_MONTHS:
        return ""
    listed = _month_names(months)
    return f" in {listed}" if listed else f" in months {_compact(months)}"


def _month_names(months: Sequence[int]) -> str | None:
    if len(months) <= MAX_NAMED:
        return _and(MONTH_WORDS[month - 1] for month in months)
    if _contiguous(months):
        return f"{MONTH_WORDS[months[0] - 1]} to {MONTH_WORDS[months[-1] - 1]}"
    return None


def _literal_days(spec: CronSpec) -> str:
    """The day fields as they read: "on day-of-month 1-7 if also a Monday"..."""
    parts = []
    if spec.days != ALL_DAYS:
        parts.append(f"day-of-month {_compact(spec.days)}")
    if spec.weekdays != ALL_WEEKDAYS:
        names = ",".join(DAY_WORDS[day][:3] for day in sorted(spec.weekdays))
        parts.append(f"day-of-week {names}")
    joiner = " or " if not (spec.day_star or spec.weekday_star) else " and "
    text = "on " + joiner.join(parts) if parts else "every day"
    if spec.months != ALL_MONTHS:
        text += f" in months {_compact(spec.months)}"
    return text


# -- words ------------------------------------------------------------------------------------
def _and(items: Iterable[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    words = list(items)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _ordinal(number: int) -> str:
    suffix = (
        "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number}{suffix}"


def _compact(values: Sequence[int]) -> str:
    """1,2,3,5,17 -> "1-3,5,17"."""
    runs: list[str] = []
    start = previous = values[0]
    for value in [*values[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        if previous - start >= 2:
            runs.append(f"{start}-{previous}")
        else:
            runs.extend(str(v) for v in range(start, previous + 1))
        if value is not None:
            start = previous = value
    return ",".join(runs)
