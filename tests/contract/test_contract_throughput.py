"""Contract: what the admin's summary charts on every backend — tasks completed, failed and
retried per UTC minute over the last hour (and completed per queue, for its sparklines), and
the oldest due task of each queue."""

from __future__ import annotations

import datetime as dt

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.minute_counts import epoch_minute
from tests.conftest import DB_ALIASES, db_params, new_storage, own_key_prefix, redis_client
from tests.support.contract_support import claim_and_start, claim_one


def _at(clock, hours: int, minutes: int, seconds: int) -> dt.datetime:
    """Move the fake clock (2030-01-01 00:00:00 UTC at the start) forward to this time."""
    target = dt.datetime(2030, 1, 1, hours, minutes, seconds, tzinfo=dt.timezone.utc)
    clock.advance((target - clock.now()).total_seconds())
    return clock.now()


def _run(executor, storage, task_id: str, outcome: str) -> None:
    """Submit one task to its own queue, claim and start it, and end its attempt so."""
    executor.submit("demo.echo", None, task_id=task_id, queue=task_id, retry_limit=3)
    claim = claim_and_start(storage, queue=task_id)
    if outcome == "complete":
        assert storage.complete(claim, "ok") is not None
    else:
        transition = storage.fail(
            claim, "boom", retryable=outcome == "retry", is_error=outcome == "error"
        )
        assert transition is not None
        assert (
            transition.status
            is {
                "retry": TaskStatus.PENDING,
                "fail": TaskStatus.FAILED,
                "error": TaskStatus.ERROR,
            }[outcome]
        )


def test_endings_are_counted_per_minute_over_the_last_hour(executor, storage, clock):
    assert clock.now() == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    _at(clock, 0, 59, 30)
    _run(executor, storage, "old", "complete")  # 61 minutes before the end: left out
    _at(clock, 1, 0, 59)
    _run(executor, storage, "edge-out", "complete")  # in the minute before the window
    _at(clock, 1, 1, 0)
    _run(executor, storage, "edge-in", "complete")  # the first second of the window
    _run(executor, storage, "edge-retry", "retry")

    _at(clock, 1, 59, 0)
    executor.submit("demo.echo", None, task_id="lost", queue="lost")
    lost = storage.start(claim_one(storage, queue="lost"), 10)  # its worker then dies
    assert lost is not None
    executor.submit("demo.echo", None, task_id="slow", queue="slow", max_duration_millis=30_000)

    _at(clock, 2, 0, 10)
    [recovered] = storage.recover_expired(100)  # worker lost: an automatic retry
    assert recovered.status is TaskStatus.PENDING
    [expired] = storage.expire_overdue(100)
    assert expired.status is TaskStatus.TIMEOUT
    _at(clock, 2, 0, 20)
    for task_id, outcome in [
        ("ok-1", "complete"),
        ("ok-2", "complete"),
        ("bad", "fail"),
        ("broken", "error"),
        ("again", "retry"),
    ]:
        _run(executor, storage, task_id, outcome)
    executor.submit("demo.echo", None, task_id="dropped", queue="dropped")
    assert executor.cancel_task("dropped")  # CANCELLED: not a failure
    end = _at(clock, 2, 0, 30)

    minutes = executor.throughput()
    assert len(minutes) == 60
    assert [m.minute for m in minutes] == [
        dt.datetime(2030, 1, 1, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=i)
        for i in range(60)
    ]
    first, last = minutes[0], minutes[-1]
    assert (first.completed, first.failed, first.retried) == (1, 0, 1)
    assert (last.completed, last.failed, last.retried) == (2, 3, 2)  # FAILED, ERROR, TIMEOUT
    assert all(m.total == 0 for m in minutes[1:-1])
    assert epoch_minute(last.minute) == epoch_minute(end)

    # A shorter window: the current minute and the four before it.
    short = executor.throughput(5)
    assert [m.minute for m in short] == [m.minute for m in minutes[-5:]]
    assert short[-1] == last
    with pytest.raises(ValueError, match="minutes"):
        executor.throughput(0)


def test_a_task_counts_once_per_ending(executor, storage, clock):
    """Two failed attempts sent back to PENDING, then a success: two retries, one completion."""
    executor.submit("demo.echo", None, task_id="flaky", queue="flaky", retry_limit=3)
    for _ in range(2):
        claim = claim_and_start(storage, queue="flaky")
        assert storage.fail(claim, "boom", retryable=True).status is TaskStatus.PENDING
        clock.advance(2)  # past the retry interval
    storage.complete(claim_and_start(storage, queue="flaky"), "ok")
    last = executor.throughput()[-1]
    assert (last.completed, last.failed, last.retried) == (1, 0, 2)
    assert sum(m.total for m in executor.throughput()) == 3


def _complete_in(executor, storage, task_id: str, queue: str) -> None:
    executor.submit("demo.echo", None, task_id=task_id, queue=queue)
    assert storage.complete(claim_and_start(storage, queue=queue), "ok") is not None


