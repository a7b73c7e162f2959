"""Contract: schedules on every backend — define, redefine, pause, resume, delete, list, and the
master's firing (derived task ids, misfire policies, two masters, time zones)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from django_reliable_executor import InvalidScheduleError, Schedule, TaskStatus, signals
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.core.ids import fire_task_id
from django_reliable_executor.core.records import TaskSubmitRequest
from django_reliable_executor.exceptions import ReservedTaskIdError, TaskSubmitError
from django_reliable_executor.master.schedule_firing import ScheduleFiring
from django_reliable_executor.registry import TaskHandler, register, unregister
from django_reliable_executor.schedules.records import ScheduleFire
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.contract_support import recording

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)


def fire(executor: ReliableExecutor) -> None:
    """One master round of schedule firing."""
    ScheduleFiring(executor).run_once()


def stored_id(executor: ReliableExecutor, task) -> str:
    """The id a fire stores ``task`` under: its own, but on a sharded Redis storage made
    native to its queue's shard (sharding.native_id)."""
    layout = getattr(executor.storage, "layout", None)
    if layout is None:
        return task.task_id
    from django_reliable_executor.storage.redis.sharding import native_id

    return native_id(task.task_id, layout.shard_of(task.queue), layout.shards)


def fired_tasks(executor: ReliableExecutor, schedule_id: str):
    """The tasks this schedule fired, oldest planned run first."""
    tasks = [
        t for t in executor.list_tasks(limit=10_000) if t.task_id.startswith(schedule_id + "@")
    ]
    return sorted(tasks, key=lambda t: t.run_at)


def test_create_get_list_count(executor, clock):
    now = clock.now()
    info = executor.schedule("every5", "demo.echo", {"n": 1}, every=300, queue="mail")
    assert info.every == dt.timedelta(minutes=5) and info.cron is None
    assert info.next_run_at == now + dt.timedelta(minutes=5)  # one interval after creation
    assert (info.queue, info.priority, info.misfire, info.paused) == ("mail", 0, "skip", False)
    assert info.retry_limit == 3 and info.origin == "api"
    assert executor.get_schedule("every5") == info
    assert executor.get_schedule("nope") is None
    executor.schedule("a-cron", "demo.echo", cron="0 3 * * *", timezone="Europe/Paris")
    assert [s.schedule_id for s in executor.list_schedules()] == ["a-cron", "every5"]
    assert [s.schedule_id for s in executor.list_schedules(limit=1, offset=1)] == ["every5"]
    assert executor.count_schedules() == {"active": 2, "paused": 0}
    cron = executor.get_schedule("a-cron")
    # 03:00 in Paris (UTC+1 in January) is 02:00 UTC.
    assert cron.next_run_at == dt.datetime(2030, 1, 1, 2, 0, tzinfo=UTC)
    assert "0 3 * * *" in cron.describe()


def test_start_at_sets_the_first_run_and_the_anchor(executor, clock):
    start = clock.now() + dt.timedelta(hours=1, seconds=7)
    info = executor.schedule("s", "demo.echo", every=dt.timedelta(minutes=10), start_at=start)
    assert info.next_run_at == start and info.start_at == start
    past = clock.now() - dt.timedelta(minutes=25)
    info = executor.schedule("p", "demo.echo", every=600, start_at=past)
    assert info.next_run_at == past + dt.timedelta(minutes=30)  # the first run not before now


def test_redefining_keeps_state_and_the_next_run_when_the_timing_is_the_same(executor, clock):
    first = executor.schedule("r", "demo.echo", {"v": 1}, every=60)
    executor.pause_schedule("r")
    clock.advance(10)
    again = executor.schedule("r", "demo.echo", {"v": 2}, every=60)
    assert again.parameter == {"v": 2} and again.paused
    assert again.next_run_at == first.next_run_at and again.created_at == first.created_at
    assert executor.get_schedule("r") == again
    changed = executor.schedule("r", "demo.echo", {"v": 2}, every=120)
    assert changed.next_run_at == first.start_at + dt.timedelta(seconds=120)
    assert executor.get_schedule("r").paused  # a pause survives a redefinition
    # The same definition again writes nothing.
    clock.advance(10)
    assert executor.schedule("r", "demo.echo", {"v": 2}, every=120).updated_at == changed.updated_at
    assert executor.get_schedule("r").updated_at == changed.updated_at


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"schedule_id": "has space"}, "schedule_id"),
        ({"schedule_id": "x" * 161}, "schedule_id"),
        ({"schedule_id": ""}, "schedule_id"),
        ({"every": None}, "every"),
        ({"cron": "0 3 * * *"}, "every"),  # both every and cron
        ({"every": 0.5}, "every"),
        ({"every": None, "cron": "61 * * * *"}, "cron"),
        ({"every": None, "cron": "0 0 30 2 *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"misfire": "sometimes"}, "misfire"),
        ({"start_at": dt.datetime(2030, 1, 1)}, "start_at"),
        ({"task_name": "no.such.task"}, "task_name"),
        ({"parameter": {"x": object()}}, "task_parameter"),
        ({"queue": "has space"}, "queue"),
        ({"retry_backoff": "random"}, "retry_backoff"),
        ({"jitter": True}, "jitter"),
    ],
)
def test_bad_definitions_name_the_field_and_store_nothing(executor, kwargs, field):
    executor.schedule("keep", "demo.echo", every=60)
    before = executor.list_schedules()
    arguments = {"schedule_id": "new", "task_name": "demo.echo", "every": 60, **kwargs}
    with pytest.raises((InvalidScheduleError, TaskSubmitError)) as caught:
        executor.schedule(**arguments)
    assert caught.value.field == field, caught.value
    assert executor.list_schedules() == before


