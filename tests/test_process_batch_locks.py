"""runexecutor as subprocesses: a batch whose second chunk holds dependents of its first is
submitted while two workers end (complete or fail) the first chunk's members. The chunk's
transaction and the members' ending writes lock task rows and the batch row: in one order
everywhere, and a deadlock victim retried, the submit raises nothing and each callback runs
exactly once, counted from the callback handler's own journal (every storage)."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.batches import BATCH_CHUNK

from .conftest import BACKENDS, db_params, require
from .processes import FAST, Backend, service_for, wait_until
from .test_process_batches import journal_lines

REPETITIONS = 2
DEPENDENTS = 300  # the second chunk: each depends on a member of the first
FAILING_EVERY = 7  # every 7th member of the first chunk fails (not retried)


def _requests(rep: int) -> list[TaskSubmitRequest]:
    first = [
        TaskSubmitRequest("demo.soak", {"fail": i % FAILING_EVERY == 0}, task_id=f"r{rep}-m{i}")
        for i in range(BATCH_CHUNK)
    ]
    second = [
        TaskSubmitRequest("demo.soak", {}, task_id=f"r{rep}-d{i}", depends_on=[f"r{rep}-m{i}"])
        for i in range(DEPENDENTS)
    ]
    return first + second


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_batch_of_dependents_submitted_while_members_end_neither_deadlocks_nor_loses_a_callback(
    alias, key_prefix, workers, tmp_path
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}
    pair = [workers.start(backend, wait_ready=False, env=env, **FAST) for _ in range(2)]
    for process in pair:
        process.wait_ready()

    for rep in range(REPETITIONS):
        info = service.submit_batch(  # raised a deadlock error here (PostgreSQL, MariaDB)
            _requests(rep),
            batch_id=f"r{rep}",
            on_complete=TaskSubmitRequest("demo.batch_report", {"kind": "complete"}),
            on_success=TaskSubmitRequest("demo.batch_report", {"kind": "success"}),
        )
        assert (info.total, info.sealed) == (BATCH_CHUNK + DEPENDENTS, True)

    def reported() -> bool:
        reports = [r for r in journal_lines(journal) if r["event"] == "report"]
        return {r["batch"] for r in reports} == {f"r{rep}" for rep in range(REPETITIONS)}

    wait_until(reported, 120, "the callbacks of every batch did not run", logs=workers.logs)
    for rep in range(REPETITIONS):
        batch = service.get_batch(f"r{rep}")
        assert (batch.pending, batch.finished) == (0, True), batch
        assert batch.failed == len(range(0, BATCH_CHUNK, FAILING_EVERY))

    records = journal_lines(journal)
    for rep in range(REPETITIONS):
        reports = [r for r in records if r["event"] == "report" and r["batch"] == f"r{rep}"]
        # Some members failed: on_complete once, on_success never.
        assert [r["kind"] for r in reports] == ["complete"], (rep, reports)
    # Each member's handler ran once: no ending write was lost (and its task recovered as
    # "worker lost" after its lease, to run again).
    starts: dict[str, int] = {}
    for record in records:
        if record["event"] == "start":
            starts[record["task"]] = starts.get(record["task"], 0) + 1
    assert {task: n for task, n in starts.items() if n > 1} == {}
    failed = service.list_tasks(status=TaskStatus.FAILED, limit=1000)
    assert [t.task_id for t in failed if "worker lost" in (t.last_error or "")] == []