def test_completions_are_counted_per_queue_and_minute(executor, storage, clock):
    """The summary's sparklines: completed per queue per minute, only the queues asked for,
    in their order, zeros filled; failures and retries are not completions."""
    _at(clock, 0, 59, 30)
    _complete_in(executor, storage, "old", "alpha")  # 61 minutes before the end: left out
    _at(clock, 1, 1, 0)
    _complete_in(executor, storage, "a-1", "alpha")  # the first minute of the window
    _complete_in(executor, storage, "b-1", "beta")
    _at(clock, 1, 30, 5)
    _complete_in(executor, storage, "b-2", "beta")
    _complete_in(executor, storage, "b-3", "beta")
    _run(executor, storage, "beta-failed", "fail")  # its own queue, and not a completion
    executor.submit("demo.echo", None, task_id="b-bad", queue="beta", retry_limit=3)
    assert storage.fail(claim_and_start(storage, queue="beta"), "boom", retryable=True)
    _at(clock, 2, 0, 30)
    _complete_in(executor, storage, "a-2", "alpha")
    _complete_in(executor, storage, "o-1", "other")  # not asked for: not read

    found = executor.completed_by_queue(["beta", "alpha", "idle", "beta"])
    assert list(found) == ["beta", "alpha", "idle"]
    assert all(len(minutes) == 60 for minutes in found.values())
    assert found["alpha"] == [1] + [0] * 58 + [1]
    assert found["beta"] == [1] + [0] * 28 + [2] + [0] * 30  # 01:01, 01:30
    assert found["idle"] == [0] * 60
    # the chart's completions are the sum of every queue's
    total = [m.completed for m in executor.throughput()]
    other = executor.completed_by_queue(["other"])["other"]
    assert [
        a + b + o for a, b, o in zip(found["alpha"], found["beta"], other, strict=True)
    ] == total

    assert executor.completed_by_queue(["alpha", "beta"], 5) == {
        "alpha": [0, 0, 0, 0, 1],
        "beta": [0] * 5,
    }
    assert executor.completed_by_queue([]) == {}
    with pytest.raises(ValueError, match="minutes"):
        executor.completed_by_queue(["alpha"], 0)


def test_the_chart_of_an_empty_store_is_sixty_empty_minutes(executor):
    minutes = executor.throughput()
    assert len(minutes) == 60 and all(m.total == 0 for m in minutes)


def test_oldest_due_by_queue_is_each_queues_longest_waiting_unclaimed_task(
    executor, storage, clock
):
    assert executor.oldest_due_by_queue() == {}
    start = clock.now()
    executor.submit("demo.echo", None, task_id="a-1", queue="alpha")
    executor.submit("demo.echo", None, task_id="b-claimed", queue="beta")
    clock.advance(5)
    executor.submit("demo.echo", None, task_id="a-2", queue="alpha")
    executor.submit("demo.echo", None, task_id="b-1", queue="beta")
    executor.submit("demo.echo", None, task_id="p-1", queue="paused")
    executor.submit("demo.echo", None, task_id="later", queue="later", delay_millis=600_000)
    executor.pause_queue("paused")
    claimed = storage.claim("w1", ["beta"], 1, 60)  # claimed: no longer waiting for a worker
    assert [c.task_id for c in claimed] == ["b-claimed"]
    clock.advance(30)

    oldest = executor.oldest_due_by_queue()
    five = start + dt.timedelta(seconds=5)
    # A paused queue's tasks wait too; a task due in ten minutes is not due.
    assert oldest == {"alpha": start, "beta": five, "paused": five}
    assert list(oldest) == sorted(oldest)
    assert executor.oldest_due_at() == min(oldest.values())
    assert all(executor.oldest_due_at(queue) == at for queue, at in oldest.items())

    clock.advance(600)  # the delayed task is due now, and has waited 5 s
    assert executor.oldest_due_by_queue()["later"] == five + dt.timedelta(seconds=600)


@pytest.mark.parametrize("alias", ["redis"])
def test_redis_minute_counters_expire_after_two_hours(alias, clock):
    """Each minute's hash of endings is kept two hours (the chart reads one), then expires."""
    from django_reliable_executor.service.reliable_executor import ReliableExecutor

    with own_key_prefix(True) as prefix:
        storage = new_storage("redis", prefix, clock=clock)
        try:
            executor = ReliableExecutor(storage, clock=clock)
            _run(executor, storage, "t", "complete")
            client = redis_client()
            # Each shard counts the endings of its own tasks (the chart sums them): sharded
            # (TEST_REDIS_SHARDS), the hash is under the hash tag of queue "t"'s shard, not
            # "{prefix}:".
            shard_prefix = storage.layout.prefix_of("t")
            key = f"{shard_prefix}tput:{epoch_minute(clock.now())}"
            # and the completion by queue, for the summary's sparklines
            assert client.hgetall(key) == {"COMPLETED": "1", "c:t": "1"}
            assert 7100 < client.ttl(key) <= 7200
            client.close()
        finally:
            storage.close()


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_database_retry_counts_are_purged_after_two_hours(alias, executor, storage, clock):
    """The per-minute retry rows go with the master's purge once two hours old."""
    from django_reliable_executor.models import ReliableRetryCount

    rows = ReliableRetryCount.objects.using(alias)
    _run(executor, storage, "flaky", "retry")
    assert list(rows.values_list("minute", "retried")) == [(epoch_minute(clock.now()), 1)]
    clock.advance(3600)
    storage.purge_finished(clock.now(), 100)
    assert rows.count() == 1  # an hour old: still in reach of the chart's hour
    clock.advance(3660)  # past two hours after its minute ended
    storage.purge_finished(clock.now(), 100)
    assert rows.count() == 0


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_the_finished_index_holds_the_status_and_queue_partial_on_postgres(alias):
    """The chart's count of the last hour by status, and the sparklines' completions by queue,
    read the finished index alone."""
    from django.db import connections

    connection = connections[alias]
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "reliable_executor_task")
        assert found["rexec_finished_idx"]["columns"] == ["finished_at", "status", "queue"]
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'rexec_finished_idx'")
            assert cursor.fetchone()[0].endswith("WHERE (finished_at IS NOT NULL)")
