"""Contract: what operators read and do on every backend — counts by queue, the oldest due
task, the master and workers, purging by age and status, listing large finished sets."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.support.contract_support import claim_and_start


def test_count_by_queue_has_every_status_of_every_queue_with_tasks(executor, storage):
    executor.submit("demo.echo", None, task_id="a1", queue="alpha")
    executor.submit("demo.echo", None, task_id="a2", queue="alpha")
    executor.submit("demo.echo", None, task_id="b1", queue="beta")
    storage.complete(claim_and_start(storage, queue="beta"), None)
    executor.cancel_task("a2")
    counts = executor.count_by_queue()
    assert list(counts) == ["alpha", "beta"]
    assert counts["alpha"] == {
        **{status: 0 for status in TaskStatus},
        TaskStatus.CREATED: 1,
        TaskStatus.CANCELLED: 1,
    }
    assert counts["beta"] == {**{status: 0 for status in TaskStatus}, TaskStatus.COMPLETED: 1}
    assert executor.count_by_queue() == {
        queue: executor.count_by_status(queue) for queue in ("alpha", "beta")
    }


def test_oldest_due_is_the_longest_waiting_unclaimed_task(executor, storage, clock):
    assert executor.oldest_due_at() is None
    first = clock.now()
    executor.submit("demo.echo", None, task_id="old", queue="q1")
    clock.advance(5)
    executor.submit("demo.echo", None, task_id="new", queue="q2")
    executor.submit("demo.echo", None, task_id="later", queue="q2", delay_millis=60_000)
    assert executor.oldest_due_at() == first
    assert executor.oldest_due_at("q2") == first + dt.timedelta(seconds=5)
    storage.claim("w1", ["q1"], 10, 60)  # claimed: no longer waiting for a worker
    assert executor.oldest_due_at() == first + dt.timedelta(seconds=5)
    clock.advance(61)  # the delayed one (submitted with "new", 60 s later) is due now
    assert executor.oldest_due_at("q2") == first + dt.timedelta(seconds=5)
    storage.claim("w1", ["q2"], 1, 60)
    assert executor.oldest_due_at("q2") == first + dt.timedelta(seconds=65)


def test_master_and_workers_through_the_service(executor, storage, clock):
    assert executor.master() is None and executor.workers() == []
    storage.acquire_lock("master", "w-main", 10)
    storage.worker_seen("w-main", {"hostname": "h1", "pid": 7, "queues": ["default", "mail"]})
    assert executor.master() == "w-main"
    [worker] = executor.workers()
    assert (worker.worker_id, worker.hostname, worker.pid, worker.queues) == (
        "w-main",
        "h1",
        7,
        ("default", "mail"),
    )
    clock.advance(11)
    assert executor.master() is None


def _finish(executor, storage, task_id: str, status: TaskStatus) -> None:
    executor.submit("demo.always_fails", None, task_id=task_id, retry_limit=0)
    claim = claim_and_start(storage)
    if status is TaskStatus.COMPLETED:
        storage.complete(claim, "ok")
    else:
        storage.fail(claim, "boom", retryable=False)


def test_purge_by_age_and_status_never_touches_live_tasks(executor, storage, clock):
    _finish(executor, storage, "done-old", TaskStatus.COMPLETED)
    _finish(executor, storage, "failed-old", TaskStatus.FAILED)
    executor.submit("demo.echo", None, task_id="waiting", queue="other")
    cutoff = clock.now() + dt.timedelta(microseconds=1)
    clock.advance(60)
    _finish(executor, storage, "failed-new", TaskStatus.FAILED)
    progress: list[int] = []
    assert executor.purge_finished(cutoff, statuses=["FAILED"], progress=progress.append) == 1
    assert progress == [1]
    assert executor.get_task("failed-old") is None
    assert executor.get_task("done-old") is not None
    assert executor.purge_finished(clock.now() + dt.timedelta(seconds=1), batch=1) == 2
    assert {t.task_id for t in executor.list_tasks()} == {"waiting"}
    assert executor.count_by_status()[TaskStatus.FAILED] == 0
    with pytest.raises(ValueError, match="CREATED"):
        executor.purge_finished(clock.now(), statuses=[TaskStatus.CREATED])


def test_a_paced_purge_pauses_between_its_rounds(executor, storage, clock):
    """``pause_seconds`` waits between two rounds (on the service's clock), never after the
    last: three full rounds of one task, then the round that finds none."""
    for task_id in ("a", "b", "c"):
        _finish(executor, storage, task_id, TaskStatus.COMPLETED)
    cutoff = clock.now() + dt.timedelta(seconds=1)
    began = clock.now()
    progress: list[tuple[int, float]] = []

    def seen(deleted: int) -> None:
        progress.append((deleted, (clock.now() - began).total_seconds()))

    assert executor.purge_finished(cutoff, batch=1, progress=seen, pause_seconds=5) == 3
    assert progress == [(1, 0.0), (2, 5.0), (3, 10.0), (3, 15.0)]
    assert (clock.now() - began).total_seconds() == 15.0


@pytest.mark.parametrize("pause", [-1, 3601, float("nan"), "1", True, None])
def test_a_bad_purge_pause_is_refused_before_anything_is_deleted(executor, storage, clock, pause):
    _finish(executor, storage, "done", TaskStatus.COMPLETED)
    with pytest.raises(ValueError, match="pause_seconds must be a number of seconds"):
        executor.purge_finished(clock.now() + dt.timedelta(seconds=1), pause_seconds=pause)
    assert executor.get_task("done") is not None


def test_listing_pages_through_many_finished_tasks_newest_first(executor, storage, clock):
    ids = []
    for i in range(30):
        ids.append(f"t-{i:02d}")
        executor.submit_many([TaskSubmitRequest("demo.echo", None, task_id=ids[-1])])
        clock.advance(0.001)
    for _ in range(25):  # the 25 oldest, one at a time
        [claim] = storage.claim("w1", ["default"], 1, 60)
        storage.complete(storage.start(claim, 60), None)
    newest_first = list(reversed(ids))
    pages = [executor.list_tasks(limit=7, offset=o) for o in range(0, 30, 7)]
    assert [t.task_id for page in pages for t in page] == newest_first
    completed = executor.list_tasks(status=TaskStatus.COMPLETED, limit=10, offset=5)
    assert [t.task_id for t in completed] == list(reversed(ids[:25]))[5:15]
    named = executor.list_tasks(task_name="demo.echo", status="COMPLETED", limit=3, offset=22)
    assert [t.task_id for t in named] == ["t-02", "t-01", "t-00"]


def test_every_transition_is_logged_with_id_name_statuses_attempt_and_worker(
    executor, storage, caplog
):
    from tests.support.contract_support import HOOKS, raising, run_next

    HOOKS["life"] = raising(ConnectionError("gateway down"))
    with caplog.at_level(logging.DEBUG, logger="django_reliable_executor"):
        executor.submit("contract.hook", None, task_id="life", retry_limit=1, retry_interval=0)
        run_next(executor, "w-log")  # fails, retried at once
        run_next(executor, "w-log")  # fails for good
        executor.retry_task("life")
        executor.cancel_task("life")
    lines = [
        (r.levelname, r.getMessage().split(": ")[0])
        for r in caplog.records
        if r.getMessage().startswith("task life ")
    ]
    assert lines == [
        ("INFO", "task life (contract.hook) new -> CREATED attempt=0 worker=-"),
        ("INFO", "task life (contract.hook) claimed -> RUNNING attempt=1 worker=w-log"),
        ("WARNING", "task life (contract.hook) RUNNING -> PENDING attempt=1 worker=w-log"),
        ("INFO", "task life (contract.hook) claimed -> RUNNING attempt=2 worker=w-log"),
        ("ERROR", "task life (contract.hook) RUNNING -> FAILED attempt=2 worker=w-log"),
        ("INFO", "task life (contract.hook) FAILED -> PENDING attempt=2 worker=w-log"),
        ("INFO", "task life (contract.hook) PENDING -> CANCELLED attempt=2 worker=w-log"),
    ]
