"""Contract: lease recovery, fencing, heartbeats, the master lock, purging, concurrent claims."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connections, transaction

from django_reliable_executor import TaskStatus, TaskSubmitRequest, signals
from django_reliable_executor.master.chores import MasterChores
from django_reliable_executor.master.lock import MASTER_LOCK_NAME, MasterLock
from tests.conftest import db_params
from tests.support.contract_support import (
    LEASE,
    claim_and_start,
    claim_one,
    recording,
    run_claim,
    total,
)


# -- lease expiry -----------------------------------------------------------------------------
def test_unstarted_claim_returns_to_the_queue_without_an_attempt(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="u")
    claim = storage.claim("w1", ["default"], 1, 30)[0]
    clock.advance(30)
    assert storage.recover_expired(100) == []
    assert executor.get_task("u").worker_id == "w1"  # the lease is not over yet
    clock.advance(0.001)
    assert storage.recover_expired(100) == []  # nothing failed: no transition to announce
    info = executor.get_task("u")
    assert (info.status, info.attempts, info.worker_id) == (TaskStatus.CREATED, 0, None)
    assert info.last_error is None
    again = claim_one(storage, "w2")
    assert again.token != claim.token
    assert storage.start(claim, LEASE) is None  # the first worker woke up too late
    assert storage.start(again, LEASE) is not None
    assert executor.get_task("u").attempts == 1


def test_started_claim_counts_a_failed_attempt(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="s", retry_interval=5000)
    storage.start(storage.claim("w1", ["default"], 1, 30)[0], 30)
    clock.advance(30.001)
    with recording(signals.task_retrying) as retrying:
        transitions = storage.recover_expired(100)
        for transition in transitions:
            executor.announcer.transition(transition)
    assert [(t.task.task_id, t.previous, t.status) for t in transitions] == [
        ("s", TaskStatus.RUNNING, TaskStatus.PENDING)
    ]
    info = executor.get_task("s")
    assert (info.status, info.attempts) == (TaskStatus.PENDING, 1)
    assert info.run_at == clock.now() + dt.timedelta(seconds=5)
    assert "worker lost" in info.last_error
    assert "w1" in info.last_error
    assert [(c["task_id"], c["attempt"]) for c in retrying.calls] == [("s", 1)]
    assert storage.claim("w2", ["default"], 10, LEASE) == []
    clock.advance(5)
    assert claim_one(storage, "w2").task_id == "s"


def test_a_task_that_keeps_killing_its_worker_ends_failed(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="poison", retry_limit=2, retry_interval=1000)
    outcomes = []
    for worker in ("w1", "w2", "w3"):
        storage.start(storage.claim(worker, ["default"], 1, 10)[0], 10)
        clock.advance(11)  # the worker died: no heartbeat
        outcomes += [t.status for t in storage.recover_expired(100)]
        clock.advance(1)  # the retry interval
    assert outcomes == [TaskStatus.PENDING, TaskStatus.PENDING, TaskStatus.FAILED]
    info = executor.get_task("poison")
    assert (info.status, info.attempts) == (TaskStatus.FAILED, 3)
    assert "worker lost: w3" in info.last_error
    clock.advance(3600)
    assert storage.claim("w4", ["default"], 10, LEASE) == []
    assert storage.recover_expired(100) == []


def test_lost_worker_with_cancel_requested_ends_cancelled(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="lc")
    storage.start(storage.claim("w1", ["default"], 1, 10)[0], 10)
    executor.cancel_task("lc")
    clock.advance(11)
    [transition] = storage.recover_expired(100)
    assert transition.status is TaskStatus.CANCELLED
    assert executor.get_task("lc").status is TaskStatus.CANCELLED


def test_lost_worker_past_the_deadline_ends_timeout(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="lt", max_duration_millis=5000)
    storage.start(storage.claim("w1", ["default"], 1, 10)[0], 10)
    clock.advance(11)
    [transition] = storage.recover_expired(100)
    assert transition.status is TaskStatus.TIMEOUT
    assert executor.get_task("lt").status is TaskStatus.TIMEOUT


def test_recover_expired_respects_its_batch_limit(executor, storage, clock):
    for i in range(5):
        executor.submit("demo.echo", None, task_id=f"b-{i}")
    for claim in storage.claim("w1", ["default"], 10, 10):
        storage.start(claim, 10)
    clock.advance(11)
    assert len(storage.recover_expired(2)) == 2
    assert len(storage.recover_expired(10)) == 3
    assert executor.count_by_status()[TaskStatus.PENDING] == 5


def test_chores_round_recovers_and_announces(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="sch", retry_limit=0)
    storage.start(storage.claim("w1", ["default"], 1, 10)[0], 10)
    clock.advance(11)
    with recording(signals.task_failed) as failed:
        MasterChores(executor, retention_seconds=3600).run_once()
    assert executor.get_task("sch").status is TaskStatus.FAILED
    assert [(c["task_id"], c["status"]) for c in failed.calls] == [("sch", TaskStatus.FAILED)]


# -- fencing ----------------------------------------------------------------------------------
def test_stale_worker_cannot_overwrite_the_next_holders_outcome(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="f", retry_interval=1000)
    stale = claim_and_start(storage, "w1")
    clock.advance(LEASE + 1)
    assert [t.status for t in storage.recover_expired(100)] == [TaskStatus.PENDING]
    clock.advance(1)
    fresh = claim_and_start(storage, "w2")
    assert fresh.token != stale.token
    before = executor.get_task("f")
    assert storage.complete(stale, "stale result") is None
    assert storage.fail(stale, "stale failure", retryable=True) is None
    assert storage.fail(stale, "stale error", retryable=False, is_error=True) is None
    assert storage.expire_claim(stale) is None
    assert storage.release([stale]) == 0
    assert storage.heartbeat("w1", {"f": stale.token}, LEASE) == {}
    assert executor.get_task("f") == before
    assert (before.status, before.worker_id, before.attempts) == (TaskStatus.RUNNING, "w2", 2)
    assert storage.complete(fresh, "fresh result") is not None
    assert storage.complete(stale, "stale result") is None
    assert storage.fail(stale, "stale failure", retryable=True) is None
    info = executor.get_task("f")
    assert (info.status, info.result, info.attempts) == (TaskStatus.COMPLETED, "fresh result", 2)


def test_stale_unstarted_claim_is_not_run(executor, storage, clock):
    executor.submit("demo.echo", "x", task_id="su")
    stale = claim_one(storage, "w1")
    clock.advance(LEASE + 1)
    storage.recover_expired(100)
    fresh = claim_one(storage, "w2")
    with recording(signals.task_started) as started:
        assert run_claim(executor, stale) is None
        assert started.calls == []
        assert run_claim(executor, fresh) is TaskStatus.COMPLETED
    info = executor.get_task("su")
    assert (info.attempts, info.worker_id) == (1, "w2")


def test_fencing_holds_when_a_worker_id_is_reused(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="reuse")
    old = claim_and_start(storage, "same-worker")
    clock.advance(LEASE + 1)
    storage.recover_expired(100)
    clock.advance(10)
    new = claim_and_start(storage, "same-worker")
    assert storage.complete(old, "old") is None
    assert storage.heartbeat("same-worker", {"reuse": new.token}, LEASE) == {
        "reuse": (new.token, False)
    }
    assert storage.complete(new, "new") is not None
    assert executor.get_task("reuse").result == "new"


# -- heartbeat --------------------------------------------------------------------------------
def test_heartbeat_under_a_stale_token_renews_nothing(executor, storage, clock):
    """Two processes sharing a worker id: the one holding an old claim of the task must not
    keep the lease of the other's newer claim alive (it died: its task must be recovered)."""
    executor.submit("demo.echo", None, task_id="twin", retry_interval=0)
    old = claim_and_start(storage, "shared")
    clock.advance(LEASE + 1)
    assert [t.status for t in storage.recover_expired(100)] == [TaskStatus.PENDING]
    new = claim_and_start(storage, "shared")
    assert new.token != old.token
    for _ in range(3):
        clock.advance(LEASE / 2)
        assert storage.heartbeat("shared", {"twin": old.token}, LEASE) == {}
    # Only the stale heartbeat came: the newer claim's lease lapsed and is recovered.
    recovered = storage.recover_expired(100)
    assert [(t.task.task_id, t.status) for t in recovered] == [("twin", TaskStatus.PENDING)]
    assert "worker lost" in executor.get_task("twin").last_error


