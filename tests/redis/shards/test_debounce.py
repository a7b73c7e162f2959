"""Debounce over 3 Redis shards: a debounced key lives on its home shard (sharding.unique_home),
its task on its queue's shard. A submit to any queue joins that task where it is stored
(debounce_join.lua, or submit.lua when it is the home shard's), and the key's window follows
its new run at on the home shard; a task claimed or started there answers no submit, which
takes the key for a new task."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.debouncing import KEY_HOLD, debounce_digest
from django_reliable_executor.storage.redis.codec import micros
from django_reliable_executor.storage.redis.reservations import UNIQUE_RESERVATION_GRACE_SECONDS
from django_reliable_executor.storage.redis.sharding import unique_home
from tests.redis.shards.conftest import S0, S1, S2, SHARDS, claim

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def key_of_home(home: int, tag: str) -> tuple[str, str]:
    """A unique_key of a debounced demo.echo whose home shard is ``home``, and its digest."""
    for n in range(1000):
        digest = debounce_digest("demo.echo", f"{tag}-{n}", None)
        if unique_home(digest, SHARDS) == home:
            return f"{tag}-{n}", digest
    raise AssertionError("no key found")


def entry(storage, home: int, digest: str) -> list[str]:
    """The key's entry on its home shard, split: window end, task id[, shard, taken at]."""
    return storage.client.get(storage.prefixes[home] + "u:" + digest).split(" ")


def submit(executor, parameter, queue: str, key: str, **options):
    return executor.submit(
        "demo.echo", parameter, queue=queue, debounce=10, unique_key=key, **options
    )


@pytest.mark.parametrize(
    ("home", "queues"),
    [
        (0, (S1, S1, S2)),  # the task off the key's home: joined there, the key kept on 0
        (1, (S1, S2, S0)),  # the task on the key's home: joined with its key in one call
        (1, (S2, S1, S0)),  # the home's own queue meets a task of another shard ('ureserved')
    ],
)
def test_submits_to_any_queue_join_the_task_wherever_it_is_stored(
    executor, storage, clock, home, queues
):
    key, digest = key_of_home(home, f"join-{home}-{queues[0]}")
    first = submit(executor, 0, queues[0], key)
    for n, queue in enumerate(queues[1:], 1):
        clock.advance(3)
        joined = submit(executor, n, queue, key)
        assert (joined.task_id, joined.debounced, joined.parameter) == (first.task_id, True, n)
        assert joined.queue == queues[0]  # the task stays where it is
        assert joined.run_at == clock.now() + dt.timedelta(seconds=10)
        assert entry(storage, home, digest)[:2] == [
            micros(joined.run_at + KEY_HOLD),
            first.task_id,
        ]
    assert executor.get_task(first.task_id).parameter == len(queues) - 1
    assert executor.count_by_status()[TaskStatus.CREATED] == 1
    clock.advance(10)
    done = claim(storage, queues[0], first.task_id)
    assert done.task.parameter == len(queues) - 1


def test_a_started_task_of_another_shard_lets_the_next_submit_take_the_key(
    executor, storage, clock
):
    key, digest = key_of_home(0, "started")
    first = submit(executor, 1, S1, key)
    clock.advance(10)
    claim(storage, S1, first.task_id)
    second = submit(executor, 2, S2, key)
    assert second.task_id != first.task_id and not second.debounced and second.queue == S2
    assert entry(storage, 0, digest)[1] == second.task_id
    assert submit(executor, 3, S1, key).task_id == second.task_id  # joins the new window
    assert executor.get_task(first.task_id).parameter == 1
    assert executor.get_task(second.task_id).parameter == 3


def test_one_call_of_a_key_off_its_home_stores_one_task_with_the_last_parameter(executor, storage):
    key, digest = key_of_home(0, "many")
    requests = [
        TaskSubmitRequest("demo.echo", n, queue=S1, debounce=10, unique_key=key) for n in range(3)
    ]
    infos = executor.submit_many(requests)
    assert len({info.task_id for info in infos}) == 1
    assert [info.debounced for info in infos] == [False, True, True]
    assert executor.get_task(infos[0].task_id).parameter == 2
    assert entry(storage, 0, digest)[1:3] == [infos[0].task_id, "1"]


@pytest.mark.parametrize("options", [{"debounce": 10}, {"unique_for": 60}])
def test_one_call_of_a_key_over_several_shards_keeps_one_task_without_waiting(executor, options):
    """The key's first task is of shard 2, written after shard 1's part: shard 1's task of
    the key is submitted once every part is written (not left waiting for a reservation
    whose task is not stored yet, then storing a second task), as are later ones."""
    requests = [
        TaskSubmitRequest("demo.echo", n, queue=queue, unique_key="across", **options)
        for n, queue in enumerate((S2, S1, S0, S2))
    ]
    started = time.monotonic()
    infos = executor.submit_many(requests)
    assert time.monotonic() - started < UNIQUE_RESERVATION_GRACE_SECONDS / 2
    assert {(info.task_id, info.queue) for info in infos} == {(infos[0].task_id, S2)}
    debounced = "debounce" in options
    assert [info.debounced for info in infos] == [False, debounced, debounced, debounced]
    assert executor.get_task(infos[0].task_id).parameter == (3 if debounced else 0)
