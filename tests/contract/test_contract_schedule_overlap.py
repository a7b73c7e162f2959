"""Contract: a schedule's ``overlap`` policy on every backend — "skip" fires no run while the
previous run is not terminal (counted, logged, stored on the schedule); "allow" always fires."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import pytest

from django_reliable_executor import InvalidScheduleError, Schedule, TaskStatus
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.exceptions import HandlerRegistrationError
from django_reliable_executor.master.schedule_firing import ScheduleFiring, fire_task
from django_reliable_executor.registry import reliable_task_handler
from django_reliable_executor.schedules.records import ScheduleFire
from tests.support.contract_support import claim_and_start

MINUTE = dt.timedelta(minutes=1)


def fire(executor) -> None:
    ScheduleFiring(executor).run_once()


def fired(executor, schedule_id: str):
    tasks = [t for t in executor.list_tasks(limit=1000) if t.task_id.startswith(schedule_id + "@")]
    return sorted(tasks, key=lambda t: t.run_at)


def overlap_metric() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("reliable_executor_schedule_overlap_skipped_total") or 0.0


def test_skip_fires_nothing_while_the_previous_run_is_running(executor, clock, caplog):
    info = executor.schedule("nightly", "demo.echo", every=60, overlap="skip")
    assert info.overlap == "skip" and info.overlap_skipped == 0 and info.last_skipped_at is None
    clock.advance(60)
    fire(executor)
    [first] = fired(executor, "nightly")
    claim = claim_and_start(executor.storage)
    assert claim.task_id == first.task_id
    before = overlap_metric()
    clock.advance(60)
    with caplog.at_level(logging.WARNING, logger="django_reliable_executor"):
        fire(executor)
    assert fired(executor, "nightly") == [executor.get_task(first.task_id)]
    schedule = executor.get_schedule("nightly")
    assert schedule.overlap_skipped == 1 and schedule.last_skipped_at == clock.now()
    assert schedule.next_run_at == info.next_run_at + 2 * MINUTE  # moved on, not held back
    assert schedule.last_task_id == first.task_id  # still the run that is running
    assert overlap_metric() - before == 1
    [line] = [r.getMessage() for r in caplog.records if "overlap=skip" in r.getMessage()]
    assert "nightly" in line and first.task_id in line
    # Once it is terminal, the next due run fires.
    assert executor.storage.complete(claim, "done") is not None
    clock.advance(60)
    fire(executor)
    runs = fired(executor, "nightly")
    assert [t.run_at for t in runs] == [info.next_run_at, info.next_run_at + 2 * MINUTE]
    assert executor.get_schedule("nightly").overlap_skipped == 1


def test_skip_also_waits_for_a_previous_run_not_yet_started(executor, clock):
    executor.schedule("queued", "demo.echo", every=60, overlap="skip")
    clock.advance(60)
    fire(executor)
    clock.advance(60)
    fire(executor)
    [first] = fired(executor, "queued")
    assert first.status is TaskStatus.CREATED
    assert executor.get_schedule("queued").overlap_skipped == 1
    assert executor.cancel_task(first.task_id)  # terminal: the next run fires
    clock.advance(60)
    fire(executor)
    assert len(fired(executor, "queued")) == 2


def test_allow_keeps_firing_while_the_previous_run_is_running(executor, clock):
    info = executor.schedule("often", "demo.echo", every=60)
    assert info.overlap == "allow"
    clock.advance(60)
    fire(executor)
    claim_and_start(executor.storage)
    clock.advance(60)
    fire(executor)
    assert len(fired(executor, "often")) == 2
    assert executor.get_schedule("often").overlap_skipped == 0


def test_a_fire_checks_the_previous_run_in_the_same_step(executor, clock):
    """The storage's fire itself (not only the round's planning) refuses to overlap: a fire
    planned while the previous run was terminal meets it live again (retried by hand)."""
    executor.schedule("step", "demo.echo", every=60, overlap="skip")
    clock.advance(60)
    fire(executor)
    [first] = fired(executor, "step")
    assert executor.cancel_task(first.task_id)
    clock.advance(60)
    schedule = executor.get_schedule("step")
    task = fire_task(schedule, schedule.next_run_at, clock.now())
    planned = ScheduleFire(
        "step",
        schedule.next_run_at,
        schedule.next_run_at + MINUTE,
        (task,),
        task.run_at,
        task.task_id,
        overlap="skip",
    )
    assert executor.retry_task(first.task_id)  # live again before the fire is stored
    overlapped: list[tuple[str, str, int]] = []
    assert executor.storage.fire_schedules([planned], clock.now(), overlapped) == []
    assert overlapped == [("step", first.task_id, 1)]
    assert executor.get_task(task.task_id) is None
    after = executor.get_schedule("step")
    assert after.next_run_at == schedule.next_run_at + MINUTE and after.overlap_skipped == 1


def test_skip_fires_only_the_newest_of_runs_planned_together(executor, clock):
    executor._settings = dataclasses.replace(ExecutorSettings(), SCHEDULE_MISFIRE_GRACE=300)
    info = executor.schedule("burst", "demo.echo", every=60, overlap="skip", misfire="catch_up")
    clock.advance(5 * 60 + 30)  # five runs due at once: together they would overlap
    fire(executor)
    assert [t.run_at for t in fired(executor, "burst")] == [info.next_run_at + 4 * MINUTE]


def test_redefining_keeps_the_skipped_count(executor, clock):
    executor.schedule("keep", "demo.echo", every=60, overlap="skip")
    clock.advance(60)
    fire(executor)
    clock.advance(60)
    fire(executor)
    again = executor.schedule("keep", "demo.echo", {"v": 2}, every=60, overlap="skip")
    assert again.overlap_skipped == 1 and again.last_skipped_at is not None
    assert executor.get_schedule("keep") == again
    relaxed = executor.schedule("keep", "demo.echo", {"v": 2}, every=60)
    assert relaxed.overlap == "allow" and executor.get_schedule("keep").overlap == "allow"


@pytest.mark.parametrize("value", ["never", "", None, 1, ["skip"]])
def test_a_bad_overlap_is_refused_and_stores_nothing(executor, value):
    with pytest.raises(InvalidScheduleError) as caught:
        executor.schedule("bad", "demo.echo", every=60, overlap=value)
    assert caught.value.field == "overlap" and "overlap" in str(caught.value)
    with pytest.raises(InvalidScheduleError):
        executor.schedule_many(
            [
                Schedule(every=60, schedule_id="fine", task_name="demo.echo"),
                Schedule(every=60, schedule_id="bad", task_name="demo.echo", overlap=value),
            ]
        )
    assert executor.count_schedules() == {"active": 0, "paused": 0}


def test_a_bad_overlap_in_the_decorator_fails_at_import():
    with pytest.raises(HandlerRegistrationError, match="overlap"):
        reliable_task_handler(
            name="contract.bad_overlap", schedule=Schedule(every=60, overlap="sometimes")
        )(lambda: None)
