"""A Redis count or listing filtered by status, name and queue checks each finished task on the
server (lua/index_match.lua): a count of dead letters of one name reads the whole done index
(where the client's reads stopped at COUNT_SCAN_LIMIT and said "at least"), in chunks, exactly
as the client's check would (REDIS_SHARDS from TEST_REDIS_SHARDS, as every Redis test)."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.task_count import TaskCount
from django_reliable_executor.service import bulk_actions
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import listing
from tests.conftest import db_params

pytestmark = pytest.mark.parametrize("alias", db_params(["redis"]), indirect=True)


def fail_all(storage, queue: str, n: int) -> None:
    """Claim ``n`` tasks of ``queue`` and fail them for good (no handler run)."""
    left = n
    while left:
        claims = storage.claim("w1", [queue], left, 30.0)
        assert claims, left
        for claim in claims:
            started = storage.start(claim, 30.0)
            assert started is not None
            assert storage.fail(started, "boom", retryable=False) is not None
        left -= len(claims)


@pytest.fixture
def mixed(storage, clock):
    """120 failed tasks of demo.echo in queue a, 60 of demo.noop in a, 40 of demo.echo in b,
    submitted interleaved (the name's tasks are spread through the done index); the odd
    demo.echo tasks of a are tagged "odd"."""
    service = ReliableExecutor(storage, clock=clock)
    requests = []
    for i in range(120):
        tags = ["odd"] if i % 2 else []
        requests.append(
            TaskSubmitRequest("demo.echo", None, task_id=f"e-{i:03d}", queue="a", tags=tags)
        )
        if i % 2:
            requests.append(TaskSubmitRequest("demo.noop", None, task_id=f"n-{i:03d}", queue="a"))
        if i % 3 == 0:
            requests.append(TaskSubmitRequest("demo.echo", None, task_id=f"b-{i:03d}", queue="b"))
    service.submit_many(requests)
    fail_all(storage, "a", 180)
    fail_all(storage, "b", 40)
    return service


def test_a_count_past_the_clients_bound_is_exact(mixed, monkeypatch):
    monkeypatch.setattr(listing, "COUNT_SCAN_LIMIT", 50)  # the client's reads would stop here
    monkeypatch.setattr(listing, "SERVER_CHUNK", 7)  # many calls, a chunk cut mid-way
    count = bulk_actions.count_up_to
    echo = {"task_name": "demo.echo", "status": "FAILED"}
    assert count(mixed, echo, cap=1000) == TaskCount(160, complete=True)
    assert count(mixed, {**echo, "queue": "a"}, cap=1000) == TaskCount(120, complete=True)
    assert count(mixed, {**echo, "queue": "b"}, cap=1000) == TaskCount(40, complete=True)
    assert count(mixed, {"task_name": "demo.noop", "status": "FAILED"}, cap=1000) == TaskCount(60)
    assert count(mixed, {**echo, "status": "COMPLETED"}, cap=1000) == TaskCount(0)
    assert count(mixed, echo, cap=100) == TaskCount(100, complete=False)  # the cap still holds
    # A tag's set, checked on the server too (its 60 tasks among 220).
    assert count(mixed, {"tag": "odd"}, cap=1000) == TaskCount(60, complete=True)
    assert count(mixed, {"tag": "odd", "task_name": "demo.noop"}, cap=1000) == TaskCount(0)
    page = mixed.list_tasks(tag="odd", status="FAILED", queue="a", limit=4)
    assert [t.task_id for t in page] == ["e-119", "e-117", "e-115", "e-113"]


def test_the_servers_bound_stops_a_count_and_says_so(mixed, monkeypatch):
    monkeypatch.setattr(listing, "SERVER_SCAN_LIMIT", 30)
    monkeypatch.setattr(listing, "SERVER_CHUNK", 7)
    found = bulk_actions.count_up_to(mixed, {"task_name": "demo.echo", "status": "FAILED"})
    assert not found.complete and found.n < 160, found
    assert found.words().startswith("at least")


def test_a_page_checked_on_the_server_is_the_page_the_client_would_cut(mixed, monkeypatch):
    monkeypatch.setattr(listing, "SERVER_CHUNK", 7)
    page = mixed.list_tasks(status="FAILED", task_name="demo.echo", queue="a", limit=25, offset=5)
    expected = [f"e-{i:03d}" for i in range(119, -1, -1)][5:30]  # newest first
    assert [t.task_id for t in page] == expected
    assert all(t.task_name == "demo.echo" and t.queue == "a" for t in page)
    # A purged task in the index's way is left out, not an error.
    storage = mixed.storage
    assert sum(storage.client.delete(p + "t:e-118") for p in storage.prefixes) == 1
    page = mixed.list_tasks(status="FAILED", task_name="demo.echo", queue="a", limit=3)
    assert [t.task_id for t in page] in (["e-119", "e-117", "e-116"], ["e-119", "e-118", "e-117"])
