"""A batch of 100,000 members is submitted in bounded memory (chunks of BATCH_CHUNK prepared and
stored at a time, measured with tracemalloc) and its counters hold every member (SQLite and
Redis here; MariaDB and PostgreSQL share the database storage's code, see bench/)."""

from __future__ import annotations

import tracemalloc

import pytest

from django_reliable_executor import TaskSubmitRequest

from .conftest import db_params

MEMBERS = 100_000
# What 100,000 stored TaskInfo records alone would take is several times this: the submit
# keeps a chunk, never the batch.
PEAK_BYTES = 24 * 1024 * 1024


@pytest.mark.parametrize("alias", db_params(["default", "redis"]))
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
