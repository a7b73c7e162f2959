"""Schedules in plain words (schedules/describing.py), a table of expressions and what they
read as; the next fire times the pages show across the Europe/Paris DST changes; and the
drawing of a schedule's last 24 hours."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from django_reliable_executor.admin import schedule_activity
from django_reliable_executor.admin.schedule_activity import Hour, draw, upcoming
from django_reliable_executor.exceptions import InvalidScheduleError
from django_reliable_executor.schedules.cron import parse_cron
from django_reliable_executor.schedules.describing import (
    describe_cron,
    describe_every,
    describe_schedule,
)
from django_reliable_executor.schedules.records import ScheduleInfo

UTC = dt.timezone.utc
PARIS = "Europe/Paris"

WORDS = [
    # The examples.
    ("0 9 * * 1-5", "every weekday at 09:00 (Europe/Paris)"),
    ("*/15 * * * *", "every 15 minutes"),
    ("30 2 1 * *", "at 02:30 on the 1st of each month (Europe/Paris)"),
    ("0 8,17 * * 1,4", "every Monday and Thursday at 08:00 and 17:00 (Europe/Paris)"),
    ("5,17 1-3 * * *", "at minute 5,17 past hours 1-3 (Europe/Paris)"),
    # Minutes and hours.
    ("* * * * *", "every minute"),
    ("*/1 * * * *", "every minute"),
    ("0 * * * *", "every hour"),
    ("@hourly", "every hour"),
    ("5 * * * *", "every hour at minute 5"),
    ("0,30 * * * *", "every 30 minutes"),
    ("5/15 * * * *", "every hour at minutes 5, 20, 35 and 50"),
    ("*/7 * * * *", "at minute 0,7,14,21,28,35,42,49,56 past every hour"),
    ("0-4 * * * *", "at minute 0-4 past every hour"),
    ("0 */2 * * *", "every 2 hours (Europe/Paris)"),
    ("30 */6 * * *", "every 6 hours at minute 30 (Europe/Paris)"),
    ("0 0,12 * * *", "every day at 00:00 and 12:00 (Europe/Paris)"),
    ("0,30 9 * * *", "every day at 09:00 and 09:30 (Europe/Paris)"),
    ("0 9-17 * * *", "every hour from 09:00 to 17:00 (Europe/Paris)"),
    ("30 9-17 * * *", "every hour from 09:30 to 17:30 (Europe/Paris)"),
    ("*/15 9-17 * * 1-5", "every 15 minutes from 09:00 to 17:45 on weekdays (Europe/Paris)"),
    ("* 9 * * *", "every minute from 09:00 to 09:59 (Europe/Paris)"),
    ("* 1,3 * * *", "every minute of hours 1,3 (Europe/Paris)"),
    ("0 3 * * *", "every day at 03:00 (Europe/Paris)"),
    ("@daily", "every day at 00:00 (Europe/Paris)"),
    ("0 1,5,9,13,17 * * *", "at minute 0 past hours 1,5,9,13,17 (Europe/Paris)"),
    # Days of the week.
    ("@weekly", "every Sunday at 00:00 (Europe/Paris)"),
    ("15 10 * * 7", "every Sunday at 10:15 (Europe/Paris)"),
    ("0 9 * * 1-3", "every Monday, Tuesday and Wednesday at 09:00 (Europe/Paris)"),
    ("0 9 * * 0,6", "every Saturday and Sunday at 09:00 (Europe/Paris)"),
    ("0 9 * * mon-sat", "every Monday to Saturday at 09:00 (Europe/Paris)"),
    ("0 9 * * 1,3,5,6,0", "at 09:00 on day-of-week Sun,Mon,Wed,Fri,Sat (Europe/Paris)"),
    ("*/10 * * * 1-5", "every 10 minutes on weekdays (Europe/Paris)"),
    ("0 * * * 2,4", "every hour on Tuesdays and Thursdays (Europe/Paris)"),
    # Days of the month, months.
    ("0 9 1,15 * *", "at 09:00 on the 1st and 15th of each month (Europe/Paris)"),
    ("0 12 31 * *", "at 12:00 on the 31st of each month (Europe/Paris)"),
    ("0 0 2,3,22,23 * *", "at 00:00 on the 2nd, 3rd, 22nd and 23rd of each month (Europe/Paris)"),
    ("0 0 11-13 * *", "at 00:00 on the 11th, 12th and 13th of each month (Europe/Paris)"),
    ("0 0 1-10 * *", "at 00:00 on the 1st to 10th of each month (Europe/Paris)"),
    ("0 0 1,3,5,7,9 * *", "at 00:00 on day-of-month 1,3,5,7,9 (Europe/Paris)"),
    ("@yearly", "at 00:00 on the 1st of January (Europe/Paris)"),
    ("0 0 29 2 *", "at 00:00 on the 29th of February (Europe/Paris)"),
    ("0 9 * 1-3 *", "every day in January, February and March at 09:00 (Europe/Paris)"),
    ("0 9 * 1-6 *", "every day in January to June at 09:00 (Europe/Paris)"),
    ("0 9 * 1,3,5,7,9 *", "every day in months 1,3,5,7,9 at 09:00 (Europe/Paris)"),
    ("0 8 * jan,jul mon", "every Monday in January and July at 08:00 (Europe/Paris)"),
    ("0 6 1 1,4,7,10 *", "at 06:00 on the 1st of January, April, July and October (Europe/Paris)"),
    # Both day fields restricted: either matches (Vixie cron)...
    ("0 9 1 * 1", "at 09:00 on the 1st of each month and on Mondays (Europe/Paris)"),
    ("0 9 1-31 * 1", "every day at 09:00 (Europe/Paris)"),  # every day matches the first
    # ... unless one starts with "*": then both must.
    (
        "0 9 */2 * 1",
        "at 09:00 on day-of-month 1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31 and day-of-week "
        "Mon (Europe/Paris)",
    ),
]


@pytest.mark.parametrize(("expression", "words"), WORDS)
def test_cron_in_words(expression: str, words: str) -> None:
    assert describe_cron(expression, PARIS) == words


def test_without_a_zone_no_zone_is_named() -> None:
    assert describe_cron("0 9 * * 1-5") == "every weekday at 09:00"


def test_minutes_past_the_hour_name_a_zone_off_the_hour() -> None:
    # India's clock is 5:30 off UTC: minute 5 there is minute 35 in UTC (and in Paris), so
    # the words must say on which clock; a step or "every hour" reads true on any clock.
    assert describe_cron("5 * * * *", "Asia/Kolkata") == "every hour at minute 5 (Asia/Kolkata)"
    assert describe_cron("5,20 * * * *", "Asia/Kathmandu").endswith("(Asia/Kathmandu)")
    assert describe_cron("*/20 * * * *", "Asia/Kolkata") == "every 20 minutes"
    assert describe_cron("0 * * * *", "Asia/Kolkata") == "every hour"
    assert describe_cron("5 * * * *", "America/New_York") == "every hour at minute 5"


def test_a_bad_expression_raises_as_parsing_does() -> None:
    with pytest.raises(InvalidScheduleError, match="minute value 61"):
        describe_cron("61 * * * *")


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (1, "every second"),
        (90, "every 1 minute 30 seconds"),
        (900, "every 15 minutes"),
        (3600, "every hour"),
        (86400, "every day"),
        (1.5, "every 1.5 seconds"),
    ],
)
def test_intervals_in_words(seconds: float, words: str) -> None:
    assert describe_every(dt.timedelta(seconds=seconds)) == words


def schedule(cron: str | None = None, every: float | None = None, tz: str = PARIS) -> ScheduleInfo:
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    return ScheduleInfo(
        schedule_id="s",
        task_name="t",
        parameter=None,
        every=None if every is None else dt.timedelta(seconds=every),
        cron=cron,
        timezone=tz,
        start_at=start,
        misfire="skip",
        queue="default",
        priority=0,
        retry_limit=0,
        retry_interval=1000,
        retry_backoff="fixed",
        max_duration_millis=None,
        paused=False,
        next_run_at=start,
        last_run_at=None,
        last_task_id=None,
        origin="api",
        created_at=start,
        updated_at=start,
    )


def test_describe_schedule_reads_either_kind() -> None:
    assert (
        describe_schedule(schedule(cron="0 9 * * 1-5")) == "every weekday at 09:00 (Europe/Paris)"
    )
    assert describe_schedule(schedule(every=900)) == "every 15 minutes"


@pytest.mark.parametrize(("expression", "_words"), WORDS)
def test_the_words_never_contradict_the_fires(expression: str, _words: str) -> None:
    """Every clock time the words name ("at 09:00") is one the expression fires at."""
    spec = parse_cron(expression)
    for hour, minute in _clock_times(describe_cron(expression, PARIS)):
        assert hour in spec.hours and minute in spec.minutes, expression


def _clock_times(words: str) -> list[tuple[int, int]]:
    import re

    return [(int(h), int(m)) for h, m in re.findall(r"\b(\d\d):(\d\d)\b", words)]


# -- the next fire times -----------------------------------------------------------------------
def test_fire_times_over_the_march_change_in_paris() -> None:
    """02:30 does not exist on 2026-03-29 in Paris: that day fires at 03:00 CEST, the first
    instant after the gap (01:00 UTC); the days around fire at 02:30 in their own offset."""
    fires = upcoming(schedule(cron="30 2 * * *"), dt.datetime(2026, 3, 27, 12, tzinfo=UTC))
    assert [f.local for f in fires] == [
        "Sat 2026-03-28 02:30 CET",
        "Sun 2026-03-29 03:00 CEST",
        "Mon 2026-03-30 02:30 CEST",
        "Tue 2026-03-31 02:30 CEST",
        "Wed 2026-04-01 02:30 CEST",
    ]
    assert [f.utc for f in fires] == [
        "2026-03-28 01:30 UTC",
        "2026-03-29 01:00 UTC",
        "2026-03-30 00:30 UTC",
        "2026-03-31 00:30 UTC",
        "2026-04-01 00:30 UTC",
    ]


def test_fire_times_over_the_october_change_in_paris() -> None:
    """02:30 happens twice on 2026-10-25: a fixed hour fires once (the first, CEST); an hour
    field "*" fires at both."""
    fires = upcoming(schedule(cron="30 2 * * *"), dt.datetime(2026, 10, 24, 12, tzinfo=UTC), 3)
    assert [(f.local, f.utc) for f in fires] == [
        ("Sun 2026-10-25 02:30 CEST", "2026-10-25 00:30 UTC"),
        ("Mon 2026-10-26 02:30 CET", "2026-10-26 01:30 UTC"),
        ("Tue 2026-10-27 02:30 CET", "2026-10-27 01:30 UTC"),
    ]
    hourly = upcoming(schedule(cron="30 * * * *"), dt.datetime(2026, 10, 25, 0, 10, tzinfo=UTC))
    assert [f.local for f in hourly] == [
        "Sun 2026-10-25 02:30 CEST",
        "Sun 2026-10-25 02:30 CET",
        "Sun 2026-10-25 03:30 CET",
        "Sun 2026-10-25 04:30 CET",
        "Sun 2026-10-25 05:30 CET",
    ]


def test_interval_fire_times_keep_their_seconds() -> None:
    fires = upcoming(schedule(every=90, tz="UTC"), dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC), 2)
    assert [f.utc for f in fires] == ["2026-01-01 00:01:30 UTC", "2026-01-01 00:03 UTC"]
    assert fires[1].at == dt.datetime(2026, 1, 1, 0, 3, tzinfo=UTC)
    assert fires[0].local == "Thu 2026-01-01 00:01:30 UTC"


def test_a_cron_schedule_starting_later_lists_no_time_before_its_first_run() -> None:
    """``start_at`` in the future: the master first fires at ``next_run_at`` (the first cron
    time at or after the start), so the page lists no earlier time."""
    later = dataclasses.replace(
        schedule(cron="0 3 * * *", tz="UTC"), next_run_at=dt.datetime(2026, 2, 1, 3, tzinfo=UTC)
    )
    fires = upcoming(later, dt.datetime(2026, 1, 10, tzinfo=UTC), 2)
    assert [f.utc for f in fires] == ["2026-02-01 03:00 UTC", "2026-02-02 03:00 UTC"]


def test_a_zone_gone_from_the_system_gives_no_fire_times() -> None:
    assert upcoming(schedule(cron="0 3 * * *", tz="Mars/Olympus"), dt.datetime.now(UTC)) == []


# -- the drawing -------------------------------------------------------------------------------
def test_bars_stack_completed_failed_and_skipped_scaled_to_the_busiest_hour() -> None:
    first = dt.datetime(2026, 1, 1, tzinfo=UTC)
    hours = [Hour(first + dt.timedelta(hours=i), 0, 0, 0) for i in range(24)]
    hours[5] = Hour(hours[5].start, 6, 2, 0)
    hours[23] = Hour(hours[23].start, 1, 0, 3)
    drawn = draw(hours, False, 100, 40, 4)
    assert (drawn.completed, drawn.failed, drawn.skipped) == (7, 2, 3)
    five = [bar for bar in drawn.bars if bar.x == 1 + 5 * 5]
    assert [(b.kind, b.height) for b in five] == [("completed", 28.5), ("failed", 9.5)]
    assert five[0].title == "05:00 UTC: 6 completed, 2 failed, 0 skipped (overlap)"
    last = [bar.kind for bar in drawn.bars if bar.x == 1 + 23 * 5]
    assert last == ["completed", "skipped"]
    assert len(drawn.bars) == 4  # hours without runs draw nothing above the baseline
    assert drawn.title == "Last 24 hours: 7 completed, 2 failed, 3 skipped (overlap)"
    assert drawn.width == 2 + 24 * 5 - 1
    assert "newest 100 runs only" in draw(hours, True, 100, 40, 4).title
    assert schedule_activity.HOURS == 24
