"""Schedule timing without a database: cron parsing and errors, interval arithmetic, time zones
and DST (gaps, repeated hours, a 30-minute shift), checked against a minute-by-minute reference."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Callable

import pytest

from django_reliable_executor.exceptions import InvalidScheduleError, ReliableExecutorError
from django_reliable_executor.schedules.cron import parse_cron
from django_reliable_executor.schedules.timing import (
    CronTiming,
    IntervalTiming,
    Timing,
    make_timing,
    runs_between,
    validate_timezone,
)

UTC = dt.timezone.utc
PARIS = zoneinfo.ZoneInfo("Europe/Paris")
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def utc(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    microsecond: int = 0,
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


def runs(timing: Timing, after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
    return runs_between(timing, after, until, 10_000)


# --- parsing -------------------------------------------------------------------------------


def test_parse_every_syntax() -> None:
    spec = parse_cron("*/15 0-6/2 1,15,20-22 jan-MAR,Dec mon-fri")
    assert spec.minutes == (0, 15, 30, 45)
    assert spec.hours == (0, 2, 4, 6)
    assert spec.days == (1, 15, 20, 21, 22)
    assert spec.months == (1, 2, 3, 12)
    assert spec.weekdays == frozenset({1, 2, 3, 4, 5})
    assert (spec.day_star, spec.weekday_star, spec.hour_star) == (False, False, False)


def test_parse_star_and_single_value_steps() -> None:
    spec = parse_cron("5/20 */6 * * *")
    assert spec.minutes == (5, 25, 45)
    assert spec.hours == (0, 6, 12, 18)
    assert spec.days == tuple(range(1, 32))
    assert spec.months == tuple(range(1, 13))
    assert spec.weekdays == frozenset(range(7))
    assert (spec.day_star, spec.weekday_star, spec.hour_star) == (True, True, True)


def test_parse_names_are_case_insensitive_and_7_is_sunday() -> None:
    assert parse_cron("0 0 * JAN,jun,Sep SUN").months == (1, 6, 9)
    assert parse_cron("0 0 * * Sun").weekdays == frozenset({0})
    assert parse_cron("0 0 * * 7").weekdays == frozenset({0})
    assert parse_cron("0 0 * * 0,7").weekdays == frozenset({0})
    assert parse_cron("0 0 * * 5-7").weekdays == frozenset({5, 6, 0})
    assert parse_cron("0 0 * * fri-sat").weekdays == frozenset({5, 6})


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros(macro: str, equivalent: str) -> None:
    assert parse_cron(macro) == parse_cron(equivalent)


def test_whitespace_separated() -> None:
    assert parse_cron("  0\t3   * *  * ") == parse_cron("0 3 * * *")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "cron '61 * * * *': minute value 61 out of range 0-59"),
        ("* 24 * * *", "cron '* 24 * * *': hour value 24 out of range 0-23"),
        ("* * 0 * *", "cron '* * 0 * *': day-of-month value 0 out of range 1-31"),
        ("* * 32 * *", "cron '* * 32 * *': day-of-month value 32 out of range 1-31"),
        ("* * * 13 *", "cron '* * * 13 *': month value 13 out of range 1-12"),
        ("* * * * 8", "cron '* * * * 8': day-of-week value 8 out of range 0-7"),
        ("* * * *", "got 4"),
        ("* * * * * *", "got 6"),
        ("", "got 0"),
        ("*/0 * * * *", "minute step '0' must be a number >= 1"),
        ("*/x * * * *", "minute step 'x'"),
        ("5-2 * * * *", "minute range '5-2' runs backwards"),
        ("abc * * * *", "minute value 'abc' is not a number or name"),
        ("* * * foo *", "month value 'foo' is not a number or name"),
        ("* * * * mon-bar", "day-of-week value 'bar'"),
        ("* * * * jan", "day-of-week value 'jan'"),
        ("-5 * * * *", "minute value ''"),
        ("1,,2 * * * *", "minute has an empty item"),
        ("@reboot", "unknown macro '@reboot'"),
        ("0 0 30 2 *", "never matches"),
        ("0 0 31 4,6,9,11 *", "never matches"),
    ],
)
def test_bad_expressions(expression: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        CronTiming(expression, "UTC")
    assert caught.value.field == "cron"
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ReliableExecutorError)


def test_day_30_of_february_with_a_weekday_is_fine_by_the_or_rule() -> None:
    timing = CronTiming("0 0 30 2 1", "UTC")
    assert timing.next_after(utc(2026, 2, 1)) == utc(2026, 2, 2)  # a Monday


def test_cron_must_be_a_string() -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        CronTiming(5, "UTC")  # type: ignore[arg-type]
    assert caught.value.field == "cron"


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "", "Europe", "../etc/passwd", "UTC "])
def test_unknown_time_zone(name: str) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        validate_timezone(name)
    assert caught.value.field == "timezone"
    assert repr(name) in str(caught.value)
    with pytest.raises(InvalidScheduleError) as caught:
        CronTiming("* * * * *", name)
    assert caught.value.field == "timezone"


def test_known_time_zones() -> None:
    assert validate_timezone("Europe/Paris") == "Europe/Paris"
    assert validate_timezone("UTC") == "UTC"


def test_attributes_and_describe() -> None:
    timing = CronTiming("0 3 * * *", "Europe/Paris")
    assert (timing.expression, timing.timezone) == ("0 3 * * *", "Europe/Paris")
    assert timing.describe() == "cron 0 3 * * * (Europe/Paris)"
    anchor = utc(2026, 1, 1)
    assert IntervalTiming(dt.timedelta(minutes=5), anchor).describe() == "every 5 minutes"
    assert IntervalTiming(dt.timedelta(minutes=1), anchor).describe() == "every minute"
    assert IntervalTiming(dt.timedelta(hours=1), anchor).describe() == "every hour"
    assert IntervalTiming(dt.timedelta(days=2), anchor).describe() == "every 2 days"
    assert (
        IntervalTiming(dt.timedelta(hours=1, minutes=30), anchor).describe()
        == "every 1 hour 30 minutes"
    )
    assert IntervalTiming(dt.timedelta(seconds=1.5), anchor).describe() == "every 1.5 seconds"


# --- make_timing ---------------------------------------------------------------------------


def test_make_timing_builds_either_kind() -> None:
    anchor = utc(2026, 1, 1)
    interval = make_timing(every=90, cron=None, timezone="UTC", anchor=anchor)
    assert isinstance(interval, IntervalTiming)
    assert interval.next_after(anchor) == utc(2026, 1, 1, 0, 1, 30)
    fractional = make_timing(every=1.5, cron=None, timezone="UTC", anchor=anchor)
    assert fractional.next_after(anchor) == anchor + dt.timedelta(seconds=1.5)
    delta = make_timing(every=dt.timedelta(hours=1), cron=None, timezone="UTC", anchor=anchor)
    assert delta.next_after(anchor) == utc(2026, 1, 1, 1)
    cron = make_timing(every=None, cron="0 3 * * *", timezone="Europe/Paris", anchor=anchor)
    assert isinstance(cron, CronTiming)
    assert cron.next_after(anchor) == utc(2026, 1, 1, 2)


@pytest.mark.parametrize(("every", "cron"), [(None, None), (60, "* * * * *")])
def test_make_timing_needs_exactly_one(every: int | None, cron: str | None) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        make_timing(every=every, cron=cron, timezone="UTC", anchor=utc(2026, 1, 1))
    assert caught.value.field == "every"
    assert str(caught.value) == "give exactly one of every= or cron="


@pytest.mark.parametrize(
    "every", [True, False, "60", 0, 0.5, -60, float("nan"), float("inf"), 1e300]
)
def test_make_timing_refuses_bad_every(every: object) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        make_timing(every=every, cron=None, timezone="UTC", anchor=utc(2026, 1, 1))  # type: ignore[arg-type]
    assert caught.value.field == "every"


def test_make_timing_validates_the_zone_of_intervals_too() -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        make_timing(every=60, cron=None, timezone="Nowhere/Land", anchor=utc(2026, 1, 1))
    assert caught.value.field == "timezone"
    assert "Nowhere/Land" in str(caught.value)


@pytest.mark.parametrize(
    "every", [dt.timedelta(0), dt.timedelta(microseconds=999_999), dt.timedelta(seconds=-5)]
)
def test_interval_must_be_at_least_a_second(every: dt.timedelta) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        IntervalTiming(every, utc(2026, 1, 1))
    assert caught.value.field == "every"


def test_interval_anchor_must_be_aware() -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        IntervalTiming(dt.timedelta(seconds=5), dt.datetime(2026, 1, 1))
    assert caught.value.field == "anchor"


def test_naive_after_is_refused() -> None:
    with pytest.raises(ValueError):
        CronTiming("* * * * *", "UTC").next_after(dt.datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        IntervalTiming(dt.timedelta(seconds=5), utc(2026, 1, 1)).next_after(dt.datetime(2026, 1, 1))


# --- intervals -----------------------------------------------------------------------------


def test_interval_runs_from_the_anchor() -> None:
    anchor = utc(2026, 5, 1, 12)
    timing = IntervalTiming(dt.timedelta(minutes=10), anchor)
    assert timing.next_after(anchor - dt.timedelta(days=3)) == anchor
    assert timing.next_after(anchor - dt.timedelta(microseconds=1)) == anchor
    assert timing.next_after(anchor) == utc(2026, 5, 1, 12, 10)
    assert timing.next_after(utc(2026, 5, 1, 12, 10)) == utc(2026, 5, 1, 12, 20)
    assert timing.next_after(utc(2026, 5, 1, 12, 19, 59)) == utc(2026, 5, 1, 12, 20)


def test_interval_ignores_time_zones_and_answers_in_utc() -> None:
    anchor = dt.datetime(2026, 10, 25, 1, 0, tzinfo=PARIS)  # 23:00 UTC the day before
    timing = IntervalTiming(dt.timedelta(hours=1), anchor)
    result = timing.next_after(dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=PARIS))
    assert result == utc(2026, 10, 25, 2)
    assert result.tzinfo is UTC
    # Elapsed time across the fall-back: 4 runs in 4 real hours, though the wall clock moved 3.
    four_hours_later = anchor.astimezone(UTC) + dt.timedelta(hours=4)
    assert len(runs(timing, anchor, four_hours_later)) == 4


def test_interval_has_no_drift_after_a_million_periods() -> None:
    anchor = utc(2026, 1, 1)
    every = dt.timedelta(seconds=7, microseconds=333_333)
    timing = IntervalTiming(every, anchor)
    millionth = anchor + dt.timedelta(microseconds=10**6 * 7_333_333)
    assert timing.next_after(millionth - dt.timedelta(microseconds=1)) == millionth
    assert timing.next_after(millionth) == millionth + every
    floaty = make_timing(every=1.1, cron=None, timezone="UTC", anchor=anchor)
    assert floaty.next_after(anchor + dt.timedelta(seconds=1_099_999)) == anchor + dt.timedelta(
        seconds=1_100_000
    )


# --- cron basics ---------------------------------------------------------------------------


def test_cron_is_strictly_after_and_ignores_seconds() -> None:
    timing = CronTiming("*/5 * * * *", "UTC")
    assert timing.next_after(utc(2026, 1, 1, 10, 5)) == utc(2026, 1, 1, 10, 10)
    assert timing.next_after(utc(2026, 1, 1, 10, 4, 59, 999_999)) == utc(2026, 1, 1, 10, 5)
    assert timing.next_after(utc(2026, 1, 1, 10, 5, 0, 1)) == utc(2026, 1, 1, 10, 10)
    assert timing.next_after(utc(2026, 12, 31, 23, 58)) == utc(2027, 1, 1)
    result = timing.next_after(dt.datetime(2026, 1, 1, 11, 7, tzinfo=PARIS))
    assert result == utc(2026, 1, 1, 10, 10)
    assert result.tzinfo is UTC


def test_leap_day() -> None:
    timing = CronTiming("0 0 29 2 *", "UTC")
    assert timing.next_after(utc(2025, 3, 1)) == utc(2028, 2, 29)
    assert timing.next_after(utc(2028, 2, 29)) == utc(2032, 2, 29)
    assert timing.next_after(utc(2097, 1, 1)) == utc(2104, 2, 29)  # 2100 is no leap year


def test_month_ends() -> None:
    timing = CronTiming("0 0 31 * *", "UTC")
    months = [run.month for run in runs(timing, utc(2026, 1, 1), utc(2027, 1, 1))]
    assert months == [1, 3, 5, 7, 8, 10, 12]


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    may = (utc(2026, 4, 30), utc(2026, 5, 31))
    both = [run.day for run in runs(CronTiming("0 0 13 * 5", "UTC"), *may)]
    assert both == [1, 8, 13, 15, 22, 29]  # every Friday, and the 13th (a Wednesday)
    assert [run.day for run in runs(CronTiming("0 0 13 * *", "UTC"), *may)] == [13]
    assert [run.day for run in runs(CronTiming("0 0 * * fri", "UTC"), *may)] == [1, 8, 15, 22, 29]
    # Vixie cron: a day field starting with "*" makes the two fields combine with AND.
    odd_fridays = [run.day for run in runs(CronTiming("0 0 */2 * 5", "UTC"), *may)]
    assert odd_fridays == [1, 15, 29]


def test_runs_between_keeps_the_oldest_within_the_limit() -> None:
    timing = CronTiming("0 * * * *", "UTC")
    after, until = utc(2026, 1, 1), utc(2026, 1, 1, 5)
    assert runs_between(timing, after, until, 100) == [utc(2026, 1, 1, h) for h in range(1, 6)]
    assert runs_between(timing, after, until, 2) == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)]
    assert runs_between(timing, after, until, 0) == []
    assert runs_between(timing, until, after, 10) == []
    interval = IntervalTiming(dt.timedelta(hours=2), utc(2026, 1, 1, 1))
    assert runs_between(interval, after, until, 10) == [utc(2026, 1, 1, h) for h in (1, 3, 5)]


# --- DST -----------------------------------------------------------------------------------
# Paris 2026: 02:00 CET -> 03:00 CEST on 29 March (01:00 UTC); 03:00 CEST -> 02:00 CET on
# 25 October (01:00 UTC). New York 2026: 02:00 EST -> 03:00 EDT on 8 March (07:00 UTC);
# 02:00 EDT -> 01:00 EST on 1 November (06:00 UTC). Lord Howe (30-minute shift): 02:00 +11 ->
# 01:30 +10:30 on 5 April 2026 (15:00 UTC on the 4th); 02:00 +10:30 -> 02:30 +11 on 4 October
# (15:30 UTC on the 3rd).


@pytest.mark.parametrize(
    ("expression", "zone", "after", "until", "expected"),
    [
        # Spring-forward gaps: the skipped wall times fire once, at the end of the gap.
        ("30 2 * * *", "Europe/Paris", utc(2026, 3, 28, 2), utc(2026, 3, 30, 2),
         [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]),
        ("*/20 2 * * *", "Europe/Paris", utc(2026, 3, 28, 23), utc(2026, 3, 29, 23),
         [utc(2026, 3, 29, 1)]),
        ("0,30 2,3 * * *", "Europe/Paris", utc(2026, 3, 28, 23), utc(2026, 3, 29, 23),
         [utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30)]),
        ("*/30 * * * *", "Europe/Paris", utc(2026, 3, 29, 0), utc(2026, 3, 29, 2),
         [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30),
          utc(2026, 3, 29, 2)]),
        ("30 2 * * *", "America/New_York", utc(2026, 3, 7, 8), utc(2026, 3, 9, 8),
         [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)]),
        ("15 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 2, 15), utc(2026, 10, 4, 16),
         [utc(2026, 10, 2, 15, 45), utc(2026, 10, 3, 15, 30), utc(2026, 10, 4, 15, 15)]),
        ("0,40 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 3, 0), utc(2026, 10, 4, 0),
         [utc(2026, 10, 3, 15, 30), utc(2026, 10, 3, 15, 40)]),
        # Fall-back repeats: a fixed hour fires at the first occurrence only ...
        ("30 2 * * *", "Europe/Paris", utc(2026, 10, 24, 2), utc(2026, 10, 26, 2),
         [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]),
        ("30 1 * * *", "America/New_York", utc(2026, 10, 31, 6), utc(2026, 11, 2, 7),
         [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]),
        ("45 1 * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 0), utc(2026, 4, 5, 0),
         [utc(2026, 4, 4, 14, 45)]),
        # ... a wildcard hour at both, keeping real-time spacing through the repeated hour.
        ("*/15 * * * *", "Europe/Paris", utc(2026, 10, 24, 23, 50), utc(2026, 10, 25, 2),
         [utc(2026, 10, 24, 23, 0) + dt.timedelta(minutes=m) for m in range(60, 181, 15)]),
        ("0 * * * *", "Europe/Paris", utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 3),
         [utc(2026, 10, 25, h) for h in (0, 1, 2, 3)]),
        ("*/30 * * * *", "America/New_York", utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 7, 15),
         [utc(2026, 11, 1, 5) + dt.timedelta(minutes=m) for m in range(0, 121, 30)]),
        ("*/15 * * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 14, 20), utc(2026, 4, 4, 15, 20),
         [utc(2026, 4, 4, 14, 30) + dt.timedelta(minutes=m) for m in range(0, 46, 15)]),
        ("45 */1 * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 14), utc(2026, 4, 4, 16),
         [utc(2026, 4, 4, 14, 45), utc(2026, 4, 4, 15, 15)]),
    ],
)  # fmt: skip
def test_dst_transitions(
    expression: str, zone: str, after: dt.datetime, until: dt.datetime, expected: list[dt.datetime]
) -> None:
    assert runs(CronTiming(expression, zone), after, until) == expected


@pytest.mark.parametrize(
    ("expression", "fold", "expected"),
    [
        ("*/15 * * * *", 0, utc(2026, 10, 25, 0, 15)),
        ("*/15 * * * *", 1, utc(2026, 10, 25, 1, 15)),
        ("30 2 * * *", 0, utc(2026, 10, 25, 0, 30)),
        ("30 2 * * *", 1, utc(2026, 10, 26, 1, 30)),
        ("5 2 * * *", 0, utc(2026, 10, 26, 1, 5)),
        # The next run is an earlier wall time: 02:00 again, at its second occurrence.
        ("0 * * * *", 0, utc(2026, 10, 25, 1)),
        ("0 * * * *", 1, utc(2026, 10, 25, 2)),
    ],
)
def test_after_inside_the_repeated_hour_paris(
    expression: str, fold: int, expected: dt.datetime
) -> None:
    after = dt.datetime(2026, 10, 25, 2, 10, fold=fold, tzinfo=PARIS)
    assert CronTiming(expression, "Europe/Paris").next_after(after) == expected


@pytest.mark.parametrize(
    ("expression", "fold", "expected"),
    [
        ("*/20 * * * *", 0, utc(2026, 11, 1, 5, 40)),
        ("*/20 * * * *", 1, utc(2026, 11, 1, 6, 40)),
        ("40 1 * * *", 0, utc(2026, 11, 1, 5, 40)),
        ("40 1 * * *", 1, utc(2026, 11, 2, 6, 40)),
        ("0 * * * *", 0, utc(2026, 11, 1, 6)),
        ("0 * * * *", 1, utc(2026, 11, 1, 7)),
    ],
)
def test_after_inside_the_repeated_hour_new_york(
    expression: str, fold: int, expected: dt.datetime
) -> None:
    after = dt.datetime(2026, 11, 1, 1, 30, fold=fold, tzinfo=NEW_YORK)
    assert CronTiming(expression, "America/New_York").next_after(after) == expected


def test_after_right_before_and_right_after_a_gap() -> None:
    just_before = utc(2026, 3, 29, 0, 59, 59)
    assert CronTiming("30 2 * * *", "Europe/Paris").next_after(just_before) == utc(2026, 3, 29, 1)
    assert CronTiming("*/15 * * * *", "Europe/Paris").next_after(just_before) == utc(2026, 3, 29, 1)
    at_end = utc(2026, 3, 29, 1)
    assert CronTiming("*/15 * * * *", "Europe/Paris").next_after(at_end) == utc(2026, 3, 29, 1, 15)
    assert CronTiming("30 2 * * *", "Europe/Paris").next_after(at_end) == utc(2026, 3, 30, 0, 30)


# --- brute force ---------------------------------------------------------------------------
# The reference walks every UTC minute of 2026, reads the wall clock, and applies the rules
# directly: a matching wall time fires at its first occurrence (fold 0), and at its second too
# when the hour is a wildcard; the first instant after a gap fires if any skipped wall minute
# matches. Predicates are written by hand, independently of the parser.

Predicate = Callable[[dt.datetime], bool]
SUNDAY = 6  # Python's weekday()

CASES: dict[str, list[tuple[str, bool, Predicate]]] = {
    "Europe/Paris": [
        ("*/15 * * * *", True, lambda w: w.minute % 15 == 0),
        ("30 2 * * *", False, lambda w: (w.hour, w.minute) == (2, 30)),
        ("0,45 1-3 * * 0", False, lambda w: w.minute in (0, 45) and 1 <= w.hour <= 3
         and w.weekday() == SUNDAY),
        ("0 12 13 * 5", False, lambda w: (w.hour, w.minute) == (12, 0)
         and (w.day == 13 or w.weekday() == 4)),
    ],
    "America/New_York": [
        ("*/20 * * * *", True, lambda w: w.minute % 20 == 0),
        ("30 1,2 * * *", False, lambda w: w.minute == 30 and w.hour in (1, 2)),
        ("10 */1 * 3,11 *", True, lambda w: w.minute == 10 and w.month in (3, 11)),
    ],
    "Australia/Lord_Howe": [
        ("*/10 * * * *", True, lambda w: w.minute % 10 == 0),
        ("15,45 1,2 * * *", False, lambda w: w.minute in (15, 45) and w.hour in (1, 2)),
        ("0 2 * * *", False, lambda w: (w.hour, w.minute) == (2, 0)),
    ],
}  # fmt: skip


def reference_runs(zone_name: str) -> dict[str, list[dt.datetime]]:
    zone = zoneinfo.ZoneInfo(zone_name)
    found: dict[str, list[dt.datetime]] = {expression: [] for expression, _, _ in CASES[zone_name]}
    minute = dt.timedelta(minutes=1)
    instant = utc(2026, 1, 1) + minute
    previous_offset = instant.astimezone(zone).utcoffset()
    end = utc(2027, 1, 1)
    while instant <= end:
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        offset = local.utcoffset()
        assert offset is not None and previous_offset is not None
        skipped = []
        if offset > previous_offset:  # a gap just ended: list the wall minutes it skipped
            first = wall - (offset - previous_offset)
            skipped = [first + k * minute for k in range((wall - first) // minute)]
        for expression, hour_star, matches in CASES[zone_name]:
            fires = matches(wall) and (local.fold == 0 or hour_star)
            if fires or any(matches(gone) for gone in skipped):
                found[expression].append(instant)
        previous_offset = offset
        instant += minute
    return found


@pytest.mark.parametrize("zone_name", sorted(CASES))
def test_agrees_with_minute_by_minute_reference_over_a_year(zone_name: str) -> None:
    expected = reference_runs(zone_name)
    for expression, _, _ in CASES[zone_name]:
        timing = CronTiming(expression, zone_name)
        actual = []
        current = utc(2026, 1, 1)
        while True:
            current = timing.next_after(current)
            if current > utc(2027, 1, 1):
                break
            actual.append(current)
        assert actual == expected[expression], expression
        assert len(actual) > 0
