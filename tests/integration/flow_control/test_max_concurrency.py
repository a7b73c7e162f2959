"""``max_concurrency``: a cap on the tasks of one name held (claimed, started or not) at once
across every worker, enforced by the storage at claim time on all four backends (real servers,
real connections, no mocks)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from django_reliable_executor import TaskStatus, reliable_task_handler
from django_reliable_executor.core.records import Claim
from django_reliable_executor.exceptions import HandlerRegistrationError
from django_reliable_executor.registry import get_handler, name_limits, unregister
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.base import TaskStorage
from tests.conftest import db_params, require
from tests.support.contract_support import LEASE, at_once, new_task
from tests.support.processes import FAST, Backend, peak_overlap, service_for, wait_until

CAPPED = "demo.echo"
OTHER = "demo.noop"


def consistent(storage: TaskStorage) -> None:
    """On Redis, every index (held counts and parked sets included) agrees with the tasks."""
    from django_reliable_executor.storage.redis import RedisStorage

    if isinstance(storage, RedisStorage):
        from tests.support.redis_support import assert_consistent

        assert_consistent(storage)


def claim(
    storage: TaskStorage, cap: int, worker: str = "w1", limit: int = 10, name: str = CAPPED
) -> list[Claim]:
    claims = storage.claim(worker, ["default"], limit, LEASE, name_limits={name: cap})
    consistent(storage)
    return claims


def names(claims: list[Claim]) -> list[str]:
    return sorted(c.task.task_name for c in claims)


# -- the decorator ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_a_bad_max_concurrency_is_refused(value):
    with pytest.raises(HandlerRegistrationError) as excinfo:

        @reliable_task_handler(name="tests.bad_cap", max_concurrency=value)
        def bad() -> None: ...

    assert "max_concurrency must be an integer >= 1" in str(excinfo.value)
    assert "tests.bad_cap" in str(excinfo.value)
    assert get_handler("tests.bad_cap") is None


def test_max_concurrency_is_stored_and_listed():
    @reliable_task_handler(name="tests.capped_three", max_concurrency=3)
    def capped_three() -> None: ...

    try:
        assert capped_three.max_concurrency == 3
        assert name_limits()["tests.capped_three"] == 3
        assert name_limits()["demo.capped"] == 2
        assert "demo.echo" not in name_limits()
    finally:
        unregister("tests.capped_three")


# -- the storage contract ---------------------------------------------------------------------


def test_the_cap_holds_until_a_slot_frees(executor, storage, clock):
    ids = []
    for i in range(10):
        ids.append(executor.submit(CAPPED, i, task_id=f"t{i:02d}", retry_interval=0).task_id)
        clock.advance(0.001)  # distinct run_at: the claim order is exact
    first = claim(storage, 2)
    assert [c.task_id for c in first] == ids[:2]  # the claim order is kept
    assert claim(storage, 2, worker="w2") == []
    assert claim(storage, 2) == []

    # completed: one slot
    a = storage.start(first[0], LEASE)
    assert a is not None and storage.complete(a, "ok") is not None
    [c] = claim(storage, 2, worker="w2")
    assert claim(storage, 2) == []

    # failed (retried at once: it waits again, behind the others): one slot
    b = storage.start(first[1], LEASE)
    assert b is not None
    assert storage.fail(b, "boom", retryable=True).status is TaskStatus.PENDING
    [d] = claim(storage, 2)
    assert claim(storage, 2) == []

    # released unstarted: one slot, and the released task is first in line again
    assert storage.release([c]) == 1
    [c_again] = claim(storage, 2)
    assert c_again.task_id == c.task_id
    assert claim(storage, 2) == []

    # both leases lost: recovery frees both slots
    clock.advance(LEASE + 1)
    storage.recover_expired(100)
    consistent(storage)
    again = claim(storage, 2, worker="w3")
    assert len(again) == 2
    assert {x.task_id for x in again} == {c_again.task_id, d.task_id}
    assert claim(storage, 2) == []
    # Without name_limits (a caller that knows no cap), the name is not capped.
    assert len(storage.claim("w4", ["default"], 3, LEASE)) == 3
    consistent(storage)


def test_each_name_has_its_own_cap(executor, storage):
    for i in range(5):
        executor.submit(CAPPED, i)
        executor.submit(OTHER, None)
    claims = storage.claim("w1", ["default"], 10, LEASE, name_limits={CAPPED: 1, OTHER: 3})
    assert names(claims) == [CAPPED] + [OTHER] * 3
    assert storage.claim("w1", ["default"], 10, LEASE, name_limits={CAPPED: 1, OTHER: 3}) == []
    consistent(storage)


def test_uncapped_names_flow_past_a_capped_backlog(executor, storage, clock):
    """A thousand due tasks of a capped name, older and of higher priority, do not hold up
    the uncapped ones behind them, nor do they wait in any worker's memory."""
    now = clock.now()
    backlog = [
        dataclasses.replace(new_task(f"cap-{i:04d}", CAPPED, i, now), priority=5)
        for i in range(1000)
    ]
    storage.enqueue(backlog)
    clock.advance(1)
    others = [executor.submit(OTHER, None).task_id for _ in range(5)]
    claims = claim(storage, 2)
    assert names(claims) == [CAPPED] * 2 + [OTHER] * 5
    assert [c.task_id for c in claims[:2]] == ["cap-0000", "cap-0001"]
    assert {c.task_id for c in claims[2:]} == set(others)
    assert claim(storage, 2) == []
    late = executor.submit(OTHER, None).task_id
    assert [c.task_id for c in claim(storage, 2, worker="w2")] == [late]
    listed = executor.list_tasks(status=TaskStatus.CREATED, task_name=CAPPED, limit=2000)
    assert len([t for t in listed if t.worker_id is None]) == 998  # waiting, nobody's
    # A slot frees: the next of the backlog, in order, is the one claimed.
    started = storage.start(claims[0], LEASE)
    assert started is not None and storage.complete(started, None) is not None
    assert [c.task_id for c in claim(storage, 2, worker="w3")] == ["cap-0002"]


