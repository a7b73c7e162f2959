"""runexecutor as a subprocess: a handler's progress is visible through get_task while it runs,
and its last report is stored with its outcome (thread pool on every storage; an async handler
and --pool process on SQLite and Redis)."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, service_for, wait_until


def run_with_progress(alias, key_prefix, workers, tmp_path, task_name, *args):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    go = tmp_path / "go"
    service.submit(task_name, {"go": str(go)}, task_id="progress")
    workers.start(backend, *args)

    def running_at_one() -> bool:
        info = service.get_task("progress")
        return info.progress is not None and info.status is TaskStatus.RUNNING

    wait_until(running_at_one, 30, "no progress while the task ran", logs=workers.logs)
    info = service.get_task("progress")
    assert info.status is TaskStatus.RUNNING  # the handler waits for the file: still running
    assert (info.progress["current"], info.progress["total"], info.progress["message"]) == (
        1,
        3,
        "waiting",
    )
    go.touch()
    wait_until(
        lambda: service.get_task("progress").status is TaskStatus.COMPLETED,
        30,
        "the task did not complete",
        logs=workers.logs,
    )
    info = service.get_task("progress")
    assert (info.progress["current"], info.progress["message"], info.result) == (3, "done", "done")
    assert info.progress["updated_at"] <= info.finished_at


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_progress_is_visible_while_the_task_runs(alias, key_prefix, workers, tmp_path):
    run_with_progress(alias, key_prefix, workers, tmp_path, "demo.progress")


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_progress_of_an_async_handler(alias, key_prefix, workers, tmp_path):
    run_with_progress(alias, key_prefix, workers, tmp_path, "demo.async_progress")


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
def test_progress_from_a_process_pool_child(alias, key_prefix, workers, tmp_path):
    run_with_progress(
        alias,
        key_prefix,
        workers,
        tmp_path,
        "demo.progress",
        "--pool",
        "process",
        "--max-pool-size",
        "1",
    )
