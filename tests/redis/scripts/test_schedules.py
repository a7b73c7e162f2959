"""The Redis storage's schedule scripts (save, pause, delete, fire), each for every race it
can lose, with every key compared before and after, and a random walk keeping the schedule
indexes consistent with the schedule hashes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from functools import partial

import pytest

from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.master.schedule_firing import ScheduleFiring, fire_task
from django_reliable_executor.schedules.records import ScheduleFire
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.schedule_base import ScheduleStorage
from tests.conftest import own_key_prefix
from tests.redis.scripts.conftest import redis_storage
from tests.support.redis_support import assert_consistent, changed_keys, snapshot, unchanged

MINUTE = dt.timedelta(minutes=1)


def test_save_creates_the_hash_and_both_indexes(storage, executor):
    before = snapshot(storage)
    info = executor.schedule("a", "demo.echo", {"x": 1}, every=60)
    after = snapshot(storage)
    assert changed_keys(before, after) == {"s:a", "schedules", "schedules:due"}
    assert after["schedules"] == ("zset", [("a", "0")])
    assert storage.get_schedules(["a"]) == {"a": info}
    assert_consistent(storage)


def test_redefining_a_paused_schedule_keeps_it_out_of_the_due_index(storage, executor):
    executor.schedule("a", "demo.echo", every=60)
    executor.pause_schedule("a")
    before = snapshot(storage)
    executor.schedule("a", "demo.echo", every=120)  # new timing: a new next run, still paused
    after = snapshot(storage)
    assert changed_keys(before, after) == {"s:a"}
    assert_consistent(storage)


def test_a_cleared_option_is_removed_from_the_hash(storage, executor):
    executor.schedule("a", "demo.echo", every=60, max_duration_millis=5000)
    assert "md" in storage.client.hgetall(storage.p + "s:a")
    executor.schedule("a", "demo.echo", cron="0 3 * * *")  # no max duration, no interval
    values = storage.client.hgetall(storage.p + "s:a")
    assert "md" not in values and "ev" not in values and values["cr"] == "0 3 * * *"
    assert executor.get_schedule("a").every is None


def test_pause_and_resume_are_idempotent(storage, executor):
    executor.schedule("a", "demo.echo", every=60)
    executor.pause_schedule("a")
    with unchanged(storage):
        executor.pause_schedule("a")
    executor.resume_schedule("a")
    with unchanged(storage):
        executor.resume_schedule("a")
        assert executor.pause_schedule("missing") is None
    assert_consistent(storage)


def test_delete_removes_every_trace(storage, executor):
    before = snapshot(storage)
    executor.schedule("a", "demo.echo", every=60)
    executor.pause_schedule("a")
    assert storage.delete_schedule("a") is True
    assert snapshot(storage) == before
    with unchanged(storage):
        assert storage.delete_schedule("a") is False


def _planned_fire(executor, schedule_id: str, now: dt.datetime) -> ScheduleFire:
    """What a master plans for the schedule's next run, as the firing round builds it."""
    info = executor.get_schedule(schedule_id)
    task = fire_task(info, info.next_run_at, now)
    return ScheduleFire(
        schedule_id, info.next_run_at, info.next_run_at + MINUTE, (task,), task.run_at, task.task_id
    )


@pytest.mark.parametrize("race", ["paused", "moved on", "deleted", "redefined"])
def test_fire_stores_nothing_for_a_schedule_that_no_longer_expects_it(
    storage, executor, clock, race
):
    """The master planned the fire, then the schedule changed before the fire script ran: the
    check and the store are one script, so no task appears (the run of a paused or deleted
    schedule must not happen)."""
    executor.schedule("a", "demo.echo", every=60)
    clock.advance(61)
    fire = _planned_fire(executor, "a", clock.now())
    if race == "paused":
        executor.pause_schedule("a")
    elif race == "moved on":  # another master fired it (its task then already exists)
        storage.fire_schedules([fire], clock.now())
    elif race == "redefined":
        executor.schedule("a", "demo.echo", every=90)
    else:
        storage.delete_schedule("a")
    with unchanged(storage):
        assert storage.fire_schedules([fire], clock.now()) == []
    if race != "moved on":
        assert executor.get_task(fire.tasks[0].task_id) is None
    assert_consistent(storage)


