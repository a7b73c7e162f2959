"""Five-field cron expressions: parsing, validation and naive wall-clock matching."""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
from dataclasses import dataclass

from ..exceptions import InvalidScheduleError

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
DAY_NAMES = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}

# A leap year, so that "29 2" counts as a day that exists (it does, every four years or so).
_MAX_MONTH_DAYS = {month: calendar.monthrange(2000, month)[1] for month in range(1, 13)}

# The search gives up after this year: datetime cannot go further.
_LAST_YEAR = dt.MAXYEAR


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    # The top of "*" and of "a/n"; day-of-week accepts 7 (Sunday) but "*" must not count it twice.
    star_high: int
    names: dict[str, int]


_FIELDS = (
    _FieldSpec("minute", 0, 59, 59, {}),
    _FieldSpec("hour", 0, 23, 23, {}),
    _FieldSpec("day-of-month", 1, 31, 31, {}),
    _FieldSpec("month", 1, 12, 12, MONTH_NAMES),
    _FieldSpec("day-of-week", 0, 7, 6, DAY_NAMES),
)


@dataclass(frozen=True)
class CronSpec:
    """A parsed expression: the allowed values of each field, sorted, plus the star flags."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday (7 already folded into 0)
    day_star: bool  # the day-of-month field starts with "*"
    weekday_star: bool  # the day-of-week field starts with "*"
    hour_star: bool  # the hour field starts with "*": repeated wall times fire twice

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """Vixie cron's rule: both day fields restricted means either may match."""
        in_days = day in self.days
        # Python's Monday=0 becomes cron's Sunday=0.
        in_weekdays = (calendar.weekday(year, month, day) + 1) % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            return in_days and in_weekdays
        return in_days or in_weekdays

    def matches(self, wall: dt.datetime) -> bool:
        """Whether the naive wall time (its minute) is one the expression selects."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_matches(wall.year, wall.month, wall.day)
        )

    def next_wall(self, start: dt.datetime) -> dt.datetime | None:
        """First matching naive wall minute at or after ``start`` (seconds ignored), jumping
        field by field; None when nothing matches before the end of datetime's range."""
        year, month, day = start.year, start.month, start.day
        hour, minute = start.hour, start.minute
        while year <= _LAST_YEAR:
            index = bisect.bisect_left(self.months, month)
            if index == len(self.months):
                year, month, day, hour, minute = year + 1, self.months[0], 1, 0, 0
                continue
            if self.months[index] != month:
                month, day, hour, minute = self.months[index], 1, 0, 0
            month_days = calendar.monthrange(year, month)[1]
            if day > month_days:
                month, day, hour, minute = month + 1, 1, 0, 0
                if month > 12:
                    year, month = year + 1, 1
                continue
            if not self.day_matches(year, month, day):
                day, hour, minute = day + 1, 0, 0
                continue
            index = bisect.bisect_left(self.hours, hour)
            if index == len(self.hours):
                day, hour, minute = day + 1, 0, 0
                continue
            if self.hours[index] != hour:
                hour, minute = self.hours[index], 0
            index = bisect.bisect_left(self.minutes, minute)
            if index == len(self.minutes):
                hour, minute = hour + 1, 0
                if hour > 23:
                    day, hour = day + 1, 0
                continue
            return dt.datetime(year, month, day, hour, self.minutes[index])
        return None


def _refuse(expression: str, problem: str) -> InvalidScheduleError:
    return InvalidScheduleError(f"cron {expression!r}: {problem}", field="cron")


def _value(expression: str, field: _FieldSpec, text: str) -> int:
    lowered = text.lower()
    if lowered in field.names:
        return field.names[lowered]
    if not text.isdigit():
        raise _refuse(expression, f"{field.name} value {text!r} is not a number or name")
    number = int(text)
    if not field.low <= number <= field.high:
        raise _refuse(
            expression, f"{field.name} value {number} out of range {field.low}-{field.high}"
        )
    return number


def _parse_field(expression: str, field: _FieldSpec, text: str) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise _refuse(expression, f"{field.name} step {step_text!r} must be a number >= 1")
            step = int(step_text)
        if base == "*":
            first, last = field.low, field.star_high
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            first = _value(expression, field, first_text)
            last = _value(expression, field, last_text)
            if first > last:
                raise _refuse(expression, f"{field.name} range {base!r} runs backwards")
        elif base:
            first = _value(expression, field, base)
            # "a/n" means "a-max/n"; a bare "a" is the single value.
            last = max(first, field.star_high) if slash else first
        else:
            raise _refuse(expression, f"{field.name} has an empty item in {text!r}")
        values.update(range(first, last + 1, step))
    return values


def parse_cron(expression: str) -> CronSpec:
    """Parse and validate; raises InvalidScheduleError(field="cron") naming the bad part."""
    if not isinstance(expression, str):
        raise InvalidScheduleError(
            f"cron must be a string, not {type(expression).__name__}", field="cron"
        )
    text = expression.strip()
    if text.startswith("@"):
        if text.lower() not in MACROS:
            known = ", ".join(MACROS)
            raise _refuse(expression, f"unknown macro {text!r} (known: {known})")
        text = MACROS[text.lower()]
    parts = text.split()
    if len(parts) != len(_FIELDS):
        raise _refuse(
            expression,
            f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}",
        )
    minutes, hours, days, months, weekdays = (
        _parse_field(expression, field, part) for field, part in zip(_FIELDS, parts, strict=True)
    )
    spec = CronSpec(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=tuple(sorted(days)),
        months=tuple(sorted(months)),
        weekdays=frozenset(day % 7 for day in weekdays),
        day_star=parts[2].startswith("*"),
        weekday_star=parts[4].startswith("*"),
        hour_star=parts[1].startswith("*"),
    )
    # Under the OR rule any weekday saves the day; under AND a day-of-month that exists in one
    # of the months suffices, since every calendar date falls on every weekday over the years.
    either = not (spec.day_star or spec.weekday_star)
    if not either and not any(
        day <= _MAX_MONTH_DAYS[month] for month in spec.months for day in spec.days
    ):
        raise _refuse(expression, "never matches (no selected month has such a day-of-month)")
    return spec