def test_heartbeat_extends_leases(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="waiting")
    executor.submit("demo.echo", None, task_id="running")
    claims = {c.task_id: c for c in storage.claim("w1", ["default"], 10, 10)}
    storage.start(claims["running"], 10)
    for _ in range(5):
        clock.advance(8)
        held = storage.heartbeat("w1", {t: c.token for t, c in claims.items()}, 10)
        assert held == {
            "waiting": (claims["waiting"].token, False),
            "running": (claims["running"].token, False),
        }
        assert storage.recover_expired(100) == []
    clock.advance(10.001)
    assert [t.task.task_id for t in storage.recover_expired(100)] == ["running"]
    assert executor.get_task("waiting").worker_id is None


@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_a_heartbeat_and_a_write_locking_its_rows_in_the_other_order_never_deadlock(
    executor, storage, clock, alias
):
    """PostgreSQL: another transaction (a start or a completion of this worker's, a cancel)
    locks row x2, then x1; the heartbeat meets x1 first. Renewing both in one statement, it
    held x1 while waiting for x2: a deadlock, one of the two aborted. It now skips the row
    locked and renews it alone afterwards, holding nothing else while it waits."""
    for task_id in ("x1", "x2"):
        executor.submit("demo.echo", None, task_id=task_id)
    claims = {c.task_id: storage.start(c, 10) for c in storage.claim("w1", ["default"], 10, 10)}
    tokens = {t: c.token for t, c in claims.items()}
    locked, errors = threading.Event(), []

    def write_in_the_other_order() -> None:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                lock = "SELECT 1 FROM reliable_executor_task WHERE task_id = %s FOR UPDATE"
                cursor.execute(lock, ["x2"])
                locked.set()
                time.sleep(1.0)  # the heartbeat is under way meanwhile
                cursor.execute(lock, ["x1"])
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            locked.set()
        finally:
            connections[alias].close()

    writer = threading.Thread(target=write_in_the_other_order)
    writer.start()
    try:
        assert locked.wait(10)
        clock.advance(8)
        held = storage.heartbeat("w1", tokens, 10)
    finally:
        writer.join(30)
    assert errors == []  # the writer was not chosen as a deadlock's victim either
    assert held == {"x1": (tokens["x1"], False), "x2": (tokens["x2"], False)}
    clock.advance(8)  # 16 s after the claim: both leases were renewed (to 18 s)
    assert storage.recover_expired(100) == []


