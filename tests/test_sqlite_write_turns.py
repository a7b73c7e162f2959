"""SQLite: the storage's writes in one process take turns (write_turns), first come first
served, and a worker writes nothing outside its turn: claims, rate logs, starts, completions,
failures, retries, heartbeats, schedules, the master lock and its chores."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connections
from django.db.backends.signals import connection_created

from django_reliable_executor import TaskStatus
from django_reliable_executor.records import TaskSubmitRequest
from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.storage.database import write_turns
from django_reliable_executor.worker import Worker, WorkerOptions
from tests.conftest import db_params

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def _in_line(turns: write_turns.WriteTurns, count: int) -> tuple[list[int], list[threading.Thread]]:
    """``count`` threads that queue for ``turns`` one after the other (the caller holds it),
    each noting its number when it gets the turn."""
    order: list[int] = []

    def take(number: int) -> None:
        with turns:
            order.append(number)

    threads = []
    for number in range(count):
        thread = threading.Thread(target=take, args=(number,))
        thread.start()
        deadline = time.monotonic() + 5
        while len(turns._waiting) <= number:  # queued before the next one starts
            assert time.monotonic() < deadline
            time.sleep(0.001)
        threads.append(thread)
    return order, threads


def test_turns_go_in_the_order_they_were_asked_for():
    turns = write_turns.WriteTurns()
    with turns:
        order, threads = _in_line(turns, 6)
        assert order == []  # nobody gets in while the turn is held
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4, 5]
    assert not turns.held() and turns._owner is None


def test_a_turn_is_re_entrant_and_passed_on_only_when_left_whole():
    turns = write_turns.WriteTurns()
    with turns:
        with turns:  # a gated write inside another of the same thread
            assert turns.held()
            order, threads = _in_line(turns, 1)
        assert turns.held() and order == []  # still held by the outer one
    threads[0].join(5)
    assert order == [0]


def test_one_turn_per_database_file():
    assert write_turns.for_file("a.sqlite3") is write_turns.for_file("a.sqlite3")
    assert write_turns.for_file("a.sqlite3") is not write_turns.for_file("b.sqlite3")


@dataclasses.dataclass
class Writes:
    """The INSERT, UPDATE and DELETE statements run on SQLite: each one's first words, and
    those run without the thread's turn, as "<thread>: <statement>"."""

    seen: set[str] = dataclasses.field(default_factory=set)
    outside: list[str] = dataclasses.field(default_factory=list)


