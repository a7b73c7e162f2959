"""Unique tasks across Redis shards: eight processes submitting one key to queues on every
shard (REDIS_SHARDS = 3) store exactly one task, whatever the key's home shard."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.storage.redis.sharding import shard_of, unique_home
from tests.conftest import own_key_prefix, require
from tests.support.processes import Backend, service_for
from tests.support.racers import race

RACERS = 8
SHARDS = 3
QUEUES = ("orphan", "default", "prio", "emails", "alpha", "search")  # shards 0 1 2 0 1 2


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """Redis only: a key prefix of this test's own, its shards' keys deleted afterwards."""
    with own_key_prefix(True) as prefix:
        yield prefix


def test_racing_processes_on_every_shard_store_one_task_per_unique_key(key_prefix, tmp_path):
    require("redis")
    assert [shard_of(q, SHARDS) for q in QUEUES] == [0, 1, 2, 0, 1, 2]
    backend = Backend("redis", key_prefix, shards=SHARDS)
    service = service_for(backend)
    homes: dict[int, str] = {}  # a key of each home shard
    for n in range(100):
        home = unique_home(unique_digest("demo.echo", f"race-{n}", None), SHARDS)
        homes.setdefault(home, f"race-{n}")
    assert sorted(homes) == [0, 1, 2]
    for home, key in sorted(homes.items()):
        folder = tmp_path / f"home-{home}"
        folder.mkdir()
        submit = {
            "task_name": "demo.echo",
            "parameter": {"home": home},
            "unique_for": 300,
            "unique_key": key,
            "queues": list(QUEUES),
        }
        ids = race(backend, RACERS, folder, submit)
        stored = [
            task
            for task in service.list_tasks(task_name="demo.echo", limit=100)
            if task.parameter == {"home": home}
        ]
        assert len(stored) == 1, [(t.task_id, t.queue) for t in stored]
        assert ids == {stored[0].task_id}