def test_one_bad_schedule_in_a_batch_stores_none(executor):
    good = Schedule(schedule_id="good", task_name="demo.echo", every=60)
    bad = Schedule(schedule_id="bad", task_name="demo.echo", cron="* * *")
    with pytest.raises(InvalidScheduleError):
        executor.schedule_many([good, bad])
    with pytest.raises(InvalidScheduleError, match="given twice"):
        executor.schedule_many([good, good])
    assert executor.list_schedules() == []
    assert [s.schedule_id for s in executor.schedule_many([good])] == ["good"]


def test_a_due_schedule_fires_one_ordinary_task_with_a_derived_id(executor, clock):
    info = executor.schedule("tick", "demo.echo", {"n": 7}, every=60, queue="q", priority=3)
    fire(executor)
    assert fired_tasks(executor, "tick") == []  # not due yet
    clock.advance(61)
    with recording(signals.task_submitted) as submitted:
        fire(executor)
    [task] = fired_tasks(executor, "tick")
    planned = info.next_run_at
    assert task.task_id == fire_task_id("tick", planned) == f"tick@{planned:%Y%m%dT%H%M%S}Z"
    assert (task.task_name, task.parameter, task.queue, task.priority) == (
        "demo.echo",
        {"n": 7},
        "q",
        3,
    )
    assert task.status is TaskStatus.CREATED and task.run_at == planned
    assert [call["task_id"] for call in submitted.calls] == [task.task_id]
    after = executor.get_schedule("tick")
    assert after.next_run_at == planned + MINUTE
    assert (after.last_run_at, after.last_task_id) == (planned, task.task_id)
    fire(executor)  # nothing more is due
    assert len(fired_tasks(executor, "tick")) == 1


@pytest.mark.parametrize("how", ["submit", "submit_task", "submit_many"])
def test_a_plain_submit_cannot_take_a_schedule_runs_id(executor, clock, how):
    """Fire ids are predictable: a submitter taking the next run's id first would make the
    schedule find its run stored already and fire nothing. Their form is reserved."""
    info = executor.schedule("squat", "demo.echo", {"n": 1}, every=60, queue="q")
    run_id = fire_task_id("squat", info.next_run_at)
    with pytest.raises(ReservedTaskIdError) as refused:
        if how == "submit":
            executor.submit("demo.noop", task_id=run_id)
        elif how == "submit_task":
            executor.submit_task(TaskSubmitRequest("demo.noop", task_id=run_id))
        else:  # one reserved id refuses the whole batch
            executor.submit_many(
                [
                    TaskSubmitRequest("demo.noop", task_id="fine"),
                    TaskSubmitRequest("demo.noop", task_id=run_id),
                ]
            )
    assert isinstance(refused.value, TaskSubmitError) and refused.value.field == "task_id"
    assert run_id in str(refused.value) and "schedule" in str(refused.value)
    assert executor.list_tasks() == []  # stored nothing
    clock.advance(61)
    fire(executor)
    [task] = fired_tasks(executor, "squat")  # the schedule fires its run all the same
    assert (task.task_id, task.task_name, task.parameter, task.queue) == (
        run_id,
        "demo.echo",
        {"n": 1},
        "q",
    )
    # Ids that only look alike stay free for plain submits.
    for task_id in ("squat@tomorrow", "user@example.com", run_id + "x"):
        assert executor.submit("demo.noop", task_id=task_id).task_id == task_id


