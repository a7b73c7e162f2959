"""runexecutor as a subprocess with ``async def`` handlers on its event loop: outcomes on every
storage, more running at once than threads, cancel, timeout, lease renewal, SIGTERM drain."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import (
    LEASE,
    Backend,
    executions,
    read_journal,
    service_for,
    wait_until,
)

ONE_THREAD = ("--core-pool-size", "1", "--max-pool-size", "1", "--queue-capacity", "0")
TERMINAL = {
    TaskStatus.COMPLETED,
    TaskStatus.FAILED,
    TaskStatus.TIMEOUT,
    TaskStatus.ERROR,
    TaskStatus.CANCELLED,
}


class Journal:
    """What demo.async_sleep itself wrote (RE_JOURNAL): one record per start, end, cancel."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def env(self) -> dict[str, str]:
        return {"RE_JOURNAL": str(self.path)}

    def records(self, event: str | None = None) -> list[dict]:
        records = read_journal(self.path)
        return [r for r in records if event is None or r["event"] == event]

    def tasks(self, event: str) -> set[str]:
        return {r["task"] for r in self.records(event)}

    def most_at_once(self) -> int:
        """The most handlers that were between their start and their end at one moment."""
        moments = [(r["t"], 1) for r in self.records("start")]
        moments += [(r["t"], -1) for r in self.records("end")]
        running = most = 0
        for _, step in sorted(moments):  # an end before a start at the same instant
            running += step
            most = max(most, running)
        return most


@pytest.fixture
def journal(tmp_path) -> Journal:
    return Journal(tmp_path / "journal.jsonl")


def submit_sleeps(service, prefix: str, n: int, seconds: float) -> list[str]:
    """``n`` demo.async_sleep tasks awaiting ``seconds`` each, ids ``{prefix}-00``, ..."""
    ids = [f"{prefix}-{i:02d}" for i in range(n)]
    service.submit_many(
        [TaskSubmitRequest("demo.async_sleep", {"seconds": seconds}, task_id=i) for i in ids]
    )
    return ids