def test_heartbeat_reports_lost_and_foreign_tasks(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="mine")
    executor.submit("demo.echo", None, task_id="lost")
    executor.submit("demo.echo", None, task_id="done")
    claims = {c.task_id: c for c in storage.claim("w1", ["default"], 10, 10)}
    storage.complete(storage.start(claims["done"], 10), None)
    clock.advance(11)
    assert storage.heartbeat("w1", {"mine": claims["mine"].token}, 10) == {
        "mine": (claims["mine"].token, False)
    }
    storage.recover_expired(100)  # "lost" was not renewed in time
    claim_one(storage, "w2")
    tokens = {t: c.token for t, c in claims.items()}
    held = storage.heartbeat("w1", {**tokens, "unknown": 1}, 10)
    assert set(held) == {"mine"}
    # Another worker's heartbeat neither reports nor extends w1's lease.
    assert storage.heartbeat("w2", {"mine": claims["mine"].token}, 1000) == {}
    clock.advance(10.001)
    storage.recover_expired(100)
    assert executor.get_task("mine").worker_id is None


# -- master lock ------------------------------------------------------------------------------
def test_master_lock_acquire_renew_expire_release(storage, clock):
    assert storage.lock_owner("master") is None
    assert storage.acquire_lock("master", "a", 10) is True
    assert storage.acquire_lock("master", "b", 10) is False
    assert storage.lock_owner("master") == "a"
    clock.advance(8)
    assert storage.acquire_lock("master", "a", 10) is True  # renewed until t=18
    clock.advance(8)
    assert storage.acquire_lock("master", "b", 10) is False
    assert storage.lock_owner("master") == "a"
    clock.advance(2.001)
    assert storage.lock_owner("master") is None  # expired
    assert storage.acquire_lock("master", "b", 10) is True
    assert storage.acquire_lock("master", "a", 10) is False
    storage.release_lock("master", "a")  # not the holder: nothing happens
    assert storage.lock_owner("master") == "b"
    storage.release_lock("master", "b")
    assert storage.lock_owner("master") is None
    assert storage.acquire_lock("master", "a", 10) is True
    assert storage.acquire_lock("other-lock", "b", 10) is True  # locks are independent


