"""The database storage built with defaults: what it reads from the settings when it needs it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connections
from django.test import override_settings

from django_reliable_executor import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.database import DatabaseStorage, rows
from django_reliable_executor.storage.database.access import value_bytes
from tests.conftest import DB_ALIASES, db_params, require
from tests.support.contract_support import claim_and_start


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_storage_without_a_backoff_cap_reads_it_from_the_settings(alias):
    """Built without backoff_cap_millis (as a plain DatabaseStorage(alias) is), recording a
    retryable failure takes the cap from DEFAULT_RETRY_BACKOFF_MAX."""
    require(alias)
    storage = DatabaseStorage(alias=alias)
    executor = ReliableExecutor(storage)
    executor.submit(
        "demo.echo", {}, task_id="no-cap", retry_interval=3_600_000, retry_backoff="exponential"
    )
    claim = claim_and_start(storage)
    with override_settings(RELIABLE_EXECUTOR={"DEFAULT_RETRY_BACKOFF_MAX": 1000}):
        assert storage.backoff_cap_millis == 1000
        transition = storage.fail(claim, "boom", retryable=True)
    assert transition is not None and transition.status is TaskStatus.PENDING
    info = executor.get_task("no-cap")
    assert info.status is TaskStatus.PENDING
    # Capped at 1 s rather than an hour from now.
    assert info.run_at - claim.task.started_at <= dt.timedelta(seconds=5)


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_fenced_writes_find_their_rows_by_primary_key_on_sqlite(alias):
    """Start, complete and heartbeat match their claims' rows by primary key. SQLite's planner
    once walked the claim index over every finished task instead (a lone ``available``
    condition in the WHERE clause lured it), which made every start cost a table's worth."""
    require(alias)
    storage = DatabaseStorage(alias=alias)
    executor = ReliableExecutor(storage)
    for i in range(3):
        executor.submit("demo.echo", {}, task_id=f"plan-{i}")
    claims = storage.claim("w1", ["default"], 3, 30)
    assert len(claims) == 3
    tokens = [(claim.task_id, claim.token) for claim in claims]
    for sql, params in (
        rows.claimed_by_holders(claims),
        rows.held_by_claims(claims),
        rows.holding_sql("w1", tokens),
    ):
        with connections[alias].cursor() as cursor:
            cursor.execute(
                f"EXPLAIN QUERY PLAN SELECT task_id FROM reliable_executor_task WHERE {sql}",
                params,
            )
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
        assert "sqlite_autoindex_reliable_executor_task" in plan, plan
        assert "rexec_" not in plan, plan
        with connections[alias].cursor() as cursor:  # and they do match the claimed rows
            cursor.execute(f"SELECT task_id FROM reliable_executor_task WHERE {sql}", params)
            assert {row[0] for row in cursor.fetchall()} == {c.task_id for c in claims}


def test_spans_split_by_rows_and_by_bytes():
    assert list(rows.spans([1] * 5, max_bytes=100, max_rows=2)) == [
        slice(0, 2),
        slice(2, 4),
        slice(4, 5),
    ]
    assert list(rows.spans([40, 40, 40, 200, 10], max_bytes=100, max_rows=10)) == [
        slice(0, 2),
        slice(2, 3),
        slice(3, 4),  # larger than a statement takes: a run of its own
        slice(4, 5),
    ]
    assert list(rows.spans([], max_bytes=100)) == []


def test_values_are_measured_as_the_statement_carries_them():
    assert value_bytes(None, mysql=False) == 4
    assert value_bytes('"é"', mysql=False) == 4  # UTF-8 bytes, not characters
    assert value_bytes('"a\\\\b"', mysql=True) == 6 + 2 + 2  # quotes, backslashes escaped
