"""A worker warns when the Redis server may delete tasks (an evicting maxmemory-policy)."""

from __future__ import annotations

import pytest

from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import redis_client, start_warnings

pytest_plugins = ["tests.redis_servers"]


def test_no_warning_with_noeviction(spare_redis):
    server = spare_redis("--maxmemory-policy", "noeviction")
    storage = RedisStorage(redis_client(server.url), "test-config")
    assert storage.server_warnings() == []
    storage.close()


def test_an_evicting_policy_is_named_in_the_warning(spare_redis):
    server = spare_redis("--maxmemory-policy", "allkeys-lru")
    storage = RedisStorage(redis_client(server.url), "test-config", where=server.url)
    [warning] = storage.server_warnings()
    assert "allkeys-lru" in warning and server.url in warning and "noeviction" in warning
    storage.close()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_worker_logs_it_when_it_starts(spare_redis, caplog):
    server = spare_redis("--maxmemory-policy", "volatile-lru")
    executor = ReliableExecutor(RedisStorage(redis_client(server.url), "test-config"))
    warnings = start_warnings(executor, caplog)
    assert any("volatile-lru" in w for w in warnings), warnings