def test_master_lock_role_hands_over(storage, clock):
    first = MasterLock(storage, "w1", 10)
    second = MasterLock(storage, "w2", 10)
    assert first.hold() is True
    assert second.hold() is False
    assert storage.lock_owner(MASTER_LOCK_NAME) == "w1"
    first.release()
    assert first.is_master is False
    assert second.hold() is True
    assert storage.lock_owner(MASTER_LOCK_NAME) == "w2"
    clock.advance(11)  # w2 stops renewing: the lock expires
    assert MasterLock(storage, "w3", 10).hold() is True


def _contend_for_lock(make_storage, clock, owners: list[str]) -> list[str]:
    """Every owner tries to take the master lock at the same moment; returns the winners."""
    barrier = threading.Barrier(len(owners))
    won: list[str] = []
    errors: list[BaseException] = []

    def contend(owner: str) -> None:
        storage = make_storage(clock)
        try:
            barrier.wait(10)
            if storage.acquire_lock("master", owner, 10):
                won.append(owner)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contend, args=(owner,)) for owner in owners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return won


def test_concurrent_lock_acquisition_has_one_winner(storage, make_storage, clock):
    [first] = _contend_for_lock(make_storage, clock, [f"a{i}" for i in range(6)])
    assert storage.lock_owner("master") == first
    clock.advance(10.001)  # expired: the next race has one winner again
    [second] = _contend_for_lock(make_storage, clock, [f"b{i}" for i in range(6)])
    assert storage.lock_owner("master") == second


# -- purging ----------------------------------------------------------------------------------
def test_purge_finished_respects_retention_and_never_deletes_live_tasks(executor, storage, clock):
    start = clock.now()
    executor.submit("demo.echo", None, task_id="completed-early")
    storage.complete(claim_and_start(storage), "x")
    executor.submit("demo.echo", None, task_id="created-early")
    executor.submit("demo.echo", None, task_id="running-early", queue="busy")
    claim_and_start(storage, queue="busy")
    executor.submit("demo.always_fails", None, task_id="pending-early", queue="retry")
    storage.fail(claim_and_start(storage, queue="retry"), "boom", retryable=True)
    clock.advance(10)
    executor.submit("demo.echo", None, task_id="cancelled-later")
    executor.cancel_task("cancelled-later")
    clock.advance(10)
    executor.submit("demo.always_fails", None, task_id="retried", retry_limit=0, queue="r")
    storage.fail(claim_and_start(storage, queue="r"), "boom", retryable=True)
    assert executor.retry_task("retried")  # waiting again: no longer finished
    clock.advance(1000)

    def ids() -> set[str]:
        return {t.task_id for t in executor.list_tasks()}

    assert storage.purge_finished(start, 100) == 0
    assert storage.purge_finished(start + dt.timedelta(seconds=5), 100) == 1
    assert "completed-early" not in ids()
    assert storage.purge_finished(clock.now() + dt.timedelta(days=1), 100) == 1
    assert ids() == {"created-early", "running-early", "pending-early", "retried"}
    statuses = {t.status for t in executor.list_tasks()}
    assert statuses == {TaskStatus.CREATED, TaskStatus.RUNNING, TaskStatus.PENDING}


def test_purge_finished_respects_its_batch_limit(executor, clock):
    for i in range(5):
        executor.submit("demo.echo", None, task_id=f"x-{i}")
        executor.cancel_task(f"x-{i}")
    clock.advance(1)
    storage = executor.storage
    assert storage.purge_finished(clock.now(), 2) == 2
    assert storage.purge_finished(clock.now(), 10) == 3
    assert total(executor.count_by_status()) == 0


def test_chores_purge_past_retention(executor, clock):
    executor.submit("demo.echo", None, task_id="old")
    executor.cancel_task("old")
    clock.advance(100)
    executor.submit("demo.echo", None, task_id="young")
    executor.cancel_task("young")
    executor.submit("demo.echo", None, task_id="live")
    clock.advance(60)
    MasterChores(executor, retention_seconds=120).run_once()
    assert {t.task_id for t in executor.list_tasks()} == {"young", "live"}


