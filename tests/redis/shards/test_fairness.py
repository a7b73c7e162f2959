"""fairness="round_robin" over 3 Redis shards: a fair name's tasks, whatever queue they are
submitted to, are stored on its home shard (the shard of its own queue) as a capped name's
are, so its rounds and fair sets are on one shard; workers of each queue claim them there in
round order, and cancelling, listing and reading find them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.codec import fair_member
from django_reliable_executor.storage.redis.sharding import shard_of
from tests.conftest import sharded_redis_storage
from tests.redis.fair_support import fair_problems

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

SHARDS = 3
# demo.fair's own queue is "default", of shard 1: its home. "orphan" is of shard 0.
HOME, ORPHAN = 1, "orphan"
FAIR = "demo.fair"
LEASE = 30.0


@pytest.fixture
def storage(clock) -> Iterator[RedisStorage]:
    """A storage of 3 shards; after the test every index holds on every shard, fair ones
    included."""
    with sharded_redis_storage("shard-fair", SHARDS, clock) as made:
        yield made
        assert fair_problems(made) == []


def submit(executor, key: str, count: int, queue: str) -> list[str]:
    requests = [
        TaskSubmitRequest(FAIR, n, task_id=f"{key}-{n:03}", concurrency_key=key, queue=queue)
        for n in range(count)
    ]
    return [task.task_id for task in executor.submit_many(requests)]


def claimed(storage: RedisStorage, queue: str, limit: int = 100) -> list[str]:
    return [c.task_id for c in storage.claim("w1", [queue], limit, LEASE)]


def test_the_layout_this_file_relies_on():
    assert [shard_of(q, SHARDS) for q in ("default", ORPHAN)] == [HOME, 0]


def test_a_fair_name_s_tasks_take_turns_on_its_home_shard(executor, storage):
    a = submit(executor, "A", 4, ORPHAN)
    b = submit(executor, "B", 2, ORPHAN)
    c = submit(executor, "C", 1, "default")
    for task_id in a + b + c:
        assert [s for s in range(SHARDS) if storage.client.exists(storage._tkey(task_id, s))] == [
            HOME
        ]
    home = storage.prefixes[HOME]
    members = storage.client.zrange(f"{home}fready:{len(FAIR)}:{FAIR}:{ORPHAN}:0", 0, -1)
    assert [fair_member(member)[1] for member in members] == [
        "A-000",
        "B-000",
        "A-001",
        "B-001",
        "A-002",
        "A-003",
    ]
    # C's queue had nothing due: its first round comes after every round handed out.
    assert storage.client.zrange(home + f"fround:{FAIR}", 0, -1, withscores=True) == [
        ("B", 2.0),
        ("A", 4.0),
        ("C", 5.0),
    ]
    # Read, listed and counted under their queue, on the home shard.
    assert executor.count_by_status(ORPHAN)[TaskStatus.CREATED] == 6
    assert {t.task_id for t in executor.list_tasks(queue=ORPHAN)} == set(a + b)
    assert executor.oldest_due_at(ORPHAN) is not None
    assert executor.cancel_task("A-001")
    # A worker of "orphan" claims them on the home shard, in round order.
    assert claimed(storage, ORPHAN, 3) == ["A-000", "B-000", "B-001"]
    assert claimed(storage, "default") == ["C-000"]
    assert claimed(storage, ORPHAN) == ["A-002", "A-003"]
    assert storage.client.keys(home + "fready:*") == []


def test_the_fair_limit_bounds_a_claim_over_several_shards(executor, storage):
    submit(executor, "A", 3, ORPHAN)
    plain = executor.submit("demo.echo", None, queue=ORPHAN)  # on shard 0, the queue's own
    claims = storage.claim("w1", [ORPHAN, "default"], 10, LEASE, fair_limit=1)
    assert sorted(c.task_id for c in claims) == sorted(["A-000", plain.task_id])
    assert claimed(storage, ORPHAN) == ["A-001", "A-002"]
