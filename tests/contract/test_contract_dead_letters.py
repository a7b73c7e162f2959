"""Contract: listing by a set of statuses (``statuses=``), e.g. the dead letters (FAILED, TIMEOUT
and ERROR together), newest first with offset and limit and the other filters, on every storage."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.core.states import FAILURE_STATUSES
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import db_params
from tests.support.contract_support import claim_and_start

DEAD = FAILURE_STATUSES  # FAILED, TIMEOUT, ERROR


def end_as(
    executor: ReliableExecutor,
    clock: FakeClock,
    task_id: str,
    status: TaskStatus,
    *,
    queue: str = "default",
    task_name: str = "demo.echo",
) -> None:
    """Submit one task and bring it to ``status`` through the storage's real transitions (one
    task at a time, so each claim takes exactly it). Each task is created 1 s after the last."""
    storage = executor.storage
    deadline = 500 if status is TaskStatus.TIMEOUT else None
    executor.submit(
        task_name, None, task_id=task_id, queue=queue, retry_limit=0, max_duration_millis=deadline
    )
    if status is TaskStatus.TIMEOUT:
        clock.advance(1)
        assert [t.status for t in storage.expire_overdue(10)] == [TaskStatus.TIMEOUT]
    elif status in (TaskStatus.FAILED, TaskStatus.ERROR, TaskStatus.COMPLETED):
        claim = claim_and_start(storage, queue=queue)
        if status is TaskStatus.COMPLETED:
            assert storage.complete(claim, None) is not None
        else:
            done = storage.fail(claim, "boom", retryable=False, is_error=status is TaskStatus.ERROR)
            assert done is not None and done.status is status
        clock.advance(1)
    elif status is TaskStatus.CANCELLED:
        assert executor.cancel_task(task_id)
        clock.advance(1)
    else:
        assert status is TaskStatus.CREATED
        clock.advance(1)
    assert executor.get_task(task_id).status is status


# Oldest first: (task_id, status, queue, task_name).
TASKS = [
    ("d-01", TaskStatus.FAILED, "default", "demo.echo"),
    ("d-02", TaskStatus.COMPLETED, "default", "demo.echo"),
    ("d-03", TaskStatus.TIMEOUT, "mail", "demo.noop"),
    ("d-04", TaskStatus.ERROR, "default", "demo.noop"),
    ("d-05", TaskStatus.CANCELLED, "default", "demo.echo"),
    ("d-06", TaskStatus.FAILED, "mail", "demo.echo"),
    ("d-07", TaskStatus.TIMEOUT, "default", "demo.echo"),
    ("d-08", TaskStatus.ERROR, "mail", "demo.echo"),
    ("d-09", TaskStatus.FAILED, "default", "demo.noop"),
    ("d-10", TaskStatus.CREATED, "default", "demo.echo"),
]


@pytest.fixture
def populated(executor, clock):
    for task_id, status, queue, name in TASKS:
        end_as(executor, clock, task_id, status, queue=queue, task_name=name)
    return executor


def newest_first(keep) -> list[str]:
    return [task_id for task_id, *rest in reversed(TASKS) if keep(*rest)]


def ids(executor: ReliableExecutor, **filters) -> list[str]:
    return [t.task_id for t in executor.list_tasks(**filters)]


def test_dead_letters_are_listed_together_newest_first(populated):
    dead = newest_first(lambda s, q, n: s in DEAD)
    assert dead == ["d-09", "d-08", "d-07", "d-06", "d-04", "d-03", "d-01"]
    assert ids(populated, statuses=DEAD) == dead
    assert ids(populated, statuses=["FAILED", "TIMEOUT", "ERROR"]) == dead  # values work too
    tasks = populated.list_tasks(statuses=DEAD)
    assert {t.status for t in tasks} == set(DEAD)


def test_dead_letters_page_with_offset_and_limit(populated):
    dead = newest_first(lambda s, q, n: s in DEAD)
    pages = [ids(populated, statuses=DEAD, limit=3, offset=o) for o in range(0, 9, 3)]
    assert pages == [dead[0:3], dead[3:6], dead[6:]]
    assert ids(populated, statuses=DEAD, limit=2, offset=5) == dead[5:7]
    assert ids(populated, statuses=DEAD, offset=7) == []
    assert ids(populated, statuses=DEAD, limit=0) == []


def test_statuses_combine_with_queue_and_task_name(populated):
    assert ids(populated, statuses=DEAD, queue="mail") == ["d-08", "d-06", "d-03"]
    assert ids(populated, statuses=DEAD, task_name="demo.noop") == ["d-09", "d-04", "d-03"]
    assert ids(populated, statuses=DEAD, queue="default", task_name="demo.echo") == [
        "d-07",
        "d-01",
    ]
    assert ids(populated, statuses=DEAD, queue="mail", limit=1, offset=1) == ["d-06"]
    assert ids(populated, statuses=DEAD, task_name="demo.noop", limit=2, offset=1) == [
        "d-04",
        "d-03",
    ]
    assert ids(populated, statuses=DEAD, queue="nowhere") == []


def test_any_set_of_statuses_finished_or_not(populated):
    assert ids(populated, statuses={TaskStatus.FAILED}) == ["d-09", "d-06", "d-01"]
    assert ids(populated, statuses={TaskStatus.FAILED}) == ids(populated, status="FAILED")
    assert ids(populated, statuses={TaskStatus.CREATED, TaskStatus.ERROR}) == [
        "d-10",
        "d-08",
        "d-04",
    ]
    assert ids(populated, statuses={TaskStatus.COMPLETED, TaskStatus.CANCELLED}) == [
        "d-05",
        "d-02",
    ]
    assert ids(populated, statuses={TaskStatus.RUNNING, TaskStatus.PENDING}) == []
    assert ids(populated, statuses=list(TaskStatus)) == ids(populated)
    assert ids(populated, statuses=()) == []  # no status: no task


def test_status_and_statuses_together_or_bad_values_are_refused(populated):
    with pytest.raises(ValueError, match="status or statuses, not both"):
        populated.list_tasks(status="FAILED", statuses=DEAD)
    with pytest.raises(ValueError, match="unknown status 'SLEEPING'"):
        populated.list_tasks(statuses=["FAILED", "SLEEPING"])
    with pytest.raises(ValueError, match="not a string"):
        populated.list_tasks(statuses="FAILED")
    with pytest.raises(ValueError, match="not both"):
        populated.storage.list(status=TaskStatus.FAILED, statuses=DEAD)


def test_a_retried_dead_letter_leaves_the_list(populated):
    assert populated.retry_task("d-08")
    assert "d-08" not in ids(populated, statuses=DEAD)
    assert ids(populated, statuses={TaskStatus.PENDING}) == ["d-08"]


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_redis_reads_each_done_index_only_down_to_the_page(alias, executor, clock, monkeypatch):
    """A page of dead letters merges range reads of done:FAILED, done:TIMEOUT and done:ERROR,
    each at most offset + limit long: never a whole index, nor a union stored server side."""
    statuses = [TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.ERROR]
    made = []
    for i in range(24):
        made.append(f"r-{i:02d}")
        end_as(executor, clock, made[-1], statuses[i % 3])
    client = executor.storage.client
    reads: list[tuple[str, int, int]] = []
    real_zrevrange = client.zrevrange

    def zrevrange(key, start, end, *args, **kwargs):
        reads.append((key.rsplit(":", 1)[-1], start, end))
        return real_zrevrange(key, start, end, *args, **kwargs)

    monkeypatch.setattr(client, "zrevrange", zrevrange)
    for name in ("zunionstore", "zunion", "zinterstore"):
        monkeypatch.setattr(client, name, lambda *a, **k: pytest.fail("a stored union"))
    newest = list(reversed(made))
    assert ids(executor, statuses=DEAD, limit=4, offset=2) == newest[2:6]
    # Sharded (TEST_REDIS_SHARDS), each shard has its own done indexes and the whole page may be
    # on any one of them: each shard's are read down to the page, once each.
    shards = len(executor.storage.prefixes)
    assert sorted(reads) == sorted([("ERROR", 0, 5), ("FAILED", 0, 5), ("TIMEOUT", 0, 5)] * shards)
