"""The Redis storage's batch indexes: a batch's members are listed from its own member index (a
page reads its members and callbacks only, whatever else is stored), which follows them
through their endings, retries and purge, and goes with the batch."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.storage.redis import RedisStorage
from tests.support.redis_support import claim_one, index_problems, snapshot, submit

MEMBERS = [f"m{i}" for i in range(6)]


@pytest.fixture
def reads(storage: RedisStorage, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids whose hashes the listing reads to filter them; reading the indexes of every
    unfinished task fails the test."""
    read: list[str] = []
    real = storage._matching

    def matching(ids: Any, accept: Any, query: Any, shard: int) -> Any:
        read.extend(ids)
        return real(ids, accept, query, shard)

    def everything(*args: Any) -> Any:
        raise AssertionError("the listing read the indexes of every task")

    monkeypatch.setattr(storage, "_matching", matching)
    monkeypatch.setattr(storage, "_unfinished_ids", everything)
    return read


def listed(storage: RedisStorage, **filters: Any) -> list[str]:
    return [t.task_id for t in storage.list(batch_id="b", **filters)]


def test_a_batch_page_reads_its_members_only(storage, executor, clock, reads):
    for i in range(200):  # other tasks, live and finished
        submit(executor, f"other{i}")
        if i % 2:
            executor.cancel_task(f"other{i}")
    others = [TaskSubmitRequest("demo.echo", task_id=f"x{i}") for i in range(50)]
    executor.submit_batch(others, batch_id="another")
    clock.advance(1)
    # One call's members are a microsecond apart, the last newest.
    names = [f"n{i}" for i in range(1, 6)]
    executor.submit_batch(
        [TaskSubmitRequest("demo.echo", task_id=task_id) for task_id in names],
        batch_id="b",
        on_complete=TaskSubmitRequest("demo.echo", task_id="cb"),
    )
    reads.clear()
    assert listed(storage, limit=3) == ["n5", "n4", "n3"]
    assert listed(storage, limit=3, offset=3) == ["n2", "n1"]
    for task_id in ("n1", "n3"):
        executor.cancel_task(task_id)
    assert claim_one(storage, "w1").task_id == "other0"  # the oldest due task: none of b's
    assert listed(storage, status=TaskStatus.CANCELLED) == ["n3", "n1"]
    assert listed(storage, status=TaskStatus.CREATED) == ["n5", "n4", "n2"]
    assert listed(storage, statuses=[TaskStatus.FAILED, TaskStatus.CANCELLED]) == ["n3", "n1"]
    assert listed(storage, status=TaskStatus.RUNNING) == []
    assert set(reads) <= {*names, "cb"}, "a page read tasks of no concern to it"
    assert index_problems(storage) == []


def test_the_member_index_follows_retries_and_purge_and_goes_with_the_batch(
    storage, executor, clock, reads
):
    executor.submit_batch(
        [TaskSubmitRequest("demo.echo", task_id=task_id) for task_id in MEMBERS], batch_id="b"
    )
    for task_id in MEMBERS[:3]:
        executor.cancel_task(task_id)
    assert sorted(listed(storage, status=TaskStatus.CANCELLED)) == MEMBERS[:3]
    assert executor.retry_task("m0")
    assert sorted(listed(storage, status=TaskStatus.CANCELLED)) == ["m1", "m2"]
    assert "m0" in listed(storage, status=TaskStatus.PENDING)
    clock.advance(10)
    assert storage.purge_finished(clock.now(), 100) == 2  # m1, m2: out of the index
    assert sorted(listed(storage)) == ["m0", "m3", "m4", "m5"]
    assert storage.client.exists(storage.p + "bm:b:CANCELLED") == 0
    for task_id in ("m0", "m3", "m4", "m5"):
        executor.cancel_task(task_id)
    assert executor.get_batch("b").finished
    clock.advance(10)
    assert storage.purge_batches(clock.now() - dt.timedelta(seconds=5), 100) == 1
    assert [key for key in snapshot(storage) if key.startswith(("b:", "bm:"))] == []
    # Its members left over are found without the index (reading every task's indexes).
    reads.clear()
    with pytest.raises(AssertionError, match="every task"):
        listed(storage)
    assert index_problems(storage) == []
