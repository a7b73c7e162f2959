"""The per-status counts and the minute's throughput counts kept by the transition scripts: exact
after batches of claims, starts and completions across queues, with the minute's expiry set."""

from __future__ import annotations

from collections import Counter

from django_reliable_executor.core.states import TaskStatus
from tests.support.redis_support import (
    LEASE,
    WORKER_A,
    assert_consistent,
    submit,
)

ENDINGS_TTL = 7200  # lua/_common.lua, throughput.COUNTER_RETENTION_SECONDS


def minute_counts(storage) -> Counter[str]:
    """The fields of the fake clock's minute's ``tput`` hash, summed over the shards; each
    hash that exists expires within ENDINGS_TTL."""
    minute = int(storage.clock.now().timestamp()) // 60
    total: Counter[str] = Counter()
    for prefix in storage.prefixes:
        key = f"{prefix}tput:{minute}"
        fields = storage.client.hgetall(key)
        if fields:
            assert 0 < storage.client.ttl(key) <= ENDINGS_TTL, key
        for field, n in fields.items():
            total[field] += int(n)
    return total


def only(**counts: int) -> dict[TaskStatus, int]:
    """A count_by_status answer: these statuses, every other one 0."""
    return {status: counts.get(status.name, 0) for status in TaskStatus}


def test_a_batch_of_claims_starts_and_completions_counts_each_task(storage, executor):
    for i in range(6):
        submit(executor, f"a{i}", queue="a")
    for i in range(3):
        submit(executor, f"b{i}", queue="b")
    # Two started by the claim itself, the other seven by one start call.
    claims = storage.claim(WORKER_A, ["a", "b"], 9, LEASE, start=2)
    assert len(claims) == 9 and sum(c.is_started for c in claims) == 2
    assert executor.count_by_status() == only(CREATED=7, RUNNING=2)
    rest = storage.start_many([c for c in claims if not c.is_started], LEASE)
    assert all(rest)
    started = [c for c in claims if c.is_started] + rest
    assert executor.count_by_status("a") == only(RUNNING=6)
    assert executor.count_by_status("b") == only(RUNNING=3)
    assert {(c.task.attempts, c.budget_attempts) for c in started} == {(1, 1)}
    assert executor.get_task("a5").attempts == 1
    assert minute_counts(storage) == Counter()

    results = storage.complete_many([(c, i) for i, c in enumerate(started)])
    assert all(results)
    assert executor.count_by_status("a") == only(COMPLETED=6)
    assert executor.count_by_status("b") == only(COMPLETED=3)
    assert minute_counts(storage) == Counter({"COMPLETED": 9, "c:a": 6, "c:b": 3})
    assert_consistent(storage)

    # More in the same minute add to the fields (the expiry set by the first count stays),
    # and a retry counts apart.
    for i in range(6, 9):
        submit(executor, f"a{i}", queue="a")
    claims = storage.start_many(storage.claim(WORKER_A, ["a"], 3, LEASE), LEASE)
    assert all(claims)
    assert storage.fail(claims[0], "boom", retryable=True) is not None
    assert all(storage.complete_many([(c, "ok") for c in claims[1:]]))
    assert executor.count_by_status("a") == only(PENDING=1, COMPLETED=8)
    assert minute_counts(storage) == Counter({"COMPLETED": 11, "c:a": 8, "c:b": 3, "RETRIED": 1})
    assert_consistent(storage)