def test_two_masters_never_fire_one_run_twice(executor, make_storage, clock):
    executor.schedule("dup", "demo.echo", every=60)
    clock.advance(60)
    other = ReliableExecutor(make_storage(clock), clock=clock)
    # Both plan from the same state, then both store their fire.
    schedule = executor.get_schedule("dup")
    from django_reliable_executor.master.schedule_firing import fire_task

    now = clock.now()
    planned = fire_task(schedule, schedule.next_run_at, now)
    a_fire = ScheduleFire(
        "dup",
        schedule.next_run_at,
        schedule.next_run_at + MINUTE,
        (planned,),
        schedule.next_run_at,
        planned.task_id,
    )
    created_a = executor.storage.fire_schedules([a_fire], now)
    created_b = other.storage.fire_schedules([a_fire], now)
    assert [t.task_id for t in created_a] == [stored_id(executor, planned)] and created_b == []
    fire(other)  # and a full round on the second master finds nothing due
    assert len(fired_tasks(executor, "dup")) == 1
    assert executor.get_schedule("dup").next_run_at == schedule.next_run_at + MINUTE


@pytest.mark.parametrize("change", ["pause", "delete"])
def test_a_schedule_paused_or_deleted_after_planning_fires_nothing(executor, clock, change):
    """The master planned the run, then the schedule was paused or deleted before the fire was
    stored: the run must not happen."""
    from django_reliable_executor.master.schedule_firing import fire_task

    executor.schedule("late", "demo.echo", every=60)
    clock.advance(61)
    schedule = executor.get_schedule("late")
    task = fire_task(schedule, schedule.next_run_at, clock.now())
    planned = ScheduleFire(
        "late",
        schedule.next_run_at,
        schedule.next_run_at + MINUTE,
        (task,),
        task.run_at,
        task.task_id,
    )
    if change == "pause":
        executor.pause_schedule("late")
    else:
        executor.delete_schedule("late")
    assert executor.storage.fire_schedules([planned], clock.now()) == []
    run_id = stored_id(executor, task)  # sharded, the run's id made native to its queue's shard
    assert executor.get_task(run_id) is None and executor.list_tasks() == []
    if change == "pause":  # and the schedule did not move on: resuming fires that run
        assert executor.get_schedule("late").next_run_at == schedule.next_run_at
        executor.resume_schedule("late")
        fire(executor)
        assert [t.task_id for t in fired_tasks(executor, "late")] == [run_id]


def test_a_run_fired_but_not_recorded_is_not_fired_again(executor, clock):
    """A master that died between storing the tasks and moving the schedule on: the next
    master plans the same run, and its task id already exists."""
    executor.schedule("crash", "demo.echo", every=60)
    clock.advance(60)
    schedule = executor.get_schedule("crash")
    from django_reliable_executor.master.schedule_firing import fire_task

    task = fire_task(schedule, schedule.next_run_at, clock.now())
    executor.storage.enqueue([dataclasses.replace(task, task_id=stored_id(executor, task))])
    fire(executor)
    assert len(fired_tasks(executor, "crash")) == 1
    assert executor.get_schedule("crash").next_run_at == schedule.next_run_at + MINUTE


def _down_for(executor, clock, schedule_id, misfire, minutes, **settings):
    executor._settings = dataclasses.replace(ExecutorSettings(), **settings)
    info = executor.schedule(schedule_id, "demo.echo", every=60, misfire=misfire)
    clock.advance(minutes * 60 + 30)  # the master was away for this long
    fire(executor)
    return info, fired_tasks(executor, schedule_id)


def test_misfire_skip_drops_runs_older_than_the_grace(executor, clock):
    info, tasks = _down_for(executor, clock, "skip", "skip", 10, SCHEDULE_MISFIRE_GRACE=120)
    # Runs at +1..+10 minutes; now is +10.5 min: +9 and +10 are within 120 s.
    assert [t.run_at for t in tasks] == [
        info.next_run_at + 8 * MINUTE,
        info.next_run_at + 9 * MINUTE,
    ]
    assert executor.get_schedule("skip").next_run_at == info.next_run_at + 10 * MINUTE


def test_misfire_run_once_fires_the_latest_missed_run_only(executor, clock):
    info, tasks = _down_for(executor, clock, "once", "run_once", 10)
    assert [t.run_at for t in tasks] == [info.next_run_at + 9 * MINUTE]


