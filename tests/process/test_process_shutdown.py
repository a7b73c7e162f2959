"""runexecutor as a subprocess: SIGTERM drains handlers, a second SIGTERM stops at once, --burst."""

from __future__ import annotations

import datetime as dt
import signal
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until

SMALL_POOL = ("--core-pool-size", "1", "--max-pool-size", "1", "--queue-capacity", "10")


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_sigterm_lets_the_running_handler_finish_and_hands_back_unstarted_claims(
    alias, key_prefix, workers
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # Highest priority, so the single pool thread starts it first; the rest wait in the pool.
    service.submit("demo.record", {"sleep": 3.5}, task_id="running", priority=10)
    queued_ids = [f"queued-{i:02d}" for i in range(30)]
    service.submit_many([TaskSubmitRequest("demo.record", task_id=i) for i in queued_ids])
    worker = workers.start(backend, *SMALL_POOL)

    wait_until(
        lambda: executions(backend, "running").exists(),
        20,
        "the slow handler never started",
        logs=workers.logs,
    )

    def held_unstarted() -> list[str]:
        tasks = (service.get_task(i) for i in queued_ids)
        return [t.task_id for t in tasks if t.worker_id == worker.worker_id]

    # max pool size 1 + queue capacity 10 = 11 claims: the running task and 10 waiting ones.
    held = held_unstarted()
    assert len(held) == 10, held
    assert all(service.get_task(i).status is TaskStatus.CREATED for i in held)

    worker.terminate()
    # Unstarted claims go back at once, while the running handler is still sleeping.
    wait_until(
        lambda: not held_unstarted(), 5, "unstarted claims were not handed back", logs=workers.logs
    )
    assert worker.alive(), "the worker exited before its running handler finished"
    assert worker.wait(30) == 0, worker.log()

    running = service.get_task("running")
    assert running.status is TaskStatus.COMPLETED, running.last_error
    assert running.attempts == 1
    assert [(r.attempt, r.finished) for r in executions(backend, "running")] == [(1, True)]
    for task_id in queued_ids:
        task = service.get_task(task_id)
        assert (task.status, task.attempts, task.worker_id) == (TaskStatus.CREATED, 0, None), task
    assert not executions(backend).filter(task_id__in=queued_ids).exists()
    assert service.storage.lock_owner("master") is None, "the master lock was not released"


@pytest.mark.parametrize("alias", db_params(["default"]))  # signal handling, not storage
def test_second_sigterm_stops_without_waiting_for_the_handler(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.record", {"sleep": 60}, task_id="long")
    worker = workers.start(backend)
    wait_until(
        lambda: executions(backend, "long").exists(), 20, "handler never started", logs=workers.logs
    )

    worker.terminate()
    time.sleep(1.0)
    assert worker.alive(), "the first SIGTERM must wait for the running handler"
    worker.terminate()
    stopped_at = time.monotonic()
    assert worker.wait(10) == 1, worker.log()
    assert time.monotonic() - stopped_at < 5

    # The abandoned attempt is left to lease recovery: still RUNNING, never recorded as done.
    task = service.get_task("long")
    assert (task.status, task.attempts) == (TaskStatus.RUNNING, 1)
    assert [r.finished for r in executions(backend, "long")] == [False]
    assert "still running (long); their tasks are recovered after their lease" in worker.log()


@pytest.mark.parametrize("alias", db_params(["default"]))  # signal handling, not storage
def test_sigint_waits_only_up_to_the_shutdown_timeout(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.record", {"sleep": 60}, task_id="long")
    worker = workers.start(backend, "--shutdown-timeout", "1.5")
    wait_until(
        lambda: executions(backend, "long").exists(), 20, "handler never started", logs=workers.logs
    )
    worker.popen.send_signal(signal.SIGINT)  # Ctrl-C: the same graceful stop as SIGTERM
    stopped_at = time.monotonic()
    assert worker.wait(10) == 0, worker.log()
    assert 1.4 <= time.monotonic() - stopped_at < 6
    assert service.get_task("long").status is TaskStatus.RUNNING  # left to lease recovery
    assert service.storage.lock_owner("master") is None


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_burst_runs_what_is_due_within_a_minute_then_exits(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    now_ids = [f"now-{i:02d}" for i in range(20)]
    service.submit_many([TaskSubmitRequest("demo.record", task_id=i) for i in now_ids])
    soon = service.submit("demo.record", task_id="soon", delay_millis=2500)
    service.submit("demo.record", task_id="later", delay_millis=120_000)

    started_at = time.monotonic()
    worker = workers.start(backend, "--burst", wait_ready=False)
    assert worker.wait(40) == 0, worker.log()
    # It waited for "soon" (due within 60 s) instead of leaving it behind.
    assert time.monotonic() - started_at >= 2.0

    for task_id in [*now_ids, "soon"]:
        task = service.get_task(task_id)
        assert (task.status, task.attempts) == (TaskStatus.COMPLETED, 1), task
        assert executions(backend, task_id).count() == 1
    ran = executions(backend, "soon").get()
    assert ran.started_at >= soon.run_at - dt.timedelta(milliseconds=50)
    later = service.get_task("later")
    assert (later.status, later.attempts, later.worker_id) == (TaskStatus.CREATED, 0, None)
    assert not executions(backend, "later").exists()