@pytest.fixture
def writes() -> Iterator[Writes]:
    """The writes of every connection opened meanwhile and of this thread's."""
    turns = write_turns.for_file(str(connections["default"].settings_dict["NAME"]))
    found = Writes()

    def check(execute: Callable, sql: str, params: object, many: bool, context: dict) -> object:
        if sql.lstrip().upper().startswith(WRITES):
            words = sql.replace('"', "").split()
            found.seen.add(" ".join(words[: 2 if words[0].upper() == "UPDATE" else 3]))
            if not turns.held():
                found.outside.append(f"{threading.current_thread().name}: {sql[:120]}")
        return execute(sql, params, many, context)

    def watch(sender: object, connection: object, **kwargs: object) -> None:
        if connection.alias == "default":  # type: ignore[attr-defined]
            connection.execute_wrappers.append(check)  # type: ignore[attr-defined]

    connection_created.connect(watch)
    connections["default"].ensure_connection()
    connections["default"].execute_wrappers.append(check)
    try:
        yield found
    finally:
        connection_created.disconnect(watch)
        connections["default"].execute_wrappers.remove(check)


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_a_worker_writes_only_in_its_turn(make_storage, writes):
    service = ReliableExecutor(make_storage())  # the real clock
    ids = [service.submit("demo.noop").task_id for _ in range(30)]
    ids += [service.submit("demo.noop_rated").task_id for _ in range(30)]
    ids += [service.submit("demo.capped", {"sleep": 0.01}).task_id for _ in range(6)]
    ids += [service.submit("demo.flaky", {"fail_times": 1}).task_id for _ in range(3)]
    ids += [service.submit("demo.slow", {"seconds": 1.5}).task_id]  # heartbeats meanwhile
    failing = service.submit("demo.always_fails", retry_limit=1).task_id
    service.schedule("turns-every-second", "demo.noop", every=1)
    options = WorkerOptions(
        core_pool_size=4,
        max_pool_size=4,
        poll_interval=0.05,
        lease_timeout=1.5,  # a heartbeat every half second
        master_lock_ttl=1.0,
        finished_retention=0.5,  # the master's purge deletes what finished
        worker_id="turns",
    )
    worker = Worker(options, service)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            statuses = {i: service.get_task(i) for i in ids + [failing]}
            live = [i for i, task in statuses.items() if task and not task.status.is_terminal]
            if not live:
                break
            assert time.monotonic() < deadline, f"still live: {live}"
            time.sleep(0.05)
        time.sleep(1.5)  # more heartbeats, chores rounds and fires of the schedule
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert service.get_task(failing).status == TaskStatus.FAILED
    # The master's purge (due once a minute: run here as its chores run it).
    storage = make_storage()
    assert storage.purge_finished(storage.clock.now() + dt.timedelta(hours=1), 1000) > 0
    # The test's own submits and its schedule took their turns too.
    assert writes.outside == []
    # What the run wrote, so that the check above saw it: claims, starts, completions and
    # retries, the rate log, the registry's heartbeats, the master lock, the purge.
    assert {
        "UPDATE reliable_executor_task",
        "INSERT INTO reliable_executor_rate_log",
        "UPDATE reliable_executor_worker",
        "UPDATE reliable_executor_lock",
        "INSERT INTO reliable_executor_retry_count",
        "DELETE FROM reliable_executor_task",
    } <= writes.seen, writes.seen
    connections.close_all()


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_operations_write_only_in_their_turn(make_storage, clock, writes):
    """What a web request, the admin, the API or a command writes: each in its turn."""
    storage = make_storage(clock)
    service = ReliableExecutor(storage, clock=clock)
    first = service.submit("demo.noop", unique_for=60).task_id
    service.submit("demo.noop", depends_on=[first])
    service.submit_many([TaskSubmitRequest("demo.echo", i) for i in range(3)])
    batch = service.submit_batch(
        [TaskSubmitRequest("demo.noop")], on_complete=TaskSubmitRequest("demo.noop")
    )
    service.cancel_task(first)
    service.retry_task(first)
    service.pause_queue("default")
    service.resume_queue("default")
    service.schedule("turns", "demo.noop", every=60)
    service.pause_schedule("turns")
    service.resume_schedule("turns")
    service.delete_schedule("turns")
    claims = storage.claim("w", ["default"], 10, 60)
    started = [c for c in storage.start_many(claims[:4], 60) if c is not None]
    storage.record_progress([(started[0], {"current": 1, "total": 2, "message": "", "updated_at": clock.now()})])
    storage.complete_many([(claim, None) for claim in started[1:3]])
    storage.fail(started[3], "boom", retryable=False)
    storage.release(claims[4:5])
    clock.advance(3600)  # every lease expired, every window past
    storage.recover_expired(100)
    storage.expire_overdue(100)
    storage.mark_limited({"demo.noop_rated"}, 100)
    assert service.purge_finished(clock.now()) > 0
    service.purge_batches(clock.now())
    assert writes.outside == []
    assert {
        "INSERT INTO reliable_executor_unique_key",
        "INSERT INTO reliable_executor_dependency",
        "INSERT INTO reliable_executor_batch",
        "INSERT INTO reliable_executor_paused_queue",
        "DELETE FROM reliable_executor_paused_queue",
        "DELETE FROM reliable_executor_schedule",
        "DELETE FROM reliable_executor_task",
    } <= writes.seen, writes.seen
