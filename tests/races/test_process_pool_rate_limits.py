"""rate_limit under ``runexecutor --pool process``: a start is written when a child is ready to
run the handler, so the limit holds for what the handlers themselves see (their own records),
even when every child is busy as rated tasks come (every storage)."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, most_in_a_window, read_journal, service_for, wait_until

CHILDREN = 3
LIMIT = 5  # demo.rated: rate_limit="5/s"


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_rated_handlers_in_children_keep_the_rate(alias, key_prefix, workers, tmp_path: Path):
    """Three children, all busy with demo.journal tasks sleeping 1.5 s, as 15 demo.rated tasks
    wait: a pool thread waiting for a child must not have written its task's start yet, or the
    starts written while the children were busy begin at once when they free up (the handlers
    began in bursts, three within 5 ms, although the start writes kept the rate). By the
    handlers' own clocks, at most five begin in any second."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    busy = [
        service.submit("demo.journal", {"sleep": 1.5}, task_id=f"busy-{i}").task_id
        for i in range(CHILDREN)
    ]
    rated = [service.submit("demo.rated", {}).task_id for _ in range(3 * LIMIT)]
    process = workers.start(
        backend,
        "--burst",
        "--pool",
        "process",
        "--max-pool-size",
        str(CHILDREN),
        env={"RE_JOURNAL": str(journal)},
    )
    wait_until(
        lambda: process.returncode is not None,
        90,
        "the burst worker did not finish",
        logs=workers.logs,
    )
    assert process.returncode == 0, workers.logs()
    infos = [service.get_task(i) for i in busy + rated]
    assert {i.status for i in infos} == {TaskStatus.COMPLETED}, workers.logs()
    records = read_journal(journal)
    began = {r["task"]: r["at"] for r in records if r["event"] == "start" and "at" in r}
    assert sorted(began) == sorted(rated)
    starts = sorted(began.values())
    # The start writes keep any six starts 1.05 s apart or more; a handler begins a few
    # milliseconds after its start is written (a message to a child that waits for it).
    assert most_in_a_window(starts, 1.0) <= LIMIT, starts
    service.storage.close()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_task_waiting_for_a_child_at_sigterm_is_handed_back_unstarted(
    alias, key_prefix, workers, tmp_path: Path
):
    """One child, busy with a demo.journal task sleeping 1.5 s, and a second task waiting for it
    in the child's other pool thread: not started (its start waits for the child), so SIGTERM
    hands it back at once, no attempt counted, while the first finishes; a new worker runs it."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}
    one_child = ("--pool", "process", "--max-pool-size", "1", "--queue-capacity", "0")
    process = workers.start(backend, *one_child, env=env)
    service.submit("demo.journal", {"sleep": 1.5}, task_id="first")

    def started(task_id: str) -> bool:
        return journal.exists() and f'"task": "{task_id}"' in journal.read_text()

    wait_until(lambda: started("first"), 30, "the first task did not start", logs=workers.logs)
    service.submit("demo.journal", {}, task_id="second")
    wait_until(
        lambda: service.get_task("second").worker_id is not None,
        30,
        "the second task was not claimed",
        logs=workers.logs,
    )
    process.terminate()
    assert process.wait(30) == 0, workers.logs()
    first, second = service.get_task("first"), service.get_task("second")
    assert first.status is TaskStatus.COMPLETED, (first, workers.logs())
    waiting = {TaskStatus.CREATED, TaskStatus.PENDING}
    assert second.status in waiting and second.attempts == 0, (second, workers.logs())
    assert not started("second")
    workers.start(backend, "--burst", *one_child, env=env)
    wait_until(
        lambda: service.get_task("second").status is TaskStatus.COMPLETED,
        60,
        "the second task did not complete",
        logs=workers.logs,
    )
    service.storage.close()
