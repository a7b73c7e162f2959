"""fairness="round_robin" over 3 Redis shards: a fair name's tasks, whatever queue they are
submitted to, are stored on its home shard (the shard of its own queue) as a capped name's
are, so its rounds and fair sets are on one shard; workers of each queue claim them there in
round order, and cancelling, listing and reading find them."""

from __future__ import annotations

import dataclasses
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
    # Each queue's (and priority's) rounds are its own, on the home shard: C's queue had
    # none handed out, so its first round is 0.
    rounds = f"fround:{len(FAIR)}:{FAIR}"
    assert storage.client.zrange(home + f"{rounds}:{ORPHAN}:0", 0, -1, withscores=True) == [
        ("B", 2.0),
        ("A", 4.0),
    ]
    assert storage.client.zrange(home + f"{rounds}:default:0", 0, -1, withscores=True) == [
        ("C", 1.0)
    ]
    assert storage.client.keys(storage.prefixes[0] + "fround:*") == []
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


def test_a_name_that_lost_fairness_is_not_bounded_by_the_fair_limit(executor, storage):
    """Defect 9, over several shards: demo.fair's tasks keep their rounds on its home shard
    once it lost fairness, and a claim's fair limit no longer bounds them."""
    submit(executor, "A", 2, ORPHAN)
    submit(executor, "B", 1, "default")
    plain = executor.submit("demo.echo", None, queue=ORPHAN)
    storage.flow_limits = dataclasses.replace(storage.flow_limits, fair=frozenset)
    claims = storage.claim("w1", [ORPHAN, "default"], 10, LEASE, fair_limit=0)
    assert sorted(c.task_id for c in claims) == sorted(["A-000", "A-001", "B-000", plain.task_id])


def test_rounds_at_another_queue_do_not_push_a_key_s_next_task_back(executor, storage):
    """Defect 1, over several shards: A's backlog on "orphan" (home shard) leaves its first
    task on "default" in round 0, served beside B's."""
    submit(executor, "A", 5, ORPHAN)
    executor.submit(FAIR, None, task_id="B-0", concurrency_key="B")
    executor.submit(FAIR, None, task_id="A-d", concurrency_key="A")
    assert storage.client.hget(storage._tkey("A-d", HOME), "fr") == "0"
    assert claimed(storage, "default") == ["A-d", "B-0"]  # (one round: by run at, then id)
