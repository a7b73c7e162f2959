"""runexecutor under kill -9: lease recovery, a task that kills every worker, master failover."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import (
    FAST,
    LEASE,
    MASTER_TTL,
    Backend,
    executions,
    service_for,
    wait_until,
)

SMALL_POOL = ("--core-pool-size", "1", "--max-pool-size", "1", "--queue-capacity", "10")


def _status(service, task_id: str, status: TaskStatus):
    """A predicate for wait_until: the task once it reached ``status``."""

    def check():
        task = service.get_task(task_id)
        return task if task is not None and task.status is status else None

    return check


def _start_together(workers, backend, count, *args):
    """Start ``count`` workers at once (they load Django in parallel), then wait for all."""
    started = [workers.start(backend, *args, wait_ready=False, **FAST) for _ in range(count)]
    for process in started:
        process.wait_ready()
    return started


def _runner_of(workers, backend, task_id, attempt):
    """Wait until ``attempt`` of the task started, and return the worker process running it."""
    row = wait_until(
        lambda: executions(backend, task_id).filter(attempt=attempt).first(),
        20,
        f"attempt {attempt} of {task_id} never started",
        logs=workers.logs,
    )
    process = next((p for p in workers.started if p.pid == row.pid), None)
    assert process is not None, f"attempt {attempt} ran in an unknown process {row.pid}"
    return process


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_task_of_a_killed_worker_is_completed_by_another_after_its_lease(
    alias, key_prefix, workers
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # One pool thread each: whoever claims first holds "crash" (highest priority) running
    # and up to 10 more claims waiting in its pool when it dies.
    pair = _start_together(workers, backend, 2, *SMALL_POOL)
    others = [f"other-{i:02d}" for i in range(15)]
    service.submit_many(
        [
            TaskSubmitRequest(
                "demo.record",
                {"sleep": 30, "sleep_attempts": 1},  # hangs until killed, then runs at once
                task_id="crash",
                priority=10,
                retry_interval=100,
            ),
            *(TaskSubmitRequest("demo.record", task_id=i) for i in others),
        ]
    )
    crashed = _runner_of(workers, backend, "crash", 1)
    stranded = [i for i in others if service.get_task(i).worker_id == crashed.worker_id]
    crashed.kill()
    killed_at = timezone.now()
    assert service.get_task("crash").status is TaskStatus.RUNNING
    (survivor,) = [p for p in pair if p is not crashed]

    done = wait_until(
        _status(service, "crash", TaskStatus.COMPLETED),
        30,
        "the crashed task was not completed by the other worker",
        logs=workers.logs,
    )
    assert done.attempts == 2  # the crashed attempt counted once, plus the one that succeeded
    assert done.worker_id == survivor.worker_id
    rows = list(executions(backend, "crash"))
    assert [(r.attempt, r.pid, r.finished) for r in rows] == [
        (1, crashed.pid, False),
        (2, survivor.pid, True),
    ]
    # Not taken over while the dead worker's lease still ran (renewed every LEASE / 4; the
    # bound leaves room for a heartbeat that came late on a busy machine).
    assert rows[1].started_at >= killed_at + dt.timedelta(seconds=LEASE / 2)

    # Claims the dead worker never started were not lost with it: run once, by the survivor.
    assert stranded, "the crashed worker held no unstarted claims: nothing was tested"
    wait_until(
        lambda: all(service.get_task(i).status is TaskStatus.COMPLETED for i in others),
        20,
        "claims held by the dead worker were not recovered",
        logs=workers.logs,
    )
    for task_id in others:
        assert service.get_task(task_id).attempts == 1
        assert [r.pid for r in executions(backend, task_id)] == [survivor.pid], task_id
    survivor.terminate()
    assert survivor.wait(15) == 0, survivor.log()


@pytest.mark.parametrize("alias", db_params(["postgres", "redis"]))
def test_task_that_kills_its_worker_every_time_ends_failed(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # Runs no task of its own (other queue) but, as master, recovers the expired leases.
    watchdog = workers.start(backend, "--queues", "watchdog", **FAST)
    wait_until(
        lambda: service.storage.lock_owner("master") == watchdog.worker_id,
        10,
        "the watchdog did not become master",
        logs=workers.logs,
    )
    on_queue = _start_together(workers, backend, 3)
    service.submit(
        "demo.record", {"sleep": 60}, task_id="doomed", retry_limit=1, retry_interval=100
    )
    for attempt in (1, 2):
        _runner_of(workers, backend, "doomed", attempt).kill()

    failed = wait_until(
        _status(service, "doomed", TaskStatus.FAILED),
        15,
        "the twice-crashed task did not end FAILED",
        logs=workers.logs,
    )
    assert failed.attempts == 2
    assert "worker lost" in failed.last_error
    # It stays FAILED: the healthy worker left on its queue does not run it again.
    (bystander,) = [p for p in on_queue if p.alive()]
    time.sleep(1.0)
    assert service.get_task("doomed").status is TaskStatus.FAILED
    assert [r.attempt for r in executions(backend, "doomed")] == [1, 2]
    for process in (bystander, watchdog):
        process.terminate()
    assert [bystander.wait(15), watchdog.wait(15)] == [0, 0], workers.logs()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_master_failover_after_kill(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    storage = service.storage
    first = workers.start(backend, **FAST)
    wait_until(
        lambda: storage.lock_owner("master") == first.worker_id,
        10,
        "the only worker did not become master",
        logs=workers.logs,
    )
    # A task running on the master when it dies: only the next master can recover it.
    service.submit(
        "demo.record", {"sleep": 30, "sleep_attempts": 1}, task_id="on-master", retry_interval=100
    )
    wait_until(
        lambda: executions(backend, "on-master").exists(), 20, "never started", logs=workers.logs
    )
    second = workers.start(backend, **FAST)
    assert storage.lock_owner("master") == first.worker_id, "the lock changed hands while held"

    first.kill()
    killed_at = time.monotonic()
    wait_until(
        lambda: storage.lock_owner("master") == second.worker_id,
        MASTER_TTL + 10,
        "the surviving worker did not take the master lock",
        interval=0.02,
        logs=workers.logs,
    )
    took_over_after = time.monotonic() - killed_at
    assert took_over_after <= MASTER_TTL + 1.0, took_over_after

    # The new master's chores run: the dead master's lease is recovered, a retry comes due.
    service.submit("demo.flaky", {"fail_times": 1}, task_id="flaky", retry_interval=100)
    recovered = wait_until(
        _status(service, "on-master", TaskStatus.COMPLETED),
        30,
        "the dead master's task was not recovered",
        logs=workers.logs,
    )
    assert recovered.attempts == 2
    assert [(r.attempt, r.pid) for r in executions(backend, "on-master")] == [
        (1, first.pid),
        (2, second.pid),
    ]
    flaky = wait_until(
        _status(service, "flaky", TaskStatus.COMPLETED), 15, "no retry", logs=workers.logs
    )
    assert flaky.attempts == 2
    assert flaky.result == "succeeded on attempt 2"

    second.terminate()
    assert second.wait(15) == 0, second.log()
    assert storage.lock_owner("master") is None