# -- concurrency ------------------------------------------------------------------------------
def test_concurrent_claims_never_hand_out_a_task_twice(executor, make_storage, clock):
    count, threads_n = 120, 6
    executor.submit_many([_request(i) for i in range(count)])
    taken: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def claimer(worker: str) -> None:
        storage = make_storage(clock)
        mine: list[str] = []
        try:
            barrier.wait(10)
            while True:
                claims = storage.claim(worker, ["default"], 7, LEASE)
                if not claims:
                    break
                mine += [c.task_id for c in claims]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            taken[worker] = mine
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    all_taken = [task_id for ids in taken.values() for task_id in ids]
    assert len(all_taken) == len(set(all_taken)) == count
    owners = {t.task_id: t.worker_id for t in executor.list_tasks(limit=count)}
    for worker, ids in taken.items():
        assert all(owners[task_id] == worker for task_id in ids)


def test_concurrent_cancel_and_start_agree(executor, make_storage, clock):
    """Cancel and start race on many tasks: each ends either started or cancelled, never both."""
    count = 40
    executor.submit_many([_request(i) for i in range(count)])
    storage = executor.storage
    claims = storage.claim("w1", ["default"], count, LEASE)
    started: list[str] = []
    cancelled: list[str] = []

    def starter() -> None:
        try:
            worker_storage = make_storage(clock)
            started.extend(c.task_id for c in claims if worker_storage.start(c, LEASE))
        finally:
            connections.close_all()

    def canceller() -> None:
        try:
            cancelled.extend(
                c.task_id for c in reversed(claims) if not storage.cancel(c.task_id).requested_only
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=starter), threading.Thread(target=canceller)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    statuses = {t.task_id: t.status for t in executor.list_tasks(limit=count)}
    assert set(started).isdisjoint(cancelled)
    assert sorted(started + cancelled) == sorted(statuses)
    assert all(statuses[i] is TaskStatus.RUNNING for i in started)
    assert all(statuses[i] is TaskStatus.CANCELLED for i in cancelled)


def _request(i: int) -> TaskSubmitRequest:
    return TaskSubmitRequest("demo.echo", {"i": i}, task_id=f"c-{i:04d}")


def test_dead_workers_are_forgotten_live_ones_kept(storage, clock):
    storage.worker_seen("dead", {"hostname": "h", "pid": 1, "queues": ["default"]})
    clock.advance(300)
    storage.worker_seen("alive", {"hostname": "h", "pid": 2, "queues": ["default"]})
    assert storage.forget_workers(clock.now() - dt.timedelta(seconds=120)) == 1
    [alive] = storage.workers()
    assert (alive.worker_id, alive.hostname, alive.pid, alive.queues) == (
        "alive",
        "h",
        2,
        ("default",),
    )
    assert alive.started_at == alive.last_seen_at == clock.now()
    clock.advance(10)
    storage.worker_seen("alive", {"hostname": "h", "pid": 2, "queues": ["default"]})
    [again] = storage.workers()
    assert (again.started_at, again.last_seen_at) == (alive.started_at, clock.now())
    storage.worker_gone("alive")
    assert storage.workers() == []


def test_worker_last_seen_is_its_last_heartbeat_until_it_is_gone(storage, clock):
    assert storage.worker_last_seen("w1") is None
    storage.worker_seen("w1", {"hostname": "h", "pid": 1, "queues": ["default"]})
    first = clock.now()
    clock.advance(7.5)
    storage.worker_seen("w2", {"hostname": "h", "pid": 2, "queues": ["default"]})
    assert storage.worker_last_seen("w1") == first
    storage.worker_seen("w1", {"hostname": "h", "pid": 1, "queues": ["default"]})
    assert storage.worker_last_seen("w1") == clock.now()
    assert storage.worker_last_seen("w3") is None
    storage.worker_gone("w1")
    assert storage.worker_last_seen("w1") is None
    assert storage.worker_last_seen("w2") == clock.now()


def test_purge_finished_of_a_status_that_is_not_terminal_deletes_nothing(executor, clock):
    """Only finished tasks are ever purged, whatever statuses the caller passes."""
    executor.submit("demo.echo", None, task_id="waiting")
    executor.submit("demo.echo", None, task_id="cancelled")
    executor.cancel_task("cancelled")
    clock.advance(1)
    storage = executor.storage
    live = frozenset({TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING})
    assert storage.purge_finished(clock.now(), 100, live) == 0
    assert storage.purge_finished(clock.now(), 100, live | {TaskStatus.CANCELLED}) == 1
    assert [t.task_id for t in executor.list_tasks()] == ["waiting"]
