"""On PostgreSQL the task table's partial indexes (migrations 0003 and 0023) still serve the
queries that need them: the condition each query is sent with implies the index's, so the
planner may use the index. Checked on the statements the storage really sends, with every
other index of the table dropped (in a transaction rolled back after) and sequential scans
off: an index whose condition a query does not imply is never chosen then."""

from __future__ import annotations

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.rate_limits import RateLimit
from tests.conftest import db_params, require
from tests.support.contract_support import LEASE

TABLE = "reliable_executor_task"
RATED = "demo.echo"


def plans_using(alias: str, index: str, statements: list[str]) -> list[str]:
    """The statements among ``statements`` whose plan reads ``index`` when it is the table's
    only index besides the primary key."""
    connection = connections[alias]
    using = []
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexname <> %s "
            "AND indexname <> %s",
            [TABLE, index, f"{TABLE}_pkey"],
        )
        for (other,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX "{other}"')
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in statements:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            if index in plan:
                using.append(sql)
        transaction.set_rollback(True, using=alias)
    return using


@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_the_batch_index_serves_the_listing_of_a_batch(alias, executor, storage):
    require(alias)
    batch = executor.submit_batch([TaskSubmitRequest("demo.noop", None) for _ in range(3)])
    executor.submit("demo.noop", None)  # not in a batch: not in the partial index
    with CaptureQueriesContext(connections[alias]) as captured:
        members = executor.list_tasks(batch_id=batch.batch_id)
    assert len(members) == 3
    selects = [q["sql"] for q in captured.captured_queries if "batch_id" in q["sql"]]
    assert selects, captured.captured_queries
    assert plans_using(alias, "rexec_batch_idx", selects), selects
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'rexec_batch_idx'")
        assert cursor.fetchone()[0].endswith("WHERE (batch_id IS NOT NULL)")


@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_the_rate_key_index_serves_the_claims_of_a_rate_limited_name(alias, executor, storage):
    """A claim that passes over the tasks of a key known full reads the (task name, rate key)
    index, which holds waiting tasks only."""
    require(alias)
    rate = RateLimit(1, 60.0)
    b_task = None
    for key in ("a", "a", "b"):
        b_task = executor.submit(RATED, None, rate_key=key).task_id
    first = storage.claim("w1", ["default"], 1, LEASE, rate_limits={RATED: rate}, start=0)
    assert len(first) == 1  # key "a" is full now, and noted so by this storage
    with CaptureQueriesContext(connections[alias]) as captured:
        second = storage.claim("w1", ["default"], 10, LEASE, rate_limits={RATED: rate}, start=0)
    assert [c.task_id for c in second] == [b_task]
    selects = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith("SELECT") and "rate_key NOT IN" in q["sql"]
    ]
    assert selects, captured.captured_queries
    assert plans_using(alias, "rexec_rate_key_idx", selects), selects
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'rexec_rate_key_idx'")
        assert cursor.fetchone()[0].endswith("WHERE available")


@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_the_claim_index_serves_the_claim_of_all_other_names(alias, executor, storage):
    """Migration 0024: limited_name in the partial claim index, so the claim of the names
    without limits reads none of the limited names' waiting tasks (0032: flow_round after
    the priority, fairness's order)."""
    require(alias)
    executor.submit("demo.capped", None)  # max_concurrency: stored with limited_name
    executor.submit("demo.noop", None)
    with CaptureQueriesContext(connections[alias]) as captured:
        claims = storage.claim("w1", ["default"], 10, LEASE)
    assert [claim.task.task_name for claim in claims] == ["demo.noop"]
    claiming = [q["sql"] for q in captured.captured_queries if "limited_name" in q["sql"]]
    assert claiming, captured.captured_queries
    assert plans_using(alias, "rexec_claim_idx", claiming), claiming
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'rexec_claim_idx'")
        assert cursor.fetchone()[0].endswith(
            "(limited_name, queue, priority DESC, flow_round, run_at) WHERE available"
        )