def test_misfire_catch_up_fires_each_missed_run_up_to_the_limit(executor, clock):
    info, tasks = _down_for(executor, clock, "all", "catch_up", 10)
    assert [t.run_at for t in tasks] == [info.next_run_at + k * MINUTE for k in range(10)]
    info, tasks = _down_for(executor, clock, "some", "catch_up", 10, SCHEDULE_CATCH_UP_LIMIT=3)
    assert [t.run_at for t in tasks] == [info.next_run_at + k * MINUTE for k in range(7, 10)]
    assert executor.get_schedule("some").next_run_at == info.next_run_at + 10 * MINUTE


def test_paused_fires_nothing_and_resume_honours_the_policy(executor, clock):
    info = executor.schedule("p", "demo.echo", every=60, misfire="catch_up")
    paused = executor.pause_schedule("p")
    assert paused.paused and executor.count_schedules() == {"active": 0, "paused": 1}
    assert [s.schedule_id for s in executor.list_schedules(paused=True)] == ["p"]
    assert executor.list_schedules(paused=False) == []
    clock.advance(5 * 60 + 1)
    fire(executor)
    assert fired_tasks(executor, "p") == []
    resumed = executor.resume_schedule("p")
    assert not resumed.paused and resumed.next_run_at == info.next_run_at
    fire(executor)
    assert [t.run_at for t in fired_tasks(executor, "p")] == [
        info.next_run_at + k * MINUTE for k in range(5)
    ]
    assert executor.pause_schedule("unknown") is None
    assert executor.resume_schedule("unknown") is None


def test_delete_forgets_the_schedule_but_not_its_tasks(executor, clock):
    executor.schedule("d", "demo.echo", every=60)
    clock.advance(61)
    fire(executor)
    assert executor.delete_schedule("d") is True
    assert executor.delete_schedule("d") is False
    assert executor.get_schedule("d") is None and executor.count_schedules()["active"] == 0
    clock.advance(600)
    fire(executor)
    assert len(fired_tasks(executor, "d")) == 1


def test_cron_in_a_time_zone_fires_across_the_spring_gap(executor, clock):
    """30 2 * * * in Paris: on 29 March 2026 02:30 does not exist; it fires at 03:00 CEST."""
    clock._now = dt.datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
    info = executor.schedule("paris", "demo.echo", cron="30 2 * * *", timezone="Europe/Paris")
    assert info.next_run_at == dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    clock._now = dt.datetime(2026, 3, 29, 1, 0, 1, tzinfo=UTC)
    fire(executor)
    clock._now = dt.datetime(2026, 3, 30, 0, 30, 1, tzinfo=UTC)  # 02:30 CEST the next day
    fire(executor)
    assert [t.run_at for t in fired_tasks(executor, "paris")] == [
        dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        dt.datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
    ]


def test_schedules_declared_in_code_are_created_then_updated(executor, clock):
    def nightly(param=None):
        return param

    handler = TaskHandler(nightly, name="tests.nightly")
    from django_reliable_executor.handler_options import declared as _schedules

    handler.schedules = _schedules("tests.nightly", Schedule(cron="0 3 * * *", parameter={"a": 1}))
    register(handler)
    try:
        assert executor.sync_declared_schedules() == 1
        info = executor.get_schedule("tests.nightly")
        assert (info.origin, info.cron, info.parameter) == ("code", "0 3 * * *", {"a": 1})
        assert executor.sync_declared_schedules() == 0  # unchanged: nothing written
        handler.schedules = _schedules("tests.nightly", "0 4 * * *")
        assert executor.sync_declared_schedules() == 1
        assert executor.get_schedule("tests.nightly").cron == "0 4 * * *"
    finally:
        unregister("tests.nightly")


def test_two_workers_first_saving_a_declared_interval_keep_one_grid(
    executor, make_storage, clock, monkeypatch
):
    """Two workers start together with a new declared interval: both read "no such schedule",
    both save it anchored on their own now. The later save must not move the grid (nor the
    next run) of the schedule the first one stored, which a master may already fire."""
    first = executor.schedule_many([Schedule(every=60, schedule_id="d", task_name="demo.echo")])
    clock.advance(0.25)
    late = ReliableExecutor(make_storage(clock), clock=clock)
    monkeypatch.setattr(late.storage, "get_schedules", lambda ids: {})  # read before the save
    late.schedule_many([Schedule(every=60, schedule_id="d", task_name="demo.echo", parameter=1)])
    stored = executor.get_schedule("d")
    assert (stored.start_at, stored.next_run_at) == (first[0].start_at, first[0].next_run_at)
    assert stored.parameter == 1  # the rest of the definition is saved
    # A save with another timing, or with a start given, still sets both.
    late.schedule_many([Schedule(every=30, schedule_id="d", task_name="demo.echo")])
    assert executor.get_schedule("d").start_at == clock.now()
    start = clock.now() + MINUTE
    late.schedule_many([Schedule(every=30, schedule_id="d", task_name="demo.echo", start_at=start)])
    assert (executor.get_schedule("d").start_at, executor.get_schedule("d").next_run_at) == (
        start,
        start,
    )


