"""A claim never takes more than it asked for, nor more of a capped name than its free slots,
whatever plan the database picks for the claiming statement.

On PostgreSQL the claim once chose its rows in ``IN (SELECT ... LIMIT n FOR UPDATE SKIP
LOCKED)``. Once the table's statistics made the planner pick a nested-loop semi-join, it ran
that subquery again for each row, every run skipping the rows already claimed, and a claim of
one took every due task: the chaos soak saw three, then eight, runs of a name capped at two.
Here the planner is pushed to that plan (hash joins, hashing, materialisation and sorts off
for the session), which the statistics of a real table chose by themselves."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connections

from django_reliable_executor.storage.base import TaskStorage
from tests.support.contract_support import LEASE

NAME = "demo.echo"
CAPPED = "demo.chaos_capped"  # registered with max_concurrency=2: its claims read its own lane
RATED = "demo.chaos_rated"  # registered with rate_limit="5/s"
# The plan the statistics of a real table chose: a nested-loop semi-join running the subquery
# again for each row (found by trying the combinations of these settings on a table of 20).
PLANNER = ("enable_hashjoin", "enable_material", "enable_hashagg", "enable_sort")


@contextlib.contextmanager
def nested_loops(storage: TaskStorage) -> Iterator[None]:
    """On PostgreSQL, make the claim's join a nested loop for this connection (elsewhere
    nothing: SQLite runs an IN subquery once, MariaDB claims by primary key after its read)."""
    alias = getattr(storage, "alias", None)
    if alias is None or connections[alias].vendor != "postgresql":
        yield
        return
    with connections[alias].cursor() as cursor:
        cursor.execute("ANALYZE reliable_executor_task")
        for setting in PLANNER:
            cursor.execute(f"SET {setting} = off")
    try:
        yield
    finally:
        with connections[alias].cursor() as cursor:
            for setting in PLANNER:
                cursor.execute(f"RESET {setting}")


def held(executor, name: str = NAME) -> int:
    return sum(1 for task in executor.list_tasks(task_name=name) if task.worker_id)


def test_a_claim_takes_no_more_than_its_limit(executor, storage):
    for i in range(20):
        executor.submit(NAME, i)
    with nested_loops(storage):
        first = storage.claim("w1", ["default"], 1, LEASE)
        more = storage.claim("w2", ["default"], 3, LEASE)
    assert len(first) == 1
    assert len(more) == 3
    assert held(executor) == 4  # what the storage holds, not only what the calls returned


def test_a_capped_claim_takes_no_more_than_the_free_slots(executor, storage):
    for _ in range(20):
        executor.submit(CAPPED, {"sleep": 0})
    with nested_loops(storage):
        first = storage.claim("w1", ["default"], 1, LEASE, name_limits={CAPPED: 2})
        second = storage.claim("w2", ["default"], 8, LEASE, name_limits={CAPPED: 2})
        third = storage.claim("w3", ["default"], 8, LEASE, name_limits={CAPPED: 2})
    assert (len(first), len(second), len(third)) == (1, 1, 0)
    assert held(executor, CAPPED) == 2


def test_a_rate_limited_claim_takes_no_more_than_its_window_allows(executor, storage):
    from django_reliable_executor.core.rate_limits import RateLimit

    for _ in range(20):
        executor.submit(RATED, {"sleep": 0})
    rate = {RATED: RateLimit(5, 60.0)}
    with nested_loops(storage):
        first = storage.claim("w1", ["default"], 1, LEASE, rate_limits=rate, start=1)
        second = storage.claim("w2", ["default"], 8, LEASE, rate_limits=rate, start=8)
    assert (len(first), len(second)) == (1, 4)
    assert held(executor, RATED) == 5
