"""The Redis storage on the connection of a Django cache (REDIS_CACHE_ALIAS): django-redis and
Django's own RedisCache. Their clients answer bytes, not str: the whole task life must work
through them exactly as through the storage's own client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.conf import get_settings
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage import build_storage
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.connection import connect, describe
from django_reliable_executor.worker.worker import Worker, WorkerOptions
from tests.conftest import REDIS_URL, delete_prefix, redis_client, require

pytestmark = pytest.mark.django_db(
    transaction=True, databases=["default"], available_apps=["django_reliable_executor", "demo"]
)

BACKENDS = {
    "django-redis": "django_redis.cache.RedisCache",
    "django": "django.core.cache.backends.redis.RedisCache",
}


@pytest.fixture(params=sorted(BACKENDS))
def cache_settings(request: pytest.FixtureRequest) -> Iterator[str]:
    """RELIABLE_EXECUTOR on the 'tasks' cache of the given backend, under a prefix of its own."""
    require("redis")
    prefix = f"test-cache-{request.param}"
    caches_setting: dict[str, Any] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "tasks": {"BACKEND": BACKENDS[request.param], "LOCATION": REDIS_URL},
    }
    executor_setting = {"STORAGE": "redis", "REDIS_CACHE_ALIAS": "tasks", "KEY_PREFIX": prefix}
    with override_settings(CACHES=caches_setting, RELIABLE_EXECUTOR=executor_setting):
        yield request.param
    client = redis_client()
    delete_prefix(client, prefix)
    client.close()


def test_the_cache_connection_is_the_one_used(cache_settings):
    client = connect(get_settings())
    assert client.get_connection_kwargs().get("decode_responses", False) is False  # bytes
    assert describe(get_settings()) == f"cache 'tasks' ({REDIS_URL})"
    if cache_settings == "django-redis":
        from django_redis import get_redis_connection

        assert client is get_redis_connection("tasks", write=True)
    else:
        assert (
            client.connection_pool is caches["tasks"]._cache.get_client(write=True).connection_pool
        )


def test_a_whole_task_life_through_a_bytes_client(cache_settings):
    storage = build_storage(get_settings(), flow_limits=FLOW_LIMITS)
    assert isinstance(storage, RedisStorage)
    executor = ReliableExecutor(storage)
    executor.submit("demo.echo", {"n": "é"}, task_id="one", priority=3)
    executor.submit_many([TaskSubmitRequest("demo.echo", {"i": i}) for i in range(20)])
    executor.submit("demo.always_fails", None, task_id="bad", retry_limit=0)
    executor.submit("demo.echo", None, task_id="later", delay_millis=60_000)
    assert executor.cancel_task("later") is True
    assert executor.submit("demo.echo", "again", task_id="one").parameter == {"n": "é"}

    worker = Worker(WorkerOptions(burst=True, poll_interval=0.05), executor)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()

    counts = executor.count_by_status()
    assert (counts[TaskStatus.COMPLETED], counts[TaskStatus.FAILED]) == (21, 1)
    assert counts[TaskStatus.CANCELLED] == 1
    one = executor.get_task("one")
    assert (one.status, one.result, one.attempts) == (TaskStatus.COMPLETED, {"n": "é"}, 1)
    assert "this task always fails" in executor.get_task("bad").last_error
    assert executor.retry_task("bad") is True
    assert executor.get_task("bad").status is TaskStatus.PENDING
    listed = executor.list_tasks(status=TaskStatus.COMPLETED, limit=5)
    assert len(listed) == 5 and all(t.status is TaskStatus.COMPLETED for t in listed)
    assert storage.acquire_lock("master", "me", 10) is True
    assert storage.lock_owner("master") == "me"
    storage.worker_seen("w", {"hostname": "h", "pid": 1, "queues": ["default"]})
    assert [w.worker_id for w in storage.workers()] == ["w"]
    storage.close()  # a borrowed client is left open for the cache
    assert storage.client.ping() is True