def test_fired_tasks_run_like_any_other(executor, storage, clock):
    from tests.support.contract_support import claim_and_start

    executor.schedule("run", "demo.echo", {"x": 1}, every=60)
    clock.advance(60)
    fire(executor)
    claim = claim_and_start(storage)
    assert claim.task_id.startswith("run@")
    assert storage.complete(claim, {"x": 1}) is not None
    assert executor.get_task(claim.task_id).status is TaskStatus.COMPLETED


def test_fires_and_skips_are_counted_in_metrics(executor, clock):
    from prometheus_client import REGISTRY

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    fired_before = sample("reliable_executor_schedule_runs_fired_total")
    skipped_before = sample("reliable_executor_schedule_runs_skipped_total")
    lags_before = sample("reliable_executor_schedule_lag_seconds_count")
    executor.schedule("m", "demo.echo", every=60, misfire="skip")
    clock.advance(10 * 60 + 5)  # runs at +1..+10 min; only +10 is within the 60 s grace
    fire(executor)
    assert sample("reliable_executor_schedule_runs_fired_total") - fired_before == 1
    assert sample("reliable_executor_schedule_runs_skipped_total") - skipped_before == 9
    assert sample("reliable_executor_schedule_lag_seconds_count") - lags_before == 1


def test_a_declared_schedule_the_storage_refuses_never_blocks_the_worker(executor, caplog):
    """A schedule= whose parameter the handler rejects is logged once; the worker goes on."""
    from django_reliable_executor.handler_options import declared as _schedules
    from django_reliable_executor.worker.worker import Worker, WorkerOptions

    def takes_nothing() -> None:
        return None

    handler = TaskHandler(takes_nothing, name="tests.no_param")
    handler.schedules = _schedules("tests.no_param", Schedule(every=60, parameter={"x": 1}))
    register(handler)
    try:
        worker = Worker(WorkerOptions(worker_id="w-sync"), executor)
        assert worker.master_loop.sync_declared_schedules() is True  # not retried every round
        assert "were not saved" in caplog.text and "task_parameter" in caplog.text
        assert executor.get_schedule("tests.no_param") is None
    finally:
        unregister("tests.no_param")


def test_a_schedule_that_cannot_be_planned_is_paused_not_retried_forever(executor, clock, caplog):
    executor.schedule("broken", "demo.echo", cron="0 3 * * *", timezone="UTC")
    executor.schedule("fine", "demo.echo", every=60)
    broken = executor.get_schedule("broken")
    # As if the zone had disappeared from the system's time zone database since it was saved.
    executor.storage.save_schedules([dataclasses.replace(broken, timezone="Gone/Zone")], ["broken"])
    clock.advance(24 * 3600)
    fire(executor)
    assert executor.get_schedule("broken").paused
    assert "cannot be planned: paused" in caplog.text
    assert fired_tasks(executor, "fine")  # the others fired


def test_a_round_stops_planning_at_the_task_cap(executor, clock, monkeypatch):
    from django_reliable_executor.master import schedule_firing as firing

    monkeypatch.setattr(firing, "MAX_TASKS_PER_ROUND", 5)
    for i in range(4):
        executor.schedule(f"c{i}", "demo.echo", every=60, misfire="catch_up")
    clock.advance(3 * 60 + 1)  # three runs due each: 12 in all
    created, due = ScheduleFiring(executor).fire_due()
    # two schedules, then "more is due"
    assert len(created) == 6 and due == firing.SCHEDULES_PER_ROUND
    ScheduleFiring(executor).fire_due()
    assert sum(len(fired_tasks(executor, f"c{i}")) for i in range(4)) == 12


def test_what_schedule_returns_is_what_is_stored(executor, clock):
    """On every backend, to the microsecond (times come from the caller's clock)."""
    clock.advance(0.123456)
    info = executor.schedule("exact", "demo.echo", {"p": [1, 2]}, cron="*/5 * * * *")
    assert executor.get_schedule("exact") == info
    clock.advance(1.000001)
    again = executor.schedule("exact", "demo.echo", {"p": [3]}, cron="*/5 * * * *")
    assert executor.get_schedule("exact") == again and again.updated_at == clock.now()
