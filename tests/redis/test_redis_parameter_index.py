"""The parameter index on Redis (SEARCHABLE_PARAMETERS, storage/redis/parameter_index.py): a
search it answers finds what the bounded scan finds, never cut short; its sets are written with
the task, all or nothing, moved by a debounced join, emptied by the purge (REDIS_SHARDS from
TEST_REDIS_SHARDS, as every Redis test)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.conf import get_settings
from django_reliable_executor.core.parameter_filter import cut_short
from django_reliable_executor.exceptions import TaskSubmitError
from django_reliable_executor.master.schedule_firing import ScheduleFiring, fire_task
from django_reliable_executor.schedules.records import ScheduleFire
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import listing
from tests.conftest import db_params
from tests.support.redis_support import index_problems

pytestmark = pytest.mark.parametrize("alias", db_params(["redis"]), indirect=True)

KEYS = ["customer_id", "region", "flag", "note", "city", "a", "a:b", "ключ", "long"]
LONG = "x" * 300  # its index text is a digest


@pytest.fixture
def indexed(settings, storage, clock):
    """The service with KEYS searchable; every index invariant holds after the test."""
    settings.RELIABLE_EXECUTOR = {**settings.RELIABLE_EXECUTOR, "SEARCHABLE_PARAMETERS": KEYS}
    yield ReliableExecutor(storage, clock=clock)
    assert index_problems(storage) == []


@pytest.fixture
def scan(indexed, storage, clock):
    """The same tasks read without the index (no key searchable): the bounded scan."""
    plain = dataclasses.replace(get_settings(), SEARCHABLE_PARAMETERS=())
    return ReliableExecutor(storage, clock=clock, settings=plain)


def complete(storage, queue: str, n: int) -> None:
    """Claim ``n`` tasks of ``queue`` and complete them (no handler run)."""
    claims = storage.claim("w1", [queue], n, 30.0)
    assert len(claims) == n
    for claim in claims:
        started = storage.start(claim, 30.0)
        assert started is not None and storage.complete(started, None) is not None


def ids(tasks) -> list[str]:
    return [task.task_id for task in tasks]


def index_sets(storage) -> dict[str, list[str]]:
    """Every ``pidx:`` set of every shard (found by SCAN) by its name after ``pidx:``, with
    its members oldest first."""
    found = {}
    for prefix in storage.prefixes:
        for key in storage.client.scan_iter(match=prefix + "pidx:*", count=1000):
            found[key[len(prefix + "pidx:") :]] = storage.client.zrange(key, 0, -1)
    return found


PARAMETERS = {
    "int": {"customer_id": 42, "region": "eu"},
    "float": {"customer_id": 42.0, "region": "us"},
    "text": {"customer_id": "42", "region": "eu"},
    "bool": {"customer_id": True, "flag": True},
    "one": {"customer_id": 1, "flag": False, "note": None},
    "nested": {"customer_id": [42], "city": {"name": "Edinburgh"}},
    "list": [{"customer_id": 42}],
    "colon": {"a:b": "c", "a": "b:c", "ключ": "значение", "city": 'Zürich "Old"'},
    "long": {"long": LONG, "customer_id": 7},
    "longer": {"long": LONG + "y", "customer_id": 7},
}
SEARCHES = [
    {"parameter": {"customer_id": 42}},
    {"parameter": {"customer_id": 42.0}},
    {"parameter": {"customer_id": "42"}},
    {"parameter": {"customer_id": True}},
    {"parameter": {"note": None}},
    {"parameter": {"customer_id": 42, "region": "eu"}},
    {"parameter": {"region": "eu"}, "limit": 2, "offset": 1},
    {"parameter": {"a:b": "c"}},
    {"parameter": {"a": "b:c"}},
    {"parameter": {"a": "b"}},
    {"parameter": {"ключ": "значение", "city": 'Zürich "Old"'}},
    {"parameter": {"long": LONG}},
    {"parameter": {"long": LONG, "customer_id": 7}},
    {"parameter": {"customer_id": 42}, "tag": "t"},
    {"parameter": {"customer_id": 42}, "status": "COMPLETED"},
    {"parameter": {"customer_id": 42}, "status": "CREATED"},
    {"parameter": {"customer_id": 42}, "task_name": "demo.cpu"},
    {"parameter": {"customer_id": 42}, "batch_id": "b1"},
    {"parameter": {"customer_id": 42}, "queue": "second"},
    {"parameter": {"customer_id": 42}, "limit": 1, "offset": 2},
    {"parameter": {"customer_id": 42, "unindexed": 1}},
]


def test_an_indexed_search_finds_what_the_scan_finds(indexed, scan, storage):
    indexed.submit_many(
        [TaskSubmitRequest("demo.echo", value, task_id=key) for key, value in PARAMETERS.items()]
    )
    for key, value in PARAMETERS.items():
        indexed.clock.advance(1)
        indexed.submit("demo.echo", value, task_id=key + "-later", tags=["t"], queue="second")
    indexed.submit("demo.cpu", {"customer_id": 42, "iterations": 1}, task_id="noop")
    indexed.submit_batch([TaskSubmitRequest("demo.echo", {"customer_id": 42.0})], batch_id="b1")
    complete(storage, "second", 3)  # some COMPLETED
    found = ids(indexed.list_tasks(parameter={"customer_id": 42}))
    assert len(found) == 6  # and the batch's member
    assert {"int", "int-later", "float", "float-later", "noop"} <= set(found)
    for search in SEARCHES:
        found = indexed.list_tasks(**search)
        assert ids(found) == ids(scan.list_tasks(**search)), search
        assert not cut_short(found), search
    assert ids(indexed.list_tasks(parameter={"customer_id": "42"})) == ["text-later", "text"]
    assert ids(indexed.list_tasks(parameter={"long": LONG})) == ["long-later", "long"]
    assert ids(indexed.list_tasks(parameter={"a": "b:c"})) == ["colon-later", "colon"]
    assert indexed.list_tasks(parameter={"a": "b"}) == []
    entries = {name.split(":", 1)[1] for name in index_sets(storage)}
    assert {"customer_id:42", 'customer_id:"42"', "customer_id:true", 'a:b:"c"'} <= entries
    assert not any(LONG in entry for entry in entries)  # kept as a digest


def test_an_indexed_search_is_never_cut_short(indexed, scan, monkeypatch):
    monkeypatch.setattr(listing, "SCAN_LIMIT", 100)  # the scan reads 100 entries at most
    indexed.submit("demo.echo", {"customer_id": 42}, task_id="oldest", tags=["t"])
    indexed.clock.advance(1)
    indexed.submit_many(
        [TaskSubmitRequest("demo.echo", {"customer_id": -n}, tags=("t",)) for n in range(150)]
    )
    page = scan.list_tasks(parameter={"customer_id": 42}, tag="t")
    assert page == [] and cut_short(page)  # the match lies beyond the scan's bound
    for filters in ({}, {"tag": "t"}, {"status": "CREATED"}, {"offset": 0, "limit": 1}):
        page = indexed.list_tasks(parameter={"customer_id": 42}, **filters)
        assert ids(page) == ["oldest"] and not cut_short(page), filters


def test_a_refused_submit_stores_no_index_entry(indexed, storage):
    requests = [
        TaskSubmitRequest("demo.echo", {"customer_id": 5}, task_id="first"),
        TaskSubmitRequest("demo.echo", {"customer_id": 6}, task_id="second", depends_on=["gone"]),
    ]
    with pytest.raises(TaskSubmitError):
        indexed.submit_many(requests)
    assert index_sets(storage) == {}
    assert indexed.list_tasks(parameter={"customer_id": 5}) == []


def test_a_debounced_join_moves_the_entries_with_the_parameter(indexed, storage):
    def submit(parameter):
        return indexed.submit("demo.echo", parameter, debounce=10, unique_key="k")

    first = submit({"customer_id": 1, "region": "eu"})
    indexed.clock.advance(1)
    joined = submit({"customer_id": 2, "region": "eu"})
    assert joined.task_id == first.task_id and joined.debounced
    assert indexed.list_tasks(parameter={"customer_id": 1}) == []
    assert ids(indexed.list_tasks(parameter={"customer_id": 2})) == [first.task_id]
    assert sorted(index_sets(storage)) == ["11:customer_id:2", '6:region:"eu"']
    submit({"other": 1})  # no searchable key left: no entry
    assert index_sets(storage) == {}
    assert storage.client.hget(storage._tkey(first.task_id, storage_shard(storage)), "px") is None


def storage_shard(storage) -> int:
    """The shard holding the only task stored (its hash is found there)."""
    for shard, prefix in enumerate(storage.prefixes):
        if any(storage.client.scan_iter(match=prefix + "t:*")):
            return shard
    raise AssertionError("no task stored")


def test_the_purge_empties_the_index(indexed, storage):
    indexed.submit_many(
        [TaskSubmitRequest("demo.echo", {"customer_id": n % 2, "ключ": "v"}) for n in range(4)]
    )
    indexed.submit("demo.echo", {"customer_id": 0}, task_id="kept", queue="later")
    complete(storage, "default", 4)
    indexed.clock.advance(10)
    assert storage.purge_finished(indexed.clock.now() - dt.timedelta(seconds=1), 10) == 4
    assert index_sets(storage) == {"11:customer_id:0": ["kept"]}
    assert ids(indexed.list_tasks(parameter={"customer_id": 0})) == ["kept"]


def test_a_schedules_runs_are_indexed(indexed, storage):
    indexed.schedule("tick", "demo.echo", {"customer_id": 9}, every=60)
    indexed.clock.advance(61)
    ScheduleFiring(indexed).run_once()  # the master's round (on the schedule hash's strings)
    by_hand = indexed.run_schedule_now("tick")
    runs = indexed.list_tasks(parameter={"customer_id": 9})
    assert len(runs) == 2 and runs[0].task_id == by_hand
    # A fire planned elsewhere (fire_schedules), its task built by fire_task.
    schedule = indexed.get_schedule("tick")
    now = indexed.clock.now()
    task = fire_task(schedule, schedule.next_run_at, now)
    after = schedule.next_run_at + dt.timedelta(minutes=1)
    fire = ScheduleFire("tick", schedule.next_run_at, after, (task,), task.run_at, task.task_id)
    assert len(storage.fire_schedules([fire], now)) == 1
    assert len(indexed.list_tasks(parameter={"customer_id": 9})) == 3


def walk(storage, keys, chunk: int = 3) -> tuple[int, int, int]:
    """index_parameters to the end, a few keys a step: tasks read, entries written, deleted."""
    after, totals = None, (0, 0, 0)
    while True:
        step = storage.index_parameters(keys, after, chunk)
        totals = (totals[0] + step.tasks, totals[1] + step.written, totals[2] + step.deleted)
        if step.last_task_id is None:
            return totals
        after = step.last_task_id


def test_index_parameters_gives_older_tasks_their_entries(indexed, scan, storage):
    for n in range(5):  # stored before the keys were searchable: no entry
        scan.submit("demo.echo", {"customer_id": n % 2, "region": "eu"}, task_id=f"old{n}")
    assert index_sets(storage) == {}
    assert indexed.list_tasks(parameter={"customer_id": 1}) == []  # not found by the index
    assert walk(storage, KEYS) == (5, 10, 0)
    assert ids(indexed.list_tasks(parameter={"customer_id": 1})) == ["old3", "old1"]
    assert walk(storage, KEYS) == (5, 0, 0)  # idempotent
    assert walk(storage, ["region"]) == (5, 0, 5)  # a key no longer named: its entries go
    assert sorted(index_sets(storage)) == ['6:region:"eu"']
