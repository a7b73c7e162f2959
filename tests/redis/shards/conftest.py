"""Fixtures and helpers of the tests of dependencies and batches across the shards of a sharded
Redis storage (REDIS_SHARDS = 3, on the shared Redis): an ending on one shard reaches its
dependents and batch on others through the shard's outbox (lua/_common.lua,
storage/redis/outbox.py).

The fixtures replace, in this folder only, the suite-wide ones of the same names, which are
parametrised over every backend.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.dependencies import WAITING_RUN_AT
from django_reliable_executor.core.records import Claim
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import sharded_redis_storage
from tests.support.redis_support import index_problems

SHARDS = 3
LEASE = 30.0
# One queue of each shard (pinned in test_redis_shards.py: the hash is part of the layout),
# and a second queue of shard 0.
S0, S1, S2, S0B = "orphan", "default", "prio", "emails"


@pytest.fixture
def storage(clock) -> Iterator[RedisStorage]:
    """A storage of 3 shards under a prefix of its own; after the test, every index invariant
    holds on every shard and no message is left undelivered."""
    with sharded_redis_storage("xshards", SHARDS, clock) as made:
        yield made
        assert index_problems(made) == []


@pytest.fixture
def executor(storage: RedisStorage, clock) -> ReliableExecutor:
    return ReliableExecutor(storage, clock=clock)


def claim(storage: RedisStorage, queue: str, task_id: str) -> Claim:
    """Claim and start exactly ``task_id`` (the only due task of ``queue``)."""
    claims = storage.claim("w1", [queue], 10, LEASE)
    assert [c.task_id for c in claims] == [task_id]
    started = storage.start(claims[0], LEASE)
    assert started is not None
    return started


def complete(storage: RedisStorage, queue: str, task_id: str) -> None:
    assert storage.complete(claim(storage, queue, task_id), {"id": task_id}) is not None


def fail(storage: RedisStorage, queue: str, task_id: str) -> None:
    assert storage.fail(claim(storage, queue, task_id), "boom", retryable=False) is not None


def status(executor: ReliableExecutor, task_id: str) -> TaskStatus:
    return executor.get_task(task_id).status


def outbox_lengths(storage: RedisStorage) -> list[int]:
    return [storage.client.llen(prefix + "outbox") for prefix in storage.prefixes]


def due(executor: ReliableExecutor, task_id: str) -> bool:
    """Whether ``task_id`` waits for nothing but a claim (a dependent released, a new task)."""
    task = executor.get_task(task_id)
    return (
        task.status in (TaskStatus.CREATED, TaskStatus.PENDING)
        and task.waiting_for == ()
        and task.run_at != WAITING_RUN_AT
    )


def step(task_id: str, queue: str, **options) -> TaskSubmitRequest:
    return TaskSubmitRequest("demo.echo", {"id": task_id}, task_id=task_id, queue=queue, **options)
