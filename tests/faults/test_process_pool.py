"""runexecutor --pool process against real worker processes: handlers that os._exit or die of
SIGSEGV, a hard timeout and a hard cancel (the child terminated), on all four storages; children
replaced after --max-tasks-per-child; a handler holding the GIL for longer than LEASE_TIMEOUT
keeps its lease. Checked against the handlers' own records (journal, Execution rows)."""

from __future__ import annotations

import time

import pytest
from django.core.management import CommandError, call_command

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, executions, pid_gone, service_for, wait_until

CHILDREN = ("--pool", "process", "--max-pool-size", "3")
DEADLINE_MS = 5000
JOURNALED = ("overdue", "cancelled", "exit-once", "exit-always", "segv", "poison", "async")


def _finished(service, ids, timeout, logs):
    """Wait until every task of ``ids`` is terminal; their TaskInfos by id."""

    def check():
        tasks = {i: service.get_task(i) for i in ids}
        return tasks if all(t is not None and t.is_terminal for t in tasks.values()) else None

    return wait_until(check, timeout, f"tasks {ids} did not all end", logs=logs)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_crashes_timeouts_and_cancels_end_in_the_child_not_the_worker(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(backend, *CHILDREN, env=journal.env())
    fast = {"retry_interval": 50}
    service.submit_many(
        [
            # Run first, side by side: they hold two children until the worker stops them.
            TaskSubmitRequest(
                "demo.journal",
                {"sleep": 60},
                task_id="overdue",
                priority=9,
                max_duration_millis=DEADLINE_MS,
            ),
            TaskSubmitRequest("demo.journal", {"sleep": 60}, task_id="cancelled", priority=9),
            TaskSubmitRequest(
                "demo.journal", {"crash": "exit", "crash_attempts": 1}, task_id="exit-once", **fast
            ),
            TaskSubmitRequest(
                "demo.journal", {"crash": "exit"}, task_id="exit-always", retry_limit=1, **fast
            ),
            TaskSubmitRequest("demo.journal", {"crash": "segv"}, task_id="segv", retry_limit=0),
            TaskSubmitRequest("demo.flaky", {"fail_times": 1}, task_id="flaky", **fast),
            TaskSubmitRequest("demo.always_fails", task_id="fails", retry_limit=0),
            TaskSubmitRequest(
                "demo.process_order", {"order_id": 7, "amount": 2.5}, task_id="order"
            ),
            TaskSubmitRequest("demo.journal", {"poison": "bigint"}, task_id="poison"),
            TaskSubmitRequest("demo.async_sleep", {"seconds": 0.05}, task_id="async"),
        ]
    )
    wait_until(
        lambda: "cancelled" in journal.runs(), 30, "the sleeper never started", logs=workers.logs
    )
    assert service.cancel_task("cancelled")
    cancel_asked = time.monotonic()
    tasks = _finished(service, [*JOURNALED, "flaky", "fails", "order"], 60, workers.logs)
    runs = journal.runs()

    # Hard cancel and hard timeout: the child was terminated, long before its 60 s sleep.
    cancelled, overdue = tasks["cancelled"], tasks["overdue"]
    assert cancelled.status is TaskStatus.CANCELLED, cancelled
    assert "terminated" in cancelled.last_error
    assert overdue.status is TaskStatus.TIMEOUT, overdue
    # Recorded by the worker as it stops the child, or by the master's expiry chore just before.
    assert "max duration" in overdue.last_error
    assert (overdue.finished_at - overdue.created_at).total_seconds() < DEADLINE_MS / 1000 + 10
    assert time.monotonic() - cancel_asked < 30
    for task_id in ("cancelled", "overdue"):
        (run,) = runs[task_id]
        assert run.end is None and pid_gone(run.pid), run
        assert run.pid != worker.pid

    # A child that dies costs its task one attempt, retried as any failure; the worker lives on.
    assert tasks["exit-once"].status is TaskStatus.COMPLETED and tasks["exit-once"].attempts == 2
    first, second = runs["exit-once"]
    assert first.end is None and second.end is not None and first.pid != second.pid
    always = tasks["exit-always"]
    assert always.status is TaskStatus.FAILED and always.attempts == 2, always
    assert "child process running the handler died: exit code 3" in always.last_error
    segv = tasks["segv"]
    assert segv.status is TaskStatus.FAILED and segv.attempts == 1, segv
    assert "killed by signal SIGSEGV" in segv.last_error

    # The usual outcomes, as under the thread pool: results, tracebacks, retries, refusals.
    assert tasks["flaky"].status is TaskStatus.COMPLETED and tasks["flaky"].attempts == 2
    assert tasks["flaky"].result == "succeeded on attempt 2"
    assert tasks["fails"].status is TaskStatus.FAILED
    assert "RuntimeError: this task always fails" in tasks["fails"].last_error
    assert "Traceback" in tasks["fails"].last_error
    assert tasks["order"].result == {"order_id": 7, "charged": 2.5, "currency": "EUR"}
    assert tasks["poison"].status is TaskStatus.FAILED
    assert "result cannot be stored" in tasks["poison"].last_error
    assert tasks["async"].status is TaskStatus.COMPLETED and tasks["async"].result == 1
    assert worker.alive()
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_children_are_replaced_after_max_tasks_per_child(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(
        backend, "--pool", "process", "--max-pool-size", "1", "--max-tasks-per-child", "2"
    )
    ids = [f"r{i}" for i in range(6)]
    service.submit_many([TaskSubmitRequest("demo.record", task_id=i) for i in ids])
    tasks = _finished(service, ids, 60, workers.logs)
    assert {t.status for t in tasks.values()} == {TaskStatus.COMPLETED}
    pids = [row.pid for row in executions(backend)]
    assert len(pids) == 6 and worker.pid not in pids
    # One child at a time, two tasks each: three children, one after the other.
    assert len(set(pids)) == 3 and all(pids.count(pid) == 2 for pid in pids), pids
    assert {tasks[i].result for i in ids} == set(pids)
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_a_handler_holding_the_gil_for_seconds_keeps_its_lease(alias, key_prefix, workers, journal):
    """Under the thread pool this starves the heartbeat (test_lease_renewal.py); in a child it
    cannot: the lease is renewed, the task is not recovered nor run twice."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    lease = 1.5
    worker = workers.start(
        backend,
        "--pool",
        "process",
        "--max-pool-size",
        "1",
        env=journal.env(),
        lease_timeout=lease,
        master_lock_ttl=lease,
    )
    service.submit("demo.journal", {"spin": 2 * lease}, task_id="spinner", retry_limit=2)
    (task,) = _finished(service, ["spinner"], 60, workers.logs).values()
    assert task.status is TaskStatus.COMPLETED and task.attempts == 1, task
    (run,) = journal.runs()["spinner"]
    assert run.end is not None and run.end - run.start >= lease, run
    assert "heartbeat came" not in worker.log(), worker.log()
    assert "worker lost" not in worker.log(), worker.log()
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()


def test_max_tasks_per_child_needs_the_process_pool():
    with pytest.raises(CommandError, match="--max-tasks-per-child needs --pool process"):
        call_command("runexecutor", "--max-tasks-per-child", "5", "--pool", "thread")


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_a_hard_stop_terminates_running_children_and_records_their_attempts(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(backend, *CHILDREN, env=journal.env())
    service.submit("demo.journal", {"sleep": 60}, task_id="long", retry_interval=50)
    wait_until(lambda: "long" in journal.runs(), 30, "the task never started", logs=workers.logs)
    worker.terminate()
    time.sleep(0.5)  # quiet: draining, the handler still running
    worker.terminate()  # the second signal: stop now
    assert worker.wait(30) == 1, worker.log()
    (run,) = journal.runs()["long"]
    assert run.end is None and pid_gone(run.pid), run
    task = service.get_task("long")
    assert task.status is TaskStatus.PENDING and task.attempts == 1, task
    assert "the worker stopped" in task.last_error
    # The shutdown warning says what happened: recorded at once, not left to the lease.
    assert "children are stopped now and each attempt is recorded as failed" in worker.log()
    assert "recovered after their lease" not in worker.log()
