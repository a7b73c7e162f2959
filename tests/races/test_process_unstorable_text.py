"""runexecutor as a subprocess, on every storage: a handler's error and progress text holding
a NUL and a lone surrogate are stored altered, saying so; the error's task fails once (its
exception is not in retry_on), and every task's progress is stored, however they are batched."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until

ALTERED = "(text altered: 2 NUL or surrogate character(s) replaced by U+FFFD)"
TASKS = 4


@pytest.mark.parametrize(
    "pool", [(), ("--pool", "process", "--max-pool-size", "1")], ids=["threads", "process"]
)
@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_handler_error_with_unstorable_text_fails_once_with_its_error(
    alias, key_prefix, workers, pool
):
    """Under --pool process the child sends the error over its pipe; the worker records it."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.unstorable_text", {"fail": True}, task_id="bad-error", retry_limit=2)
    # A short lease: had the failure not been written, recovery would run the task again soon.
    workers.start(backend, *pool, lease_timeout=3)
    info = wait_until(
        lambda: (task := service.get_task("bad-error")) is not None and task.is_terminal and task,
        60,
        "the task did not end",
        logs=workers.logs,
    )
    assert info.status is TaskStatus.FAILED, info.last_error
    assert info.attempts == 1
    assert executions(backend, "bad-error").count() == 1  # the handler's own record: one run
    assert info.last_error.endswith("NotRetried: cannot go on: \ufffd and \ufffd\n" + ALTERED)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_progress_with_unstorable_text_from_several_tasks_is_stored_for_each(
    alias, key_prefix, workers, tmp_path
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    go = tmp_path / "go"
    ids = [f"progress-{i}" for i in range(TASKS)]
    for task_id in ids:
        service.submit("demo.unstorable_text", {"go": str(go)}, task_id=task_id)
    workers.start(backend, "--max-pool-size", str(TASKS), "--core-pool-size", str(TASKS))

    def reported() -> bool:
        tasks = service.storage.get_many(ids)
        return len(tasks) == TASKS and all(
            task.status is TaskStatus.RUNNING and task.progress is not None
            for task in tasks.values()
        )

    # Written while the handlers wait: by the progress writer's thread, in batches.
    wait_until(reported, 30, "not every task's progress was stored", logs=workers.logs)
    go.touch()
    wait_until(
        lambda: all(
            task.status is TaskStatus.COMPLETED for task in service.storage.get_many(ids).values()
        ),
        30,
        "the tasks did not complete",
        logs=workers.logs,
    )
    for task_id, task in service.storage.get_many(ids).items():
        assert task.progress is not None
        assert task.progress["message"] == f"{task_id}: \ufffd and \ufffd {ALTERED}"
        assert executions(backend, task_id).count() == 1
