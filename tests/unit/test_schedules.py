"""Schedules without a store: the decorator's schedule=, planning by misfire policy, task ids."""

from __future__ import annotations

import datetime as dt

import pytest

from django_reliable_executor import Schedule, reliable_task_handler
from django_reliable_executor.core.ids import fire_task_id, is_fire_task_id
from django_reliable_executor.exceptions import HandlerRegistrationError
from django_reliable_executor.handler_options import declared as _schedules
from django_reliable_executor.registry import declared_schedules, unregister
from django_reliable_executor.schedules.planning import plan
from django_reliable_executor.schedules.records import ScheduleInfo
from django_reliable_executor.storage.redis.sharding import directory_of, native_id

UTC = dt.timezone.utc
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
MINUTE = dt.timedelta(minutes=1)


def info(**changes) -> ScheduleInfo:
    values = dict(
        schedule_id="s",
        task_name="demo.echo",
        parameter=None,
        every=MINUTE,
        cron=None,
        timezone="UTC",
        start_at=T0,
        misfire="skip",
        queue="default",
        priority=0,
        retry_limit=3,
        retry_interval=2000,
        retry_backoff="fixed",
        max_duration_millis=None,
        paused=False,
        next_run_at=T0 + MINUTE,
        last_run_at=None,
        last_task_id=None,
        origin="api",
        created_at=T0,
        updated_at=T0,
    )
    values.update(changes)
    return ScheduleInfo(**values)


GRACE = dt.timedelta(seconds=60)


def test_on_time_run_fires_and_the_next_is_in_the_future():
    outcome = plan(info(), T0 + MINUTE + dt.timedelta(seconds=2), grace=GRACE, catch_up_limit=100)
    assert outcome.runs == (T0 + MINUTE,) and outcome.skipped == 0
    assert outcome.next_run_at == T0 + 2 * MINUTE


def test_not_due_plans_nothing():
    outcome = plan(info(), T0 + dt.timedelta(seconds=30), grace=GRACE, catch_up_limit=100)
    assert outcome.runs == () and outcome.next_run_at == T0 + MINUTE


@pytest.mark.parametrize("cron", [None, "* * * * *"])
def test_policies_after_an_hour_down(cron):
    """The same answers from interval arithmetic and from the cron search."""
    now = T0 + 60 * MINUTE + dt.timedelta(seconds=30)  # runs at +1..+60 min are due
    every = None if cron else MINUTE
    skip = plan(info(cron=cron, every=every), now, grace=GRACE, catch_up_limit=100)
    assert skip.runs == (T0 + 60 * MINUTE,) and skip.skipped == 59
    once = plan(
        info(cron=cron, every=every, misfire="run_once"), now, grace=GRACE, catch_up_limit=100
    )
    assert once.runs == (T0 + 60 * MINUTE,) and once.skipped == 59
    catch = plan(
        info(cron=cron, every=every, misfire="catch_up"), now, grace=GRACE, catch_up_limit=100
    )
    assert catch.runs == tuple(T0 + k * MINUTE for k in range(1, 61)) and catch.skipped == 0
    few = plan(info(cron=cron, every=every, misfire="catch_up"), now, grace=GRACE, catch_up_limit=5)
    assert few.runs == tuple(T0 + k * MINUTE for k in range(56, 61))
    # Cron counts dropped runs only up to the limit + 1 (a long outage is not walked).
    assert few.skipped == (55 if every else 6)
    for outcome in (skip, once, catch, few):
        assert outcome.next_run_at == T0 + 61 * MINUTE


def test_a_year_down_reads_few_cron_times():
    """run_once after a year of downtime of a per-minute cron: the search looks back from now."""
    now = T0 + dt.timedelta(days=365)
    outcome = plan(
        info(cron="* * * * *", every=None, misfire="run_once"), now, grace=GRACE, catch_up_limit=100
    )
    assert outcome.runs == (now,) and outcome.next_run_at == now + MINUTE


