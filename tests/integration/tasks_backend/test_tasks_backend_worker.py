"""A real ``runexecutor`` runs tasks enqueued with Django's Tasks API (ReliableExecutorBackend):
return values, failures and their exception classes, retries, context, async tasks, a task
module nobody imported, run_after, and Django's task_started/task_finished in the worker."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from djtasks import elsewhere
from djtasks import tasks as djtasks
from djtasks.tasks import CustomError

from django_reliable_executor.tasks_compat import TaskResultStatus
from tests.conftest import require
from tests.support.processes import Backend, executions, service_for, wait_until


@pytest.fixture
def backend(alias, key_prefix, monkeypatch) -> Backend:
    """The subprocesses' storage; this process enqueues and reads results on it too."""
    require(alias)
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    monkeypatch.setattr(module_executor, "_storage", service.storage)
    monkeypatch.setattr(module_executor, "_clock", None)
    yield backend
    if alias == "redis":
        service.storage.close()


def signal_lines(log: str, signal: str, task_id: str) -> list[dict[str, str]]:
    """The djtasks app's log lines of one Django signal for one task (testproject/djtasks)."""
    pattern = re.compile(
        rf"djtasks signal={signal} id={re.escape(task_id)} path=(?P<path>\S+) "
        r"status=(?P<status>\S+) attempts=(?P<attempts>\d+) sender=(?P<sender>\S+)"
    )
    return [m.groupdict() for m in pattern.finditer(log)]


def test_runexecutor_runs_django_tasks(backend, workers):
    worker = workers.start(backend, "--queues", "default,djtasks")
    run_after = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)
    results = {
        "echo": djtasks.echo.enqueue(1, (2, "x"), key=("a",), n=None),
        "meaning": djtasks.meaning_of_life.enqueue(),
        "async": djtasks.add_async.enqueue(40, b=2),
        "fails": djtasks.fails.enqueue(),
        "fails_custom": djtasks.fails_custom.enqueue(),
        "context": djtasks.context_info.enqueue(),
        "flaky": djtasks.flaky.enqueue(fail_times=1),
        "own_queue": djtasks.on_own_queue.enqueue(),
        "by_path": elsewhere.found_by_path.enqueue(21),
        "deferred": djtasks.meaning_of_life.using(run_after=run_after).enqueue(),
    }

    def all_finished() -> bool:
        for result in results.values():
            result.refresh()
        return all(result.is_finished for result in results.values())

    wait_until(all_finished, 60, "the Django tasks did not all finish", logs=workers.logs)
    # Django's task_finished is sent just after each outcome is stored: wait for every line.
    wait_until(
        lambda: all(signal_lines(worker.log(), "task_finished", r.id) for r in results.values()),
        10,
        "a task_finished line is missing",
        logs=workers.logs,
    )
    log = worker.log()
    assert worker.alive(), log

    statuses = {name: r.status for name, r in results.items()}
    failed = {"fails", "fails_custom"}
    assert statuses == {
        name: TaskResultStatus.FAILED if name in failed else TaskResultStatus.SUCCESSFUL
        for name in results
    }, log

    assert results["echo"].return_value == {
        "args": [1, [2, "x"]],
        "kwargs": {"key": ["a"], "n": None},
    }
    assert results["meaning"].return_value == 42
    assert results["async"].return_value == 42
    assert results["context"].return_value == {"id": results["context"].id, "attempt": 1}
    assert results["flaky"].return_value == 2
    assert results["own_queue"].return_value == "ran"
    assert results["by_path"].return_value == 42
    assert results["deferred"].return_value == 42

    for name, result in results.items():
        assert result.attempts == (2 if name == "flaky" else 1), name
        assert result.worker_ids == [worker.worker_id] * result.attempts, name
        assert result.started_at is not None and result.finished_at is not None, name
        assert result.enqueued_at <= result.started_at <= result.finished_at, name
        assert result.last_attempted_at is not None, name
        if name not in failed and name != "flaky":
            assert result.errors == [], (name, result.errors)
        with_get = result.task.get_result(result.id)
        assert with_get.status == result.status and with_get.attempts == result.attempts

    assert results["deferred"].started_at >= run_after
    assert results["deferred"].task.run_after == run_after
    assert results["own_queue"].task.queue_name == "djtasks"
    assert results["own_queue"].task.priority == 5

    for name, exception_class, last_line in (
        ("fails", ValueError, "ValueError: This task failed due to ValueError"),
        ("fails_custom", CustomError, "djtasks.tasks.CustomError: custom failure"),
    ):
        errors = results[name].errors
        assert len(errors) == 1, (name, errors)
        assert errors[0].exception_class is exception_class
        assert errors[0].traceback.startswith("Traceback (most recent call last):")
        assert errors[0].traceback.rstrip("\n").splitlines()[-1] == last_line
        with pytest.raises(ValueError):
            _ = results[name].return_value

    # The attempt a context reports, as the task itself recorded it (demo Execution rows).
    context_rows = list(executions(backend, results["context"].id))
    assert [row.attempt for row in context_rows] == [1]
    flaky_rows = list(executions(backend, results["flaky"].id))
    assert [row.attempt for row in flaky_rows] == [1, 2]
    assert {row.pid for row in flaky_rows} == {worker.pid}

    # Django's signals, sent in the worker: task_started per attempt, task_finished at the end.
    for name, result in results.items():
        started = signal_lines(log, "task_started", result.id)
        finished = signal_lines(log, "task_finished", result.id)
        assert [s["status"] for s in started] == ["RUNNING"] * result.attempts, (name, log)
        assert [int(s["attempts"]) for s in started] == list(range(1, result.attempts + 1))
        assert [f["status"] for f in finished] == [str(result.status)], (name, log)
        assert int(finished[0]["attempts"]) == result.attempts
        assert {line["path"] for line in started + finished} == {result.task.module_path}
        assert {line["sender"] for line in started + finished} == {"ReliableExecutorBackend"}


def test_signals_of_a_task_found_by_path(backend, workers):
    """A task of a module no app autodiscovers: the worker imports it when it meets the
    task, and Django's task_started is sent for that very first task too."""
    worker = workers.start(backend, "--queues", "default")
    first = elsewhere.found_by_path.enqueue(1)
    wait_until(lambda: first.refresh() or first.is_finished, 30, "not run", logs=workers.logs)
    second = elsewhere.found_by_path.enqueue(2)
    wait_until(lambda: second.refresh() or second.is_finished, 30, "not run", logs=workers.logs)
    assert (first.return_value, second.return_value) == (2, 4)
    # The signal is sent just after the outcome is stored: wait for its line.
    wait_until(lambda: signal_lines(worker.log(), "task_finished", second.id), 10, "no signal line")
    log = worker.log()
    for result in (first, second):
        assert len(signal_lines(log, "task_finished", result.id)) == 1, log
    assert len(signal_lines(log, "task_started", second.id)) == 1, log
    assert len(signal_lines(log, "task_started", first.id)) == 1, log
