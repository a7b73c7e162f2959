"""Large batches: submitted in bounded memory (chunks of BATCH_CHUNK prepared and stored at a
time, measured with tracemalloc), with counters that hold every member, and a member's ending
that costs the same whatever the size of its batch.

A batch of 100,000 members on Redis. On the databases (SQLite, MariaDB and PostgreSQL share
the database storage's code) the same two properties are asserted at a lower cost, by
comparison: the submit's peak with 20,000 members against 2,000, and the queries of a member's
ending in the one batch against the other (CI time: the 100,000 took 48 s on SQLite)."""

from __future__ import annotations

import tracemalloc

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_reliable_executor import TaskSubmitRequest
from tests.conftest import db_params

MEMBERS = 100_000
# What 100,000 stored TaskInfo records alone would take is several times this: the submit
# keeps a chunk, never the batch.
PEAK_BYTES = 24 * 1024 * 1024
# Sizes compared on MariaDB and PostgreSQL, and how much more the larger submit's peak may be
# (bounded caches, such as options.py's of options found good, fill up to ~0.4 MiB): 18,000
# more members in it, so anything kept per member shows beyond 58 bytes a member (an id);
# a stored TaskInfo kept per member would add about 20 MiB.
SMALL, LARGE = 2_000, 20_000
GROWTH_BYTES = 1024 * 1024


def members(n: int, prefix: str) -> list[TaskSubmitRequest]:
    return [TaskSubmitRequest("demo.noop", task_id=f"{prefix}{i}") for i in range(n)]


def traced_peak(executor, requests: list[TaskSubmitRequest], batch_id: str) -> int:
    """The peak of Python's allocations while the batch is submitted (bytes)."""
    tracemalloc.start()
    try:
        info = executor.submit_batch(requests, batch_id=batch_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (info.total, info.pending, info.sealed) == (len(requests), len(requests), True)
    return peak


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_a_batch_of_100000_members_is_submitted_in_bounded_memory(executor, alias):
    requests = [TaskSubmitRequest("demo.noop", task_id=f"n{i}") for i in range(MEMBERS)]
    tracemalloc.start()
    try:
        info = executor.submit_batch(
            requests, batch_id="big", on_complete=TaskSubmitRequest("demo.noop", task_id="end")
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (info.total, info.pending, info.sealed, info.finished) == (MEMBERS, MEMBERS, True, False)
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.1f} MiB while submitting"
    assert executor.get_task("n99999").batch_id == "big"
    assert executor.count_by_status()["CREATED"] == MEMBERS
    # Cancelling every member ends the batch: the last cancel stores the callback, once.
    for i in range(0, MEMBERS, 20_000):
        executor.storage.cancel(f"n{i}")
    batch = executor.get_batch("big")
    assert (batch.cancelled, batch.pending, batch.finished) == (5, MEMBERS - 5, False)
    assert executor.get_task("end") is None


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres"]))
def test_submit_memory_and_an_endings_cost_do_not_grow_with_the_batch(executor, alias):
    executor.submit_batch(members(SMALL, "w"), batch_id="warm-up")  # one-time allocations
    small = traced_peak(executor, members(SMALL, "s"), "small")
    large = traced_peak(executor, members(LARGE, "l"), "large")
    assert large - small < GROWTH_BYTES, (
        f"peak {large / 2**20:.2f} MiB with {LARGE} members, {small / 2**20:.2f} MiB with {SMALL}"
    )
    # A member's ending: the same queries in either batch (one counter update, never a count
    # of the members).
    ended = {}
    for batch_id, task_id in (("small", "s7"), ("large", "l7")):
        with CaptureQueriesContext(connections[alias]) as queries:
            assert executor.storage.cancel(task_id).changed
        ended[batch_id] = len(queries)
        assert not [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert ended["small"] == ended["large"]
    assert [executor.get_batch(b).cancelled for b in ("small", "large")] == [1, 1]
    assert executor.get_batch("large").pending == LARGE - 1