def test_fire_stores_the_tasks_and_moves_the_schedule_in_one_script(storage, executor, clock):
    executor.schedule("a", "demo.echo", every=60)
    executor.schedule("b", "demo.echo", every=60)
    clock.advance(61)
    fires = [_planned_fire(executor, i, clock.now()) for i in ("a", "b")]
    storage.enqueue([fires[1].tasks[0]])  # b's run was stored by a master that died then
    before = snapshot(storage)
    created = storage.fire_schedules(fires, clock.now())
    after = snapshot(storage)
    assert [t.task_id for t in created] == [fires[0].tasks[0].task_id]  # b's existed already
    task_key = "t:" + fires[0].tasks[0].task_id
    assert task_key in changed_keys(before, after) and {"s:a", "s:b", "schedules:due"} <= (
        changed_keys(before, after)
    )
    for fire in fires:
        info = executor.get_schedule(fire.schedule_id)
        assert (info.next_run_at, info.last_task_id) == (fire.next_run_at, fire.last_task_id)
    assert_consistent(storage)


def test_a_random_walk_keeps_the_schedule_indexes_consistent(storage, executor, clock):
    rng = random.Random(7)
    ids = [f"s{i}" for i in range(8)]
    for step in range(300):
        schedule_id = rng.choice(ids)
        action = rng.choice(["define", "define", "pause", "resume", "delete", "fire", "time"])
        if action == "define":
            if rng.random() < 0.5:
                executor.schedule(schedule_id, "demo.echo", every=rng.choice([30, 60, 90]))
            else:
                executor.schedule(
                    schedule_id, "demo.echo", cron=rng.choice(["* * * * *", "@hourly"])
                )
        elif action == "pause":
            executor.pause_schedule(schedule_id)
        elif action == "resume":
            executor.resume_schedule(schedule_id)
        elif action == "delete":
            executor.delete_schedule(schedule_id)
        elif action == "fire":
            ScheduleFiring(executor).run_once()
        else:
            clock.advance(rng.choice([5, 30, 61, 600]))
        if step % 10 == 0:
            assert_consistent(storage)
    assert_consistent(storage)
    # Each fired task id is a schedule id and a planned time; no schedule fired one twice.
    fired = [t.task_id for t in executor.list_tasks(limit=100_000)]
    assert len(fired) == len(set(fired)) and all("@" in t for t in fired)
    for info in executor.list_schedules():
        assert dataclasses.replace(info) == executor.get_schedule(info.schedule_id)


def _fill(executor: ReliableExecutor) -> None:
    """Schedules of every kind the master meets: each misfire policy, cron, options, paused."""
    executor.schedule("skip", "demo.echo", {"a": [1, 2.5, "é"]}, every=60)
    executor.schedule(
        "once", "demo.echo", every=60, misfire="run_once", max_duration_millis=5000, queue="q2"
    )
    executor.schedule("catch", "demo.echo", every=90, misfire="catch_up", priority=3)
    executor.schedule("cron", "demo.echo", {"c": 1}, cron="*/5 * * * *", misfire="catch_up")
    executor.schedule("gone", "demo.echo", cron="0 3 * * *")
    executor.schedule("paused", "demo.echo", every=60)
    executor.pause_schedule("paused")


def test_the_redis_round_stores_what_the_general_round_stores(storage, executor, clock):
    """RedisStorage.fire_due (the hashes' strings, intervals in microseconds) against the
    storage-neutral round of ScheduleStorage over the same schedules and times: the same
    tasks, schedules, indexes and reported outcome, key for key."""
    other_clock = FakeClock(clock.now())
    with own_key_prefix(True, "test-scripts") as other_prefix:
        other = redis_storage(other_prefix, other_clock)
        try:
            rounds = []
            for one, its_clock in ((storage, clock), (other, other_clock)):
                service = ReliableExecutor(one, clock=its_clock)
                _fill(service)
                broken = one.get_schedules(["gone"])["gone"]
                # As if the zone had gone from the system's time zone database.
                one.save_schedules([dataclasses.replace(broken, timezone="Gone/Zone")], ["gone"])
                general = partial(ScheduleStorage.fire_due, one)
                fire_due = one.fire_due if one is storage else general
                outcome = []
                for seconds in (30, 31, 61, 500, 3600 * 5, 1):
                    its_clock.advance(seconds)
                    result = fire_due(
                        its_clock.now(),
                        1000,
                        grace=dt.timedelta(seconds=60),
                        catch_up_limit=3,
                        max_tasks=5000,
                    )
                    outcome.append(
                        (
                            result.created,
                            result.due,
                            result.skipped,
                            [(i, type(e)) for i, e in result.paused],
                        )
                    )
                rounds.append((outcome, snapshot(one)))
            assert rounds[0][0] == rounds[1][0]
            assert rounds[0][1] == rounds[1][1]
            assert sum(len(created) for created, *_ in rounds[0][0]) > 10
            assert_consistent(storage)
        finally:
            other.close()
