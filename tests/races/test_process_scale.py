"""Several runexecutor processes on one storage: every task runs exactly once, none is left."""

from __future__ import annotations

import pytest
from django.db.models import Count

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until

TASKS = 2000


@pytest.mark.parametrize("processes", [2, 4])
@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres", "redis"]))
def test_each_task_runs_exactly_once_across_worker_processes(alias, processes, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    started = [
        workers.start(backend, log_level="WARNING", wait_ready=False) for _ in range(processes)
    ]
    for process in started:
        process.wait_ready()
    # All at once, while every worker is polling: they race for the same rows.
    ids = [f"scale-{i:05d}" for i in range(TASKS)]
    service.submit_many([TaskSubmitRequest("demo.record", task_id=i) for i in ids])

    live = (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING)

    def finished_counts() -> dict[TaskStatus, int] | None:
        counts = service.count_by_status()
        return counts if not any(counts[s] for s in live) else None

    counts = wait_until(
        finished_counts,
        150,
        f"{TASKS} tasks were not all finished by {processes} workers",
        interval=0.5,
        logs=workers.logs,
    )
    for process in started:
        process.terminate()
    assert [p.wait(20) for p in started] == [0] * processes, workers.logs()

    assert counts[TaskStatus.COMPLETED] == TASKS, counts
    tasks = service.list_tasks(limit=TASKS + 1)  # one more: a task too many would show
    assert sorted(t.task_id for t in tasks) == ids
    assert not [t for t in tasks if t.attempts != 1], "a task was started more than once"
    per_task = executions(backend).order_by().values("task_id").annotate(n=Count("pk"))
    ran = {row["task_id"]: row["n"] for row in per_task}
    assert sorted(ran) == ids, "a task never ran"
    assert {n for n in ran.values()} == {1}, {t: n for t, n in ran.items() if n != 1}
    assert not executions(backend).filter(finished=False).exists()
    # Every process took part, so the claims really competed.
    pids = set(executions(backend).values_list("pid", flat=True))
    assert pids == {p.pid for p in started}