def test_fire_task_ids():
    assert (
        fire_task_id("nightly", dt.datetime(2026, 11, 29, 3, tzinfo=UTC))
        == "nightly@20261129T030000Z"
    )
    paris = dt.datetime(2026, 11, 29, 4, 0, 0, 250, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert fire_task_id("x", paris) == "x@20261129T030000.000250Z"


@pytest.mark.parametrize(
    "schedule_id", ["nightly", "a@b", "x" * 160, "reports.daily@eu", "@", "émoji-☃"]
)
@pytest.mark.parametrize(
    "planned",
    [
        dt.datetime(2026, 11, 29, 3, tzinfo=UTC),
        dt.datetime(2026, 2, 28, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
    ],
)
def test_every_fire_id_is_in_the_reserved_namespace(schedule_id, planned):
    assert is_fire_task_id(fire_task_id(schedule_id, planned))
    # and in the form a sharded Redis storage stores it under (sharding.native_id)
    for shard in range(16):
        stored = native_id(fire_task_id(schedule_id, planned), shard, 16)
        assert is_fire_task_id(stored) and len(stored) <= 191


@pytest.mark.parametrize(
    "task_id",
    [
        "order_42",
        "user@example.com",
        "a@b",
        "nightly@",
        "@20261129T030000Z",  # no schedule id
        "x" * 161 + "@20261129T030000Z",  # longer than any schedule id
        "x@20261129T030000.000000Z",  # firing writes no zero fraction
        "x@20261129T030000.25Z",
        "x@20261129T030000z",
        "x@20261129T030000",
        "x@20261129 030000Z",
        "x@2026-11-29T03:00:00Z",
        "x@20261399T000000Z",  # no such date
        "x@20260229T000000Z",  # not a leap year
        "x@20261129T246000Z",
        "x@020261129T030000Z",  # a year firing would not write so
        "x@20261129T030000Z@",
        "x@２０２６1129T030000Z",  # other digits
        "x@20261129T030000Z~0",  # a shard's suffix counts from 1
        "x@20261129T030000Z~01",
        "x@20261129T030000Z~",
        "x@20261129T030000Z~1~2",
        "x@20261129T030000Z~-1",
        "x~1@tomorrow",
    ],
)
def test_ids_of_another_form_stay_free(task_id):
    assert not is_fire_task_id(task_id)


def test_decorator_schedule_shortcuts():
    assert _schedules("t", "0 3 * * *") == (
        Schedule(cron="0 3 * * *", schedule_id="t", task_name="t"),
    )
    assert _schedules("t", 300)[0].every == 300
    assert _schedules("t", dt.timedelta(hours=1))[0].every == dt.timedelta(hours=1)
    both = _schedules(
        "t", [Schedule(schedule_id="a", every=60), Schedule(schedule_id="b", cron="@daily")]
    )
    assert [s.schedule_id for s in both] == ["a", "b"]


@pytest.mark.parametrize(
    "given, message",
    [
        ("61 * * * *", "minute"),
        (0.5, "every"),
        (Schedule(cron="0 3 * * *", timezone="Nowhere/City"), "Nowhere/City"),
        (["0 3 * * *", "0 4 * * *"], "schedule_id"),
        (Schedule(every=60, task_name="other"), "task_name"),
        (object(), "cron string"),
        (True, "cron string"),
    ],
)
def test_bad_decorator_schedules_fail_at_import(given, message):
    with pytest.raises(HandlerRegistrationError, match=message):

        @reliable_task_handler("tests.bad_schedule", schedule=given)
        def handler() -> None: ...

    assert not any(s.task_name == "tests.bad_schedule" for s in declared_schedules())


def test_declared_schedules_lists_every_handler_schedule():
    @reliable_task_handler(
        "tests.declared",
        schedule=[Schedule(schedule_id="d1", every=60), Schedule(schedule_id="d2", cron="@hourly")],
    )
    def handler() -> None: ...

    try:
        mine = [s for s in declared_schedules() if s.task_name == "tests.declared"]
        assert [s.schedule_id for s in mine] == ["d1", "d2"]
    finally:
        unregister("tests.declared")


@pytest.mark.parametrize(
    "planned",
    [
        dt.datetime(2026, 11, 29, 3, 0, tzinfo=UTC),
        dt.datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1969, 7, 20, 20, 17, 40, 5, tzinfo=UTC),  # before the epoch
        dt.datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC),
        dt.datetime(2030, 3, 31, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    ],
)
def test_a_fire_id_reads_the_planned_time_in_utc(planned):
    """The id formatted by arithmetic is the one strftime gives, to the microsecond."""
    utc = planned.astimezone(UTC)
    fraction = f".{utc.microsecond:06d}" if utc.microsecond else ""
    assert fire_task_id("s", planned) == f"s@{utc.strftime('%Y%m%dT%H%M%S')}{fraction}Z"
    assert is_fire_task_id(fire_task_id("s", planned))


@pytest.mark.parametrize("shards", [1, 2, 4, 7])
def test_a_native_fire_id_lands_on_its_shard_the_same_way_every_time(shards):
    base = fire_task_id("nightly", dt.datetime(2026, 11, 29, 3, tzinfo=UTC))
    for shard in range(shards):
        stored = native_id(base, shard, shards)
        assert directory_of(stored, shards) == shard
        assert stored == native_id(base, shard, shards)  # every master derives the same id
        # its own id where that is on the shard already; else the first suffix that is
        if directory_of(base, shards) == shard:
            assert stored == base
        else:
            k = int(stored.rpartition("~")[2])
            assert stored == f"{base}~{k}" and all(
                directory_of(f"{base}~{j}", shards) != shard for j in range(1, k)
            )


def test_a_plain_submit_of_a_sharded_fire_id_is_refused_by_name():
    from django_reliable_executor.exceptions import ReservedTaskIdError
    from django_reliable_executor.service.submitting import _task_id

    with pytest.raises(ReservedTaskIdError, match="perhaps then '~<k>'"):
        _task_id("nightly@20261129T030000Z~3")
    assert _task_id("nightly@20261129T030000Z~0") == "nightly@20261129T030000Z~0"
