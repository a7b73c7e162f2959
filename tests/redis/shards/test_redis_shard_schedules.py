"""Schedules over several Redis shards: each on its queue's shard, fired there, read merged,
moved when its queue's shard changes; their fires' ids native to that shard."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from django_reliable_executor import Schedule, TaskStatus
from django_reliable_executor.admin.schedule_pages import fires
from django_reliable_executor.core.ids import fire_task_id
from django_reliable_executor.handler_options import declared as _schedules
from django_reliable_executor.master.schedule_firing import ScheduleFiring, fire_task
from django_reliable_executor.registry import (
    FLOW_LIMITS,
    TaskHandler,
    register,
    unregister,
)
from django_reliable_executor.schedules.records import ScheduleFire
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage, schedule_moves
from django_reliable_executor.storage.redis.codec import fields
from django_reliable_executor.storage.redis.resharding import check_reshard
from django_reliable_executor.storage.redis.schedules import _encoded
from django_reliable_executor.storage.redis.sharding import directory_of, shard_of
from tests.conftest import redis_client, sharded_redis_storage

if TYPE_CHECKING:
    from tests.support.redis_servers import SpareServers

# spare_redis: a server of our own to count commands on
pytest_plugins = ["tests.support.redis_servers"]
pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

SHARDS = 4
SEC = dt.timedelta(seconds=1)


def queue_on(shard: int, shards: int = SHARDS) -> str:
    """The first queue name ``queue-<i>`` of this shard."""
    return next(f"queue-{i}" for i in range(1000) if shard_of(f"queue-{i}", shards) == shard)


def fire(executor: ReliableExecutor) -> list:
    """One master round of schedule firing: the tasks it stored."""
    return ScheduleFiring(executor).fire_due()[0]


def schedule_shards(storage: RedisStorage, schedule_id: str) -> list[int]:
    """The shards holding a hash of this schedule."""
    return [
        shard
        for shard, prefix in enumerate(storage.prefixes)
        if storage.client.exists(prefix + "s:" + schedule_id)
    ]


def tasks_of(executor: ReliableExecutor, schedule_id: str) -> list:
    found = [t for t in executor.list_tasks(limit=1000) if t.task_id.startswith(schedule_id + "@")]
    return sorted(found, key=lambda t: t.run_at)


@pytest.fixture
def storage(clock) -> Iterator[RedisStorage]:
    with sharded_redis_storage("shard-sched", SHARDS, clock) as made:
        yield made


def test_a_schedule_of_shard_2_fires_there_on_time_and_skips_while_its_run_is_live(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    queue = queue_on(2)
    info = executor.schedule("two", "demo.echo", {"n": 1}, every=60, queue=queue, overlap="skip")
    assert schedule_shards(storage, "two") == [2]
    assert storage.client.zscore(storage.prefixes[2] + "schedules:due", "two") is not None
    assert all(
        not storage.client.exists(prefix + "schedules:due") for prefix in storage.prefixes[:2]
    )
    assert executor.storage.next_schedule_due() == info.next_run_at
    clock.advance(59)
    assert fire(executor) == []  # not due yet
    clock.advance(1)
    [first] = fire(executor)
    assert (first.queue, first.run_at, first.status) == (
        queue,
        info.next_run_at,
        TaskStatus.CREATED,
    )
    assert directory_of(first.task_id, SHARDS) == 2  # native to its queue's shard
    assert first.task_id == fire_task_id("two", info.next_run_at) + "~1"  # its plain id: shard 1
    assert storage.client.exists(storage.prefixes[2] + "t:" + first.task_id)
    assert executor.get_task(first.task_id).queue == queue
    assert executor.get_schedule("two").last_task_id == first.task_id
    # The first run is still waiting: overlap="skip" fires nothing, and counts the run skipped.
    clock.advance(60)
    assert fire(executor) == []
    skipped = executor.get_schedule("two")
    assert skipped.overlap_skipped == 1 and skipped.next_run_at == info.next_run_at + 120 * SEC
    assert executor.cancel_task(first.task_id)
    clock.advance(60)
    [second] = fire(executor)
    assert second.run_at == info.next_run_at + 120 * SEC and directory_of(second.task_id, 4) == 2
    assert [t.task_id for t in tasks_of(executor, "two")] == [first.task_id, second.task_id]
    # The admin's schedule page shows each fire's planned time, without the shard's suffix.
    shown = fires(executor, executor.get_schedule("two"), "admin")
    assert [(f.task.task_id, f.planned) for f in shown] == [
        (second.task_id, f"{second.run_at:%Y%m%dT%H%M%S}Z"),
        (first.task_id, f"{first.run_at:%Y%m%dT%H%M%S}Z"),
    ]


def test_list_pause_resume_and_delete_across_shards(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    # Ids in an order that goes back and forth between the shards.
    homes = {"a": 3, "b": 0, "c": 2, "d": 1, "e": 3}
    for schedule_id, shard in homes.items():
        executor.schedule(schedule_id, "demo.echo", every=60 + shard, queue=queue_on(shard))
    for schedule_id, shard in homes.items():
        assert schedule_shards(storage, schedule_id) == [shard]
    ids = ["a", "b", "c", "d", "e"]
    assert [s.schedule_id for s in executor.list_schedules()] == ids
    assert [s.schedule_id for s in executor.list_schedules(limit=2, offset=1)] == ["b", "c"]
    assert executor.pause_schedule("c").paused and executor.pause_schedule("a").paused
    assert storage.client.zscore(storage.prefixes[2] + "schedules:paused", "c") == 0
    assert [s.schedule_id for s in executor.list_schedules(paused=True)] == ["a", "c"]
    assert [s.schedule_id for s in executor.list_schedules(paused=False)] == ["b", "d", "e"]
    assert [s.schedule_id for s in executor.list_schedules(paused=False, offset=1, limit=1)] == [
        "d"
    ]
    assert executor.count_schedules() == {"active": 3, "paused": 2}
    assert executor.storage.next_schedule_due() == executor.get_schedule("b").next_run_at
    assert not executor.resume_schedule("a").paused
    assert not executor.get_schedule("a").paused and executor.get_schedule("c").paused
    assert executor.delete_schedule("c") and not executor.delete_schedule("c")
    assert executor.get_schedule("c") is None and schedule_shards(storage, "c") == []
    assert [s.schedule_id for s in executor.list_schedules()] == ["a", "b", "d", "e"]
    assert executor.count_schedules() == {"active": 4, "paused": 0}
    assert executor.pause_schedule("nothing") is None
    # The check before changing the number of shards counts the schedules of every shard.
    assert check_reshard(storage, 2).schedules == 4


def test_moving_a_schedule_across_shards_fires_once_per_due_time(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    old, new = queue_on(1), queue_on(3)
    info = executor.schedule("mover", "demo.echo", every=60, queue=old)
    clock.advance(60)
    [first] = fire(executor)
    assert first.queue == old and directory_of(first.task_id, SHARDS) == 1
    # Planned on the old shard, then moved before the fire is stored: that fire stores nothing.
    clock.advance(60)
    due = executor.storage.due_schedules(clock.now(), 10)
    [planned] = [fire_task(due[0], due[0].next_run_at, clock.now())]
    stale = ScheduleFire(
        "mover",
        due[0].next_run_at,
        due[0].next_run_at + 60 * SEC,
        (planned,),
        planned.run_at,
        planned.task_id,
    )
    moved = executor.schedule("mover", "demo.echo", every=60, queue=new)
    assert schedule_shards(storage, "mover") == [3]
    assert (moved.queue, moved.next_run_at, moved.last_task_id, moved.created_at) == (
        new,
        info.next_run_at + 60 * SEC,  # the same grid: its next run is kept
        first.task_id,
        info.created_at,
    )
    assert executor.storage.fire_schedules([stale], clock.now()) == []
    [second] = fire(executor)  # the run of that due time, once, on the new shard
    assert (second.queue, second.run_at) == (new, info.next_run_at + 60 * SEC)
    assert directory_of(second.task_id, SHARDS) == 3
    assert fire(executor) == []
    clock.advance(60)
    [third] = fire(executor)
    assert third.run_at == info.next_run_at + 120 * SEC
    runs = [t.run_at for t in tasks_of(executor, "mover")]
    assert runs == [info.next_run_at + n * 60 * SEC for n in range(3)]  # each due time once
    # A paused schedule moves paused.
    executor.pause_schedule("mover")
    assert executor.schedule("mover", "demo.echo", every=60, queue=old).paused
    assert schedule_shards(storage, "mover") == [1]
    assert executor.list_schedules(paused=True)[0].schedule_id == "mover"


def test_a_move_stopped_half_way_fires_nowhere_until_the_schedule_is_written_again(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    old, new = queue_on(0), queue_on(2)
    info = executor.schedule("half", "demo.echo", every=60, queue=old, misfire="catch_up")
    # The saving process stopped after the move's first step (the old shard's).
    storage._run("schedule_move_out", "half", "2", shard=0)
    clock.advance(120)
    assert fire(executor) == []  # it fires nowhere meanwhile
    shown = executor.get_schedule("half")
    assert (shown.queue, shown.next_run_at) == (old, info.next_run_at)  # read as it was
    assert [s.schedule_id for s in executor.list_schedules()] == ["half"]
    assert executor.count_schedules() == {"active": 1, "paused": 0}
    # Saving it again finishes the move; the runs it missed meet its misfire policy.
    assert (
        executor.schedule("half", "demo.echo", every=60, queue=new, misfire="catch_up").queue == new
    )
    assert schedule_shards(storage, "half") == [2]
    late = fire(executor)  # the runs it missed (misfire="catch_up"), each once
    assert [(t.queue, t.run_at) for t in late] == [
        (new, info.next_run_at),
        (new, info.next_run_at + 60 * SEC),
    ]
    # Stopped after the second step: both shards hold it, it is read and listed once, and
    # pausing it deletes the hash left behind.
    back = dataclasses.replace(executor.get_schedule("half"), queue=old)
    reply = storage._run("schedule_move_out", "half", "0", shard=2)
    state = schedule_moves.moved_in(fields(reply), back, set(), set(), _encoded)
    assert storage._run("schedule_move_in", "half", state, shard=0) == 1
    assert sorted(schedule_shards(storage, "half")) == [0, 2]
    assert [s.schedule_id for s in executor.list_schedules()] == ["half"]
    assert executor.get_schedule("half").queue == old  # the copy that is not moving away
    assert executor.pause_schedule("half").paused
    assert schedule_shards(storage, "half") == [0]


def test_a_move_undone_by_a_pause_restores_the_schedule_on_its_own_shard(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    old = queue_on(1)
    info = executor.schedule("undo", "demo.echo", every=60, queue=old)
    storage._run("schedule_move_out", "undo", "3", shard=1)
    assert executor.resume_schedule("undo").next_run_at == info.next_run_at
    assert schedule_shards(storage, "undo") == [1]
    clock.advance(60)
    [task] = fire(executor)
    assert (task.queue, task.run_at) == (old, info.next_run_at)


def test_a_fired_task_is_found_with_one_read_of_its_shard(spare_redis: SpareServers, clock):
    """On a server of our own, INFO commandstats counts what get() sends: one HGETALL (and
    the directory entry's GET), not one per shard as for an id stored off its directory."""
    server = spare_redis()
    client = server.client(decode_responses=True)
    storage = RedisStorage(client, "count", clock=clock, shards=SHARDS, flow_limits=FLOW_LIMITS)
    executor = ReliableExecutor(storage, clock=clock)
    # A schedule whose plain fire id has its directory on another shard than its queue's.
    queue = queue_on(0)
    schedule_id = next(
        f"s{i}"
        for i in range(1000)
        if directory_of(fire_task_id(f"s{i}", clock.now() + 60 * SEC), SHARDS) != 0
    )
    info = executor.schedule(schedule_id, "demo.echo", every=60, queue=queue)
    assert directory_of(fire_task_id(schedule_id, info.next_run_at), SHARDS) != 0
    clock.advance(60)
    [task] = fire(executor)
    client.config_resetstat()
    assert executor.get_task(task.task_id).queue == queue
    stats = client.info("commandstats")
    assert stats["cmdstat_hgetall"]["calls"] == 1
    assert stats["cmdstat_get"]["calls"] == 1
    # Its id: the run's, with the first suffix that puts its directory on the queue's shard.
    assert task.task_id.startswith(fire_task_id(schedule_id, info.next_run_at) + "~")
    assert directory_of(task.task_id, SHARDS) == 0
    storage.close()


def test_declared_schedules_are_saved_on_their_queues_shards_and_follow_their_queue(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    """What every worker does at start (sync_declared_schedules), over shards: each declared
    schedule on its queue's shard; a declaration whose queue moved to another shard, saved by
    two workers one after the other, moves the schedule once and keeps its grid."""
    handler = TaskHandler(lambda param=None: param, name="tests.sharded")
    first, second = queue_on(1), queue_on(2)
    handler.schedules = _schedules(
        "tests.sharded",
        [
            Schedule(every=60, schedule_id="decl-a", queue=first),
            Schedule(every=60, schedule_id="decl-b", queue=queue_on(3)),
        ],
    )
    register(handler)
    try:
        assert executor.sync_declared_schedules() == 2
        assert schedule_shards(storage, "decl-a") == [1]
        assert schedule_shards(storage, "decl-b") == [3]
        assert executor.sync_declared_schedules() == 0  # unchanged: nothing written
        before = executor.get_schedule("decl-a")
        handler.schedules = _schedules(
            "tests.sharded",
            [
                Schedule(every=60, schedule_id="decl-a", queue=second),
                Schedule(every=60, schedule_id="decl-b", queue=queue_on(3)),
            ],
        )
        other = ReliableExecutor(
            RedisStorage(
                redis_client(),
                storage.key_prefix,
                clock=clock,
                shards=SHARDS,
                flow_limits=FLOW_LIMITS,
            ),
            clock=clock,
        )
        assert executor.sync_declared_schedules() == 1
        assert other.sync_declared_schedules() == 0  # the second worker finds it moved
        other.storage.close()
        after = executor.get_schedule("decl-a")
        assert schedule_shards(storage, "decl-a") == [2]
        assert (after.queue, after.start_at, after.next_run_at, after.created_at) == (
            second,
            before.start_at,
            before.next_run_at,
            before.created_at,
        )
        clock.advance(60)
        fired = sorted(fire(executor), key=lambda t: t.task_id)
        assert [(t.task_id.partition("@")[0], t.queue) for t in fired] == [
            ("decl-a", second),
            ("decl-b", queue_on(3)),
        ]
    finally:
        unregister("tests.sharded")


def test_a_copy_left_by_two_racing_saves_is_dropped_by_the_next_save(
    executor: ReliableExecutor, storage: RedisStorage, clock
):
    """Two processes saving one schedule at once with queues of two shards may each store a
    copy (docs/redis-shards.md): it is listed once, and the next save keeps the copy of its
    queue."""
    old, new = queue_on(1), queue_on(3)
    info = executor.schedule("raced", "demo.echo", every=60, queue=old)
    # The other process read "not stored yet" and saved its definition on its queue's shard.
    storage._save_on([dataclasses.replace(info, queue=new)], set(), set(), 3)
    assert schedule_shards(storage, "raced") == [1, 3]
    assert [s.schedule_id for s in executor.list_schedules()] == ["raced"]
    executor.schedule("raced", "demo.echo", every=60, queue=new)
    assert schedule_shards(storage, "raced") == [3]
    assert executor.count_schedules() == {"active": 1, "paused": 0}
    clock.advance(60)
    assert [t.queue for t in fire(executor)] == [new]