def wait_terminal(service, task_ids, timeout, logs):
    def done() -> bool:
        return all(service.get_task(i).status in TERMINAL for i in task_ids)

    wait_until(done, timeout, f"tasks {task_ids} did not all finish", logs=logs)
    return {i: service.get_task(i) for i in task_ids}


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_async_handlers_complete_fail_and_retry(alias, key_prefix, workers, journal):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.async_sleep", {"seconds": 0.1, "result": {"ok": [1, 2]}}, task_id="ok")
    service.submit("demo.async_sleep", {"fail": True}, task_id="fails")
    service.submit("demo.async_sleep", {"fail_times": 1}, task_id="retried")
    workers.start(backend, *ONE_THREAD, env=journal.env())

    tasks = wait_terminal(service, ["ok", "fails", "retried"], 30, workers.logs)
    assert (tasks["ok"].status, tasks["ok"].result, tasks["ok"].attempts) == (
        TaskStatus.COMPLETED,
        {"ok": [1, 2]},
        1,
    )
    assert tasks["fails"].status is TaskStatus.FAILED
    assert tasks["fails"].attempts == 1  # RuntimeError is not in retry_on
    assert "RuntimeError: this async task always fails" in tasks["fails"].last_error
    assert (tasks["retried"].status, tasks["retried"].result) == (TaskStatus.COMPLETED, 2)
    assert tasks["retried"].attempts == 2
    assert sorted(r["attempt"] for r in journal.records("start") if r["task"] == "retried") == [
        1,
        2,
    ]
    # On the worker's event loop, not in a pool thread.
    assert {r["thread"] for r in journal.records("start")} == {"reliable-executor-event-loop"}
    assert workers.started[0].alive()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_more_async_handlers_run_at_once_than_threads(alias, key_prefix, workers, journal):
    """One pool thread, eight async slots: the handlers' own records show several awaiting
    at once, and never more than the async concurrency."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    ids = submit_sleeps(service, "sleep", 16, 1.0)
    workers.start(backend, *ONE_THREAD, "--async-concurrency", "8", env=journal.env())

    tasks = wait_terminal(service, ids, 60, workers.logs)
    assert {t.status for t in tasks.values()} == {TaskStatus.COMPLETED}
    assert journal.tasks("end") == set(ids)
    most = journal.most_at_once()
    assert 1 < most <= 8, most
    assert most >= 6, f"only {most} async handlers overlapped"


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_cancel_and_timeout_cancel_a_running_async_handler(alias, key_prefix, workers, journal):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.async_sleep", {"seconds": 60}, task_id="cancelled")
    service.submit(
        "demo.async_sleep", {"seconds": 60}, task_id="timed-out", max_duration_millis=3000
    )
    workers.start(backend, *ONE_THREAD, lease_timeout=LEASE, env=journal.env())
    wait_until(
        lambda: journal.tasks("start") == {"cancelled", "timed-out"},
        20,
        "the async handlers never started",
        logs=workers.logs,
    )

    assert service.cancel_task("cancelled")
    tasks = wait_terminal(service, ["cancelled", "timed-out"], 20, workers.logs)
    assert tasks["cancelled"].status is TaskStatus.CANCELLED, tasks["cancelled"].last_error
    assert tasks["timed-out"].status is TaskStatus.TIMEOUT, tasks["timed-out"].last_error
    # The coroutines themselves were cancelled (CancelledError at their await), not left running.
    wait_until(
        lambda: journal.tasks("cancelled") == {"cancelled", "timed-out"},
        5,
        "the handlers' coroutines were not cancelled",
        logs=workers.logs,
    )
    assert not journal.records("end")
    assert workers.started[0].alive()


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_an_async_handler_keeps_its_lease_past_lease_timeout(alias, key_prefix, workers, journal):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.async_sleep", {"seconds": 3 * LEASE}, task_id="long")
    workers.start(backend, *ONE_THREAD, lease_timeout=LEASE, env=journal.env())

    task = wait_terminal(service, ["long"], 30, workers.logs)["long"]
    assert (task.status, task.attempts, task.last_error) == (TaskStatus.COMPLETED, 1, None)
    assert [r["attempt"] for r in journal.records("start")] == [1]
    assert "worker lost" not in workers.logs()


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_sigterm_lets_running_async_handlers_finish_and_hands_back_the_rest(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    ids = submit_sleeps(service, "drain", 20, 2.5)
    worker = workers.start(backend, *ONE_THREAD, "--async-concurrency", "4", env=journal.env())
    wait_until(
        lambda: len(journal.tasks("start")) >= 4, 20, "handlers never started", logs=workers.logs
    )

    def held_unstarted() -> list[str]:
        started = journal.tasks("start")
        tasks = (service.get_task(i) for i in ids if i not in started)
        return [t.task_id for t in tasks if t.worker_id == worker.worker_id]

    worker.terminate()
    wait_until(
        lambda: not held_unstarted(), 5, "unstarted claims were not handed back", logs=workers.logs
    )
    assert worker.alive(), "the worker exited before its running handlers finished"
    assert worker.wait(30) == 0, worker.log()

    started = journal.tasks("start")
    assert len(started) == 4, started  # the async concurrency
    assert journal.tasks("end") == started
    for task_id in ids:
        task = service.get_task(task_id)
        if task_id in started:
            assert (task.status, task.attempts) == (TaskStatus.COMPLETED, 1), task
        else:
            assert (task.status, task.attempts, task.worker_id) == (TaskStatus.CREATED, 0, None)


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_a_worker_holds_no_more_than_its_threads_share_plus_the_async_slots(
    alias, key_prefix, workers, journal
):
    """Sync and async tasks mixed in one queue: claims taken for async slots may turn out to be
    for threads (and the other way round), yet the worker never holds more than max pool size
    + queue capacity + async concurrency, and both kinds run side by side."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # Claimed in this order: one async task, then sync ones while async slots are free.
    async_ids = submit_sleeps(service, "first", 1, 2.0)
    sync_ids = [f"sync-{i}" for i in range(6)]
    service.submit_many(
        [TaskSubmitRequest("demo.record", {"sleep": 0.5}, task_id=i) for i in sync_ids]
    )
    async_ids += submit_sleeps(service, "async", 2, 2.0)
    worker = workers.start(backend, *ONE_THREAD, "--async-concurrency", "3", env=journal.env())

    def held() -> int:
        tasks = service.list_tasks()
        return sum(1 for t in tasks if t.worker_id == worker.worker_id and t.status not in TERMINAL)

    most = 0
    every = async_ids + sync_ids
    deadline = time.monotonic() + 60
    while not all(service.get_task(i).status is TaskStatus.COMPLETED for i in every):
        most = max(most, held())
        # Threads' share 1 + 0, async slots 3; and one more at most while a completed task
        # stays RUNNING until the writer records it, a few ms after its slot was freed.
        assert most <= 1 + 0 + 3 + 1, f"the worker held {most} tasks"
        assert time.monotonic() < deadline, workers.logs()
        time.sleep(0.05)
    assert journal.tasks("end") == set(async_ids)
    assert executions(backend).filter(task_id__in=sync_ids, finished=True).count() == 6
    # Side by side: some sync task ran in the thread while an async one awaited.
    async_runs = [
        (start["t"], end["t"])
        for start in journal.records("start")
        for end in journal.records("end")
        if start["task"] == end["task"]
    ]
    sync_runs = [
        (t.started_at.timestamp(), t.finished_at.timestamp())
        for t in (service.get_task(i) for i in sync_ids)
    ]
    assert any(s0 < a1 and s1 > a0 for s0, s1 in sync_runs for a0, a1 in async_runs)
