"""Fixtures of the Redis script tests: a key prefix of each test's own, a Redis storage and a
service over it on the fake clock.

They replace, in this folder only, the suite-wide fixtures of the same names, which are
parametrised over every backend: these tests call Redis scripts and read Redis keys directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest

from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import new_storage, own_key_prefix, require


def redis_storage(key_prefix: str, clock: FakeClock) -> RedisStorage:
    """One more storage (another client) over the test's prefix, on the same clock."""
    return cast(RedisStorage, new_storage("redis", key_prefix, clock=clock))


@pytest.fixture
def key_prefix() -> Iterator[str]:
    require("redis")
    with own_key_prefix(True, "test-scripts") as prefix:
        yield prefix


@pytest.fixture
def storage(key_prefix: str, clock: FakeClock) -> Iterator[RedisStorage]:
    storage = redis_storage(key_prefix, clock)
    yield storage
    storage.close()


@pytest.fixture
def executor(storage: RedisStorage, clock: FakeClock) -> ReliableExecutor:
    return ReliableExecutor(storage, clock=clock)
