"""A worker (and the system check) warns when the Redis server may lose tasks: an evicting
maxmemory-policy, appendonly no, an appendfsync weaker than everysec."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_reliable_executor.checks import check_database
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import redis_client, start_warnings

pytest_plugins = ["tests.support.redis_servers"]

DURABLE = ("--appendonly", "yes", "--appendfsync", "everysec")


def test_no_warning_with_noeviction_and_an_aof(spare_redis):
    server = spare_redis("--maxmemory-policy", "noeviction", *DURABLE)
    storage = RedisStorage(redis_client(server.url), "test-config")
    assert storage.server_warnings() == []
    storage.close()


def test_an_evicting_policy_is_named_in_the_warning(spare_redis):
    server = spare_redis("--maxmemory-policy", "allkeys-lru", *DURABLE)
    storage = RedisStorage(redis_client(server.url), "test-config", where=server.url)
    [warning] = storage.server_warnings()
    assert "allkeys-lru" in warning and server.url in warning and "noeviction" in warning
    storage.close()


def test_appendonly_no_is_named_with_its_loss_and_how_to_enable_it(spare_redis):
    server = spare_redis()  # the spare servers run with --appendonly no
    storage = RedisStorage(redis_client(server.url), "test-config", where=server.url)
    [warning] = storage.server_warnings()
    assert warning.startswith(f"Redis at {server.url} has appendonly no: a restart of Redis ")
    assert "loses every task" in warning and "Set appendonly yes" in warning
    assert "CONFIG SET appendonly yes" in warning and "appendfsync everysec" in warning
    storage.close()


def test_appendfsync_no_is_named_with_its_loss_window(spare_redis):
    server = spare_redis("--appendonly", "yes", "--appendfsync", "no")
    storage = RedisStorage(redis_client(server.url), "test-config", where=server.url)
    [warning] = storage.server_warnings()
    assert "has appendfsync no" in warning and "30 seconds" in warning
    assert "Set appendfsync everysec" in warning
    storage.close()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_the_worker_logs_it_when_it_starts(spare_redis, caplog):
    server = spare_redis("--maxmemory-policy", "volatile-lru")
    executor = ReliableExecutor(RedisStorage(redis_client(server.url), "test-config"))
    warnings = start_warnings(executor, caplog)
    assert any("volatile-lru" in w for w in warnings), warnings
    assert sum("appendonly no" in w for w in warnings) == 1, warnings  # once, at start


def test_the_system_check_warns_of_appendonly_no(spare_redis):
    plain, durable = spare_redis(), spare_redis(*DURABLE)
    setting = {"STORAGE": "redis", "KEY_PREFIX": "test-config"}
    with override_settings(RELIABLE_EXECUTOR={**setting, "REDIS_URL": plain.url}):
        [warning] = check_database(databases=["default"])
    assert (warning.id, warning.obj, warning.level) == ("reliable_executor.W001", "STORAGE", 30)
    assert "has appendonly no" in warning.msg and "Set appendonly yes" in warning.msg
    with override_settings(RELIABLE_EXECUTOR={**setting, "REDIS_URL": durable.url}):
        assert check_database(databases=["default"]) == []


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_runexecutor_logs_appendonly_no_once_as_it_starts(spare_redis, workers):
    from tests.support.processes import Backend

    server = spare_redis()
    worker = workers.start(Backend("redis", "test-config-worker", redis_url=server.url))
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()
    log = worker.log()
    assert log.count("has appendonly no") == 1, log
    assert "Set appendonly yes" in log, log