def test_concurrent_claims_never_exceed_the_cap(executor, make_storage, clock):
    """Workers with their own connections claim and finish at once: never more than the cap
    are held, and every task is run."""
    cap, total, threads_n = 3, 40, 6
    for i in range(total):
        executor.submit(CAPPED, i)
    lock = threading.Lock()
    held = {"now": 0, "peak": 0, "done": 0}
    storages = [make_storage(clock) for _ in range(threads_n)]

    def work(storage: TaskStorage, worker: str) -> None:
        idle = 0
        while idle < 200:
            with lock:
                if held["done"] >= total:
                    return
            claims = storage.claim(worker, ["default"], 5, LEASE, name_limits={CAPPED: cap})
            if not claims:
                idle += 1
                continue
            with lock:
                held["now"] += len(claims)
                held["peak"] = max(held["peak"], held["now"])
            for one in claims:
                with lock:
                    held["now"] -= 1  # before the write: the count never runs ahead
                started = storage.start(one, LEASE)
                assert started is not None
                assert storage.complete(started, worker) is not None
                with lock:
                    held["done"] += 1

    at_once(storages, work)
    assert held["done"] == total
    assert 1 <= held["peak"] <= cap
    assert executor.count_by_status()[TaskStatus.COMPLETED] == total
    consistent(storages[0])


def test_a_waiting_capped_task_can_be_cancelled_expired_and_purged(executor, storage, clock):
    for i, (task_id, duration) in enumerate(
        [("held", None), ("cancel-me", None), ("expire-me", 1000), ("last", None)]
    ):
        executor.submit(CAPPED, i, task_id=task_id, max_duration_millis=duration)
        clock.advance(0.001)  # distinct run_at: the claim order is exact
    [first] = claim(storage, 1)
    assert first.task_id == "held"
    assert claim(storage, 1) == []  # the others wait (on Redis: parked)
    assert executor.cancel_task("cancel-me") is True
    assert executor.get_task("cancel-me").status is TaskStatus.CANCELLED
    consistent(storage)
    clock.advance(2)
    [expired] = storage.expire_overdue(100)
    assert expired.task.task_id == "expire-me"
    assert executor.get_task("expire-me").status is TaskStatus.TIMEOUT
    consistent(storage)
    clock.advance(10)
    assert storage.purge_finished(clock.now(), 100) == 2
    assert executor.get_task("cancel-me") is None
    consistent(storage)
    started = storage.start(first, LEASE)
    assert started is not None and storage.complete(started, None) is not None
    assert [c.task_id for c in claim(storage, 1)] == ["last"]
    # A cancelled claimed task frees its slot too.
    executor.submit(CAPPED, 5, task_id="next")
    assert claim(storage, 1) == []
    assert executor.cancel_task("last") is True
    assert [c.task_id for c in claim(storage, 1)] == ["next"]


