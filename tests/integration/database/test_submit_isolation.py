"""Concurrent submits of one task id under each isolation level the database storage supports."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connections, transaction

from django_reliable_executor import TaskStatus, TaskSubmitConflictError, TaskSubmitRequest
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import db_params, require

SET_SESSION_LEVEL = {
    "mariadb": "SET SESSION TRANSACTION ISOLATION LEVEL {}",
    "postgres": "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {}",
}
MARIADB = db_params(["mariadb"])[0].marks
POSTGRES = db_params(["postgres"])[0].marks


def race(executor: ReliableExecutor, alias: str, level: str | None, batch: bool) -> object:
    """Transaction A takes its snapshot, B submits the id and commits, then A submits it (alone,
    or in a batch with a new id).

    Returns what A's submit returned for the id, or the exception it raised."""
    require(alias)
    snapshot_taken = threading.Event()
    b_committed = threading.Event()
    outcome: list[object] = []

    def transaction_a() -> None:
        try:
            if level is not None:
                with connections[alias].cursor() as cursor:
                    cursor.execute(SET_SESSION_LEVEL[alias].format(level))
            with transaction.atomic(using=alias):
                assert executor.get_task("raced") is None  # the read fixes the snapshot
                snapshot_taken.set()
                assert b_committed.wait(30)
                try:
                    if batch:
                        requests = [
                            TaskSubmitRequest("demo.echo", {"by": "A"}, task_id=task_id)
                            for task_id in ("raced", "fresh")
                        ]
                        outcome.append(executor.submit_many(requests)[0])
                    else:
                        outcome.append(executor.submit("demo.echo", {"by": "A"}, task_id="raced"))
                except Exception as exc:  # the caller's transaction stays usable either way
                    outcome.append(exc)
                assert executor.get_task("other") is None
        except BaseException as exc:  # reported by the main thread
            outcome.append(("thread failed", exc))
        finally:
            snapshot_taken.set()
            connections.close_all()  # the session's isolation level goes with the connection

    thread = threading.Thread(target=transaction_a)
    thread.start()
    assert snapshot_taken.wait(30)
    stored = executor.submit("demo.echo", {"by": "B"}, task_id="raced")  # B: autocommit
    b_committed.set()
    thread.join(60)
    assert len(outcome) == 1, outcome
    assert executor.get_task("raced") == stored  # B's task, unchanged
    assert stored.parameter == {"by": "B"}
    return outcome[0]


@pytest.mark.parametrize(
    ("alias", "level"),
    [
        pytest.param("mariadb", "REPEATABLE READ", id="mariadb-repeatable-read", marks=MARIADB),
        pytest.param("mariadb", "READ COMMITTED", id="mariadb-read-committed", marks=MARIADB),
        pytest.param("postgres", None, id="postgres-read-committed", marks=POSTGRES),
    ],
)
@pytest.mark.parametrize("batch", [False, True], ids=["submit", "submit_many"])
def test_a_duplicate_submit_returns_the_task_another_transaction_committed(
    executor, alias, level, batch
):
    got = race(executor, alias, level, batch)
    assert not isinstance(got, BaseException), repr(got)
    assert got == executor.get_task("raced")
    assert got.status is TaskStatus.CREATED and got.parameter == {"by": "B"}


@pytest.mark.parametrize(
    "level",
    [
        pytest.param("REPEATABLE READ", id="repeatable-read"),
        pytest.param("SERIALIZABLE", id="serializable"),
    ],
)
@pytest.mark.parametrize("batch", [False, True], ids=["submit", "submit_many"])
@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_postgres_snapshot_isolation_asks_the_caller_to_retry_its_transaction(
    executor, alias, level, batch
):
    got = race(executor, alias, level, batch)
    assert isinstance(got, TaskSubmitConflictError), repr(got)
    assert not isinstance(got, IntegrityError)
    assert "retry" in str(got) and "raced" in str(got)
    assert got.field == "task_id"
