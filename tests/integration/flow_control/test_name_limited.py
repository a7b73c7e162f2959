"""The database storage keeps the waiting tasks of each name with a rate_limit or a
max_concurrency in a range of the claim index of its own (``limited_name``): they are stored
with it, the claim of all other names never takes (or reads) them, each name's claim reads its
own range, and the master's chores set it right when a name gains or loses its limits.
SQLite, MariaDB and PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connections

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.flow_limits import NO_FLOW_LIMITS
from django_reliable_executor.core.rate_limits import parse_rate_limit
from django_reliable_executor.master.chores import MasterChores
from django_reliable_executor.models import ReliableTask
from django_reliable_executor.registry import limited_names
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.base import TaskStorage
from tests.conftest import DB_ALIASES, db_params, require
from tests.support.contract_support import LEASE, new_task

CAPPED = "demo.capped"  # max_concurrency=2
RATED = "demo.rated"  # rate_limit="5/s"
PLAIN = "demo.echo"


@pytest.fixture(params=db_params(DB_ALIASES))
def alias(request: pytest.FixtureRequest) -> str:
    require(request.param)
    return request.param


def marks(alias: str) -> dict[str, str]:
    """{task id: limited_name}"""
    rows = ReliableTask.objects.using(alias).values_list("task_id", "limited_name")
    return dict(rows)


def claimed(storage: TaskStorage, **limits) -> list[str]:
    claims = storage.claim("w1", ["default"], 10, LEASE, **limits)
    return sorted(claim.task_id for claim in claims)


def test_the_registry_names_the_limited_names():
    names = limited_names()
    assert {CAPPED, RATED, "demo.noop_rated"} <= names
    assert PLAIN not in names


def test_tasks_of_limited_names_are_stored_marked(executor: ReliableExecutor, alias: str):
    executor.submit(CAPPED, {"x": 1}, task_id="c1")
    executor.submit(RATED, {"n": 1}, task_id="r1")
    executor.submit(PLAIN, {"x": 1}, task_id="p1")
    # Several rows in one statement (on PostgreSQL: one array per column).
    executor.submit_many(
        [
            TaskSubmitRequest(task_name=CAPPED, task_parameter={"x": 2}, task_id="c2"),
            TaskSubmitRequest(task_name=PLAIN, task_parameter={"x": 2}, task_id="p2"),
        ]
    )
    assert marks(alias) == {"c1": CAPPED, "r1": RATED, "p1": "", "c2": CAPPED, "p2": ""}


def test_the_claim_of_other_names_never_takes_a_marked_task(
    executor: ReliableExecutor, storage: TaskStorage
):
    executor.submit(CAPPED, {"x": 1}, task_id="c1")
    executor.submit(PLAIN, {"x": 1}, task_id="p1")
    # A worker that does not know CAPPED's cap (it lost it in a deploy) claims only p1 ...
    assert claimed(storage) == ["p1"]
    # ... until the master's chores unmark c1, which no limited name of its registry names.
    assert storage.mark_limited(frozenset(), 500) == 1
    assert claimed(storage) == ["c1"]


def test_the_claims_by_name_take_marked_tasks(executor: ReliableExecutor, storage: TaskStorage):
    for n in range(3):
        executor.submit(CAPPED, {"x": n}, task_id=f"c{n}")
        executor.submit(RATED, {"n": n}, task_id=f"r{n}")
    limits = {
        "name_limits": {CAPPED: 2},
        "rate_limits": {RATED: parse_rate_limit("5/s")},
    }
    assert claimed(storage, **limits) == ["c0", "c1", "r0", "r1", "r2"]


def test_mark_limited_sets_the_mark_right_both_ways(make_storage, alias: str, clock):
    now = clock.now()
    # Stored by a process that did not know the limits (another service's submit, an older
    # version): unmarked.
    storage = make_storage(clock, flow_limits=NO_FLOW_LIMITS)
    storage.enqueue([new_task(f"c{n}", CAPPED, {"x": n}, now) for n in range(3)])
    storage.enqueue([new_task(f"r{n}", RATED, {"n": n}, now) for n in range(2)])
    storage.enqueue([new_task("p1", PLAIN, {"x": 1}, now)])
    assert set(marks(alias).values()) == {""}
    assert storage.mark_limited({CAPPED, RATED}, 2) == 2  # at most the limit per call
    assert storage.mark_limited({CAPPED, RATED}, 2) == 2
    assert storage.mark_limited({CAPPED, RATED}, 2) == 1
    assert storage.mark_limited({CAPPED, RATED}, 2) == 0
    expected = {"c0": CAPPED, "c1": CAPPED, "c2": CAPPED, "r0": RATED, "r1": RATED, "p1": ""}
    assert marks(alias) == expected
    # CAPPED lost its cap: its range emptied, RATED's kept.
    assert storage.mark_limited({RATED}, 500) == 3
    assert marks(alias) == {**expected, "c0": "", "c1": "", "c2": ""}


def test_only_waiting_tasks_are_marked(make_storage, alias: str, clock):
    storage = make_storage(clock, flow_limits=NO_FLOW_LIMITS)
    storage.enqueue([new_task("c1", CAPPED, {"x": 1}, clock.now())])
    assert claimed(storage, name_limits={CAPPED: 2}) == ["c1"]  # claimed: not waiting
    assert storage.mark_limited({CAPPED}, 500) == 0
    assert marks(alias) == {"c1": ""}


def test_the_master_chores_mark_the_tasks_of_limited_names(
    executor: ReliableExecutor, make_storage, alias: str, clock
):
    unwired = make_storage(clock, NO_FLOW_LIMITS)  # stores as a process knowing no limits
    unwired.enqueue([new_task("c1", CAPPED, {"x": 1}, clock.now())])
    unwired.enqueue([new_task("p1", PLAIN, {"x": 1}, clock.now())])
    chores = MasterChores(executor, retention_seconds=3600)
    chores.run_once()
    assert marks(alias) == {"c1": CAPPED, "p1": ""}
    # Not again before the next minute's round: the marks are not read every round.
    unwired.enqueue([new_task("c2", CAPPED, {"x": 2}, clock.now())])
    chores.run_once()
    assert marks(alias)["c2"] == ""


def test_the_claim_of_other_names_uses_the_index_past_marked_tasks(
    executor: ReliableExecutor, storage: TaskStorage, alias: str
):
    """SQLite's plan: the claim of all other names searches the claim index on limited_name
    too, so a held backlog is outside the range it reads."""
    if alias != "default":
        return  # the plan's wording is SQLite's; the other planners are measured by bench/
    executor.submit(PLAIN, {"x": 1}, task_id="p1")
    connection = connections[alias]
    with connection.execute_wrapper(_capture := _Capture()):
        claimed(storage)
    claim_sql, params = _capture.claim
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {claim_sql}", params)
        plan = " / ".join(str(row[-1]) for row in cursor.fetchall())
    assert "rexec_claim_idx (available=? AND limited_name=? AND queue=?" in plan, plan


class _Capture:
    """Keeps the claiming statement a claim ran (an execute_wrapper)."""

    claim: tuple[str, list]

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().startswith("UPDATE") and "limited_name" in sql:
            self.claim = (sql, list(params))
        return execute(sql, params, many, context)


def test_a_limited_name_s_task_stored_without_it_waits_for_the_chores(
    executor: ReliableExecutor, storage: TaskStorage, make_storage, clock
):
    """Its claim reads the name's own range only: a task stored by a process that did not know
    the cap is claimed once the master's chores moved it there (at most a minute)."""
    make_storage(clock, NO_FLOW_LIMITS).enqueue([new_task("c1", CAPPED, {"x": 1}, clock.now())])
    # Neither by the name's claim nor by the claim of all other names (left out by name).
    assert claimed(storage, name_limits={CAPPED: 2}) == []
    assert storage.mark_limited({CAPPED}, 500) == 1
    assert claimed(storage, name_limits={CAPPED: 2}) == ["c1"]


def test_a_limited_name_s_claim_reads_its_own_range(
    executor: ReliableExecutor, storage: TaskStorage, alias: str
):
    """SQLite's plan: a capped name's claim searches the claim index on its limited_name, so
    another limited name's held backlog is outside the range it reads."""
    if alias != "default":
        return  # the plan's wording is SQLite's
    executor.submit(CAPPED, {"x": 1}, task_id="c1")
    connection = connections[alias]
    with connection.execute_wrapper(_capture := _Capture()):
        assert claimed(storage, name_limits={CAPPED: 2}) == ["c1"]
    claim_sql, params = _capture.claim
    assert CAPPED in params
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {claim_sql}", params)
        plan = " / ".join(str(row[-1]) for row in cursor.fetchall())
    assert "rexec_claim_idx (available=? AND limited_name=? AND queue=?" in plan, plan
