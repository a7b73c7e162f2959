"""fairness="round_robin" under ``runexecutor --pool process``: a worker claims a fair task only
for a child free to start it, not for the second pool thread each child has (every storage)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, read_journal, service_for, wait_until

ONE_CHILD = ("--pool", "process", "--max-pool-size", "1")
BUSY_SECONDS = 12.0  # the first worker's child, busy: long enough for a second worker to start
# (under a loaded machine a worker took over 6 s to start: 8 s failed once)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_fair_task_waits_for_a_free_child_not_in_a_busy_childs_thread(
    alias, key_prefix, workers, tmp_path: Path
):
    """Worker 1's one child runs tenant A's demo.fair task; its other pool thread is idle. A
    fair task of tenant B claimed for that thread would wait there for the busy child, ahead
    of the other workers (before the fix it was claimed within a poll, and ran only once A's
    was over). It stays in the storage, so worker 2, started later, runs it at once."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}

    def records(task_id: str, event: str) -> list[dict]:
        return [r for r in read_journal(journal) if r["task"] == task_id and r["event"] == event]

    first = workers.start(backend, *ONE_CHILD, env=env)
    busy = service.submit(
        "demo.fair", {"tenant": "A", "sleep": BUSY_SECONDS}, concurrency_key="A"
    ).task_id
    wait_until(lambda: records(busy, "start"), 30, "A's task did not start", logs=workers.logs)
    waiting = service.submit("demo.fair", {"tenant": "B"}, concurrency_key="B").task_id
    time.sleep(1.0)  # five polls of worker 1 (0.2 s), each woken by the submit or the timeout
    info = service.get_task(waiting)
    assert (info.status, info.worker_id) == (TaskStatus.CREATED, None), (info, workers.logs())

    second = workers.start(backend, *ONE_CHILD, env=env)
    wait_until(
        lambda: service.get_task(waiting).status is TaskStatus.COMPLETED,
        30,
        "B's task did not complete",
        logs=workers.logs,
    )
    assert service.get_task(waiting).worker_id == second.worker_id, workers.logs()
    assert not records(busy, "end"), "B's task ran only after A's: it waited for worker 1's child"
    wait_until(
        lambda: service.get_task(busy).status is TaskStatus.COMPLETED,
        30,
        "A's task did not complete",
        logs=workers.logs,
    )
    assert service.get_task(busy).worker_id == first.worker_id
    service.storage.close()
