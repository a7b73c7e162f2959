"""runexecutor as subprocesses: a batch whose second chunk holds dependents of its first is
submitted while two workers end (complete or fail) the first chunk's members. The chunk's
transaction and the members' ending writes lock task rows and the batch row: in one order
everywhere, and a deadlock victim retried, the submit raises nothing and each callback runs
exactly once, counted from the callback handler's own journal (every storage)."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connections, transaction

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.batches import BATCH_CHUNK
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import FAST, Backend, journal_lines, service_for, wait_until

REPETITIONS = 2
GROUP = 10  # each dependent of the second chunk waits for 10 members of the first
FAILING_EVERY = 7  # every 7th member of the first chunk fails (not retried)
# Longer than FAST's: a chunk keeps its dependencies' rows locked until it commits, and a
# running dependency's heartbeat waits for that lock meanwhile; no worker dies here.
LONG_LEASE = {"lease_timeout": 20.0, "master_lock_ttl": 2.0}


def _requests(rep: int) -> list[TaskSubmitRequest]:
    """A first chunk of members, some failing; then a second chunk whose first dependent waits
    for a task cancelled before (so it is cancelled at once, its batch's counters touched
    first thing in the chunk's transaction), and whose others together wait for every member
    of the first chunk, whichever ones the workers are ending meanwhile."""
    first = [
        TaskSubmitRequest("demo.soak", {"fail": i % FAILING_EVERY == 0}, task_id=f"r{rep}-m{i}")
        for i in range(BATCH_CHUNK)
    ]
    second = [TaskSubmitRequest("demo.soak", {}, task_id=f"r{rep}-d", depends_on=["cancelled"])]
    second += [
        TaskSubmitRequest(
            "demo.soak",
            {},
            task_id=f"r{rep}-d{start}",
            depends_on=[f"r{rep}-m{i}" for i in range(start, start + GROUP)],
            on_dependency_failure="run",
        )
        for start in range(0, BATCH_CHUNK, GROUP)
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
    pair = [workers.start(backend, wait_ready=False, env=env, **LONG_LEASE) for _ in range(2)]
    for process in pair:
        process.wait_ready()
    service.submit("demo.soak", {}, task_id="cancelled", delay_millis=3_600_000)
    assert service.cancel_task("cancelled")

    for rep in range(REPETITIONS):
        info = service.submit_batch(  # raised a deadlock error here (PostgreSQL, MariaDB)
            _requests(rep),
            batch_id=f"r{rep}",
            on_complete=TaskSubmitRequest("demo.batch_report", {"kind": "complete"}),
            on_success=TaskSubmitRequest("demo.batch_report", {"kind": "success"}),
        )
        assert (info.total, info.sealed) == (BATCH_CHUNK + 1 + BATCH_CHUNK // GROUP, True)

    def reported() -> bool:
        reports = [r for r in journal_lines(journal) if r["event"] == "report"]
        return {r["batch"] for r in reports} == {f"r{rep}" for rep in range(REPETITIONS)}

    wait_until(reported, 120, "the callbacks of every batch did not run", logs=workers.logs)
    for rep in range(REPETITIONS):
        batch = service.get_batch(f"r{rep}")
        assert (batch.pending, batch.finished) == (0, True), batch
        assert batch.failed == len(range(0, BATCH_CHUNK, FAILING_EVERY))
        assert batch.cancelled == 1  # r<rep>-d; the others run whatever their dependencies did

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


# A locking read of the batch table, as each backend's statement text shows it.
PATTERNS = {
    "postgres": '%FROM "reliable_executor_batch"%FOR UPDATE%',
    "mariadb": "%FROM `reliable_executor_batch`%FOR UPDATE%",
}


def _waiting_for_the_batch_row(alias: str) -> bool:
    """Does another connection wait for a lock in a statement on the batch table (MariaDB:
    run a locking read of it, which only waits here)?"""
    if alias == "postgres":
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' "
            "AND query LIKE %s"
        )
    else:  # (innodb_trx of MariaDB 10.11 does not list the waiting transaction)
        sql = (
            "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
            "AND id <> CONNECTION_ID() AND command = 'Query' AND info LIKE %s"
        )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [PATTERNS[alias]])
        return cursor.fetchone()[0] > 0


def _lock_batch_then_member(alias: str, batch_id: str, member: str, locked, go, done) -> None:
    """In a transaction of its own: lock the batch's row, then (on ``go``) the member's row,
    then roll back. The member's ending write, holding its row and waiting for the batch's,
    closes a cycle with it: the database picks one as the deadlock victim. Rows inserted first
    make this transaction the heavier one, which MariaDB keeps (it rolls back the lighter)."""
    from demo.models import Execution

    from django_reliable_executor.models import ReliableBatch, ReliableTask

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic(using=alias):
            Execution.objects.using(alias).bulk_create(
                [Execution(task_id="ballast", attempt=0, pid=0) for _ in range(200)]
            )
            ReliableBatch.objects.using(alias).select_for_update().get(pk=batch_id)
            locked.set()
            go.wait(60)
            list(ReliableTask.objects.using(alias).select_for_update().filter(pk=member))
            raise Rollback
    except Rollback:
        done.append("kept")
    except OperationalError:
        done.append("victim")
    finally:
        connections[alias].close()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_members_failure_write_chosen_as_deadlock_victim_is_written_again(
    alias, key_prefix, workers, tmp_path
):
    """The failure write of a batch member meets a transaction that holds the batch's row and
    then wants the member's: a deadlock, whose victim is the worker's write. It is run again
    (on PostgreSQL it was not: the task stayed RUNNING until its lease lapsed, then ran again
    as "worker lost"). The handler ran once, the task FAILED with its own error, and the
    callback ran once. SQLite and Redis take no row locks: the same batch, without the
    interfering transaction."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    service.submit_batch(
        [TaskSubmitRequest("demo.soak", {"fail": True}, task_id="v-m0")],
        batch_id="v",
        on_complete=TaskSubmitRequest("demo.batch_report", {"kind": "complete"}),
    )
    locks = alias in ("postgres", "mariadb")
    locked, go, done = threading.Event(), threading.Event(), []
    if locks:
        holder = threading.Thread(
            target=_lock_batch_then_member, args=(alias, "v", "v-m0", locked, go, done)
        )
        holder.start()
        assert locked.wait(30)
    workers.start(backend, env={"RE_JOURNAL": str(journal)}, **FAST)
    if locks:
        wait_until(
            lambda: _waiting_for_the_batch_row(alias),
            30,
            "the member's failure write never waited for the batch's row",
            logs=workers.logs,
        )
        go.set()
        holder.join(60)
        assert done == ["kept"]  # the worker's write was the victim
    wait_until(
        lambda: any(r["event"] == "report" for r in journal_lines(journal)),
        30,
        "the callback did not run",
        logs=workers.logs,
    )
    task = service.get_task("v-m0")
    assert task.status is TaskStatus.FAILED
    assert "this soak task fails" in task.last_error
    assert "worker lost" not in task.last_error
    records = journal_lines(journal)
    assert [r["task"] for r in records if r["event"] == "start"] == ["v-m0"]
    assert [r["kind"] for r in records if r["event"] == "report"] == ["complete"]