def test_a_parked_task_comes_back_when_nothing_of_its_name_is_held(executor, storage):
    """A claim that knows no cap of the name (a cap removed) takes its waiting tasks, parked
    ones included; the promote chore leaves them consistent."""
    for i in range(3):
        executor.submit(CAPPED, i)
    [only] = claim(storage, 1)
    assert claim(storage, 1) == []
    assert storage.release([only]) == 1
    storage.promote_due(100)
    consistent(storage)
    assert len(storage.claim("w2", ["default"], 10, LEASE)) == 3
    consistent(storage)


# -- real processes ---------------------------------------------------------------------------


@pytest.mark.parametrize("alias", db_params(["postgres", "redis"]))
def test_two_worker_processes_never_overlap_beyond_the_cap(alias, key_prefix, workers):
    """demo.capped has max_concurrency=2: two runexecutor processes with room for many more
    never run more than two of it at once, while other work keeps flowing."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service: ReliableExecutor = service_for(backend)
    capped = [service.submit("demo.capped", {"sleep": 0.15}).task_id for _ in range(12)]
    others = [service.submit("demo.echo", i).task_id for i in range(20)]
    started = [
        workers.start(backend, "--burst", "--core-pool-size", "6", "--max-pool-size", "6")
        for _ in range(2)
    ]

    def finished() -> bool:
        return all(p.returncode is not None for p in started)

    wait_until(finished, 90, "the burst workers did not finish", logs=workers.logs)
    assert [p.returncode for p in started] == [0, 0], workers.logs()
    infos = [service.get_task(i) for i in capped + others]
    assert {i.status for i in infos} == {TaskStatus.COMPLETED}, workers.logs()
    results: list[dict[str, Any]] = [service.get_task(i).result for i in capped]
    intervals = [(r["started"], r["ended"]) for r in results]
    assert peak_overlap(intervals) <= 2, sorted(intervals)
    service.storage.close()


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres", "redis"]))
def test_a_killed_worker_s_capped_tasks_run_again_within_the_cap(alias, key_prefix, workers):
    """A worker is SIGKILLed while it runs two demo.capped tasks (max_concurrency=2, stored
    in their name's range of the claim index on the databases): the other worker recovers
    them once their leases lapse, runs every capped task, and the handlers' own records never
    show more than two at once; the other names' tasks flow meanwhile."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service: ReliableExecutor = service_for(backend)
    capped = [service.submit("demo.capped", {"sleep": 1.0}).task_id for _ in range(6)]
    first = workers.start(backend, **FAST)
    wait_until(
        lambda: service.count_by_status().get(TaskStatus.RUNNING, 0) == 2,
        30,
        "two capped tasks never ran at once",
        interval=0.01,
        logs=workers.logs,
    )
    running = {t.task_id for t in service.list_tasks(status=TaskStatus.RUNNING)}
    first.kill()
    others = [service.submit("demo.echo", i).task_id for i in range(10)]
    workers.start(backend, **FAST)

    def all_done() -> bool:
        return all(service.get_task(i).status is TaskStatus.COMPLETED for i in capped + others)

    wait_until(all_done, 60, "not every task completed after the kill", logs=workers.logs)
    results: list[dict[str, Any]] = [service.get_task(i).result for i in capped]
    intervals = [(r["started"], r["ended"]) for r in results]
    assert peak_overlap(intervals) <= 2, sorted(intervals)
    # The two killed attempts were counted, and run again by the survivor.
    for task_id in running:
        task = service.get_task(task_id)
        assert task.attempts >= 2, task
        assert task.result["pid"] != first.pid
    service.storage.close()
