"""Contract: cancel and manual retry on every database."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus, signals
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.contract_support import (
    HOOKS,
    LEASE,
    claim_and_start,
    claim_one,
    recording,
    run_claim,
    run_next,
)


# -- cancel -----------------------------------------------------------------------------------
def test_cancel_created_task(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="c")
    clock.advance(1)
    with recording(signals.task_cancelled) as cancelled:
        assert executor.cancel_task("c") is True
    info = executor.get_task("c")
    assert (info.status, info.finished_at, info.attempts) == (TaskStatus.CANCELLED, clock.now(), 0)
    assert info.cancel_requested is False
    assert [c["task_id"] for c in cancelled.calls] == ["c"]
    assert storage.claim("w1", ["default"], 10, LEASE) == []


def test_cancel_pending_task(executor, storage):
    executor.submit("demo.always_fails", None, task_id="p")
    assert run_next(executor) is TaskStatus.PENDING
    assert executor.cancel_task("p") is True
    info = executor.get_task("p")
    assert (info.status, info.attempts) == (TaskStatus.CANCELLED, 1)
    executor.clock.advance(3600)
    assert storage.claim("w1", ["default"], 10, LEASE) == []


def test_cancel_of_a_claimed_unstarted_task_wins_over_the_claim(executor, storage):
    executor.submit("contract.hook", None, task_id="held")
    ran = []
    HOOKS["held"] = ran.append
    claim = claim_one(storage)
    assert executor.cancel_task("held") is True
    assert executor.get_task("held").status is TaskStatus.CANCELLED
    assert run_claim(executor, claim) is None
    assert ran == []
    info = executor.get_task("held")
    assert (info.status, info.attempts) == (TaskStatus.CANCELLED, 0)


def test_cancel_running_sets_the_flag_only(executor, storage):
    executor.submit("demo.echo", None, task_id="r")
    started = claim_and_start(storage)
    with recording(signals.task_cancelled) as cancelled:
        assert executor.cancel_task("r") is True
    info = executor.get_task("r")
    assert (info.status, info.cancel_requested) == (TaskStatus.RUNNING, True)
    assert cancelled.calls == []  # not cancelled yet: the attempt is still running
    assert storage.heartbeat("w1", {"r": started.token}, LEASE)["r"][1] is True


def test_running_cancelled_attempt_that_fails_ends_cancelled(executor, storage):
    executor.submit("demo.echo", None, task_id="rf", retry_limit=5)
    started = claim_and_start(storage)
    executor.cancel_task("rf")
    with recording(signals.task_cancelled) as cancelled, recording(signals.task_retrying) as retry:
        transition = storage.fail(started, "stopped", retryable=True)
        executor.announcer.transition(transition)
    assert transition.status is TaskStatus.CANCELLED
    info = executor.get_task("rf")
    assert (info.status, info.last_error, info.attempts) == (TaskStatus.CANCELLED, "stopped", 1)
    assert info.finished_at is not None
    assert [c["task_id"] for c in cancelled.calls] == ["rf"]
    assert retry.calls == []
    executor.clock.advance(3600)
    assert storage.claim("w1", ["default"], 10, LEASE) == []


def test_running_cancelled_attempt_that_succeeds_is_completed(executor, storage):
    executor.submit("demo.echo", None, task_id="rs")
    started = claim_and_start(storage)
    executor.cancel_task("rs")
    assert storage.complete(started, "finished anyway").status is TaskStatus.COMPLETED
    info = executor.get_task("rs")
    assert (info.status, info.result) == (TaskStatus.COMPLETED, "finished anyway")


def test_is_cancelled_is_false_while_nobody_cancels(executor):
    executor.submit("contract.hook", None, task_id="calm")
    HOOKS["calm"] = lambda context: context.is_cancelled()
    assert run_next(executor) is TaskStatus.COMPLETED
    assert executor.get_task("calm").result is False


def test_handler_sees_is_cancelled_and_stops(executor):
    executor.submit("contract.hook", None, task_id="coop", retry_limit=5)
    seen = []

    def cooperative(context):
        executor.cancel_task(context.task_id)
        seen.append(context.is_cancelled())
        raise InterruptedError("stopping: cancelled")

    HOOKS["coop"] = cooperative
    with recording(signals.task_cancelled) as cancelled:
        assert run_next(executor) is TaskStatus.CANCELLED
    assert seen == [True]
    info = executor.get_task("coop")
    assert (info.status, info.attempts) == (TaskStatus.CANCELLED, 1)
    assert "stopping: cancelled" in info.last_error
    assert [c["task_id"] for c in cancelled.calls] == ["coop"]


def test_is_cancelled_once_the_task_is_no_longer_this_attempts(executor, storage):
    executor.submit("contract.hook", None, task_id="gone", max_duration_millis=1000)
    seen = []

    def outlived(context):
        executor.clock.advance(2)
        assert [t.task.task_id for t in storage.expire_overdue(10)] == ["gone"]
        seen.append(context.is_cancelled())
        return "too late"

    HOOKS["gone"] = outlived
    assert run_next(executor) is None  # the outcome was discarded: the task timed out meanwhile
    assert seen == [True]
    info = executor.get_task("gone")
    assert (info.status, info.result) == (TaskStatus.TIMEOUT, None)


@pytest.mark.parametrize(
    "make",
    ["completed", "failed", "cancelled", "timeout", "error"],
)
def test_cancel_of_a_terminal_task_is_false(executor, storage, clock, make):
    before = _terminal_task(executor, storage, clock, make)
    with recording(signals.task_cancelled) as cancelled:
        assert executor.cancel_task("t") is False
    assert executor.get_task("t") == before
    assert cancelled.calls == []


def test_cancel_of_an_unknown_task_is_false(executor):
    assert executor.cancel_task("nobody") is False


def _terminal_task(executor, storage, clock, make: str):
    """Task "t" in the terminal status ``make``."""
    if make == "error":
        service = ReliableExecutor(
            storage, clock=clock, settings=ExecutorSettings(ALLOW_UNKNOWN_TASKS=True)
        )
        service.submit("elsewhere.task", None, task_id="t")
        assert run_next(service) is TaskStatus.ERROR
    elif make == "timeout":
        executor.submit("demo.echo", None, task_id="t", max_duration_millis=1000)
        clock.advance(1)
        assert len(storage.expire_overdue(10)) == 1
    elif make == "cancelled":
        executor.submit("demo.echo", None, task_id="t")
        assert executor.cancel_task("t")
    elif make == "failed":
        executor.submit("demo.always_fails", None, task_id="t", retry_limit=0)
        assert run_next(executor) is TaskStatus.FAILED
    else:
        executor.submit("demo.echo", "r", task_id="t")
        assert run_next(executor) is TaskStatus.COMPLETED
    info = executor.get_task("t")
    assert info.status is TaskStatus(make.upper())
    return info


# -- manual retry -----------------------------------------------------------------------------
@pytest.mark.parametrize("make", ["failed", "cancelled", "timeout", "error"])
def test_retry_makes_a_finished_task_pending_due_now(executor, storage, clock, make):
    before = _terminal_task(executor, storage, clock, make)
    clock.advance(60)
    assert executor.retry_task("t") is True
    info = executor.get_task("t")
    assert info.status is TaskStatus.PENDING
    assert info.run_at == clock.now()
    assert (info.finished_at, info.result, info.cancel_requested) == (None, None, False)
    assert info.attempts == before.attempts
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == ["t"]
    assert executor.retry_task("t") is False  # already PENDING


def test_retry_gives_a_fresh_retry_budget_and_keeps_counting_attempts(executor, clock):
    executor.submit("demo.always_fails", None, task_id="b", retry_limit=1)
    assert run_next(executor) is TaskStatus.PENDING
    clock.advance(1)
    assert run_next(executor) is TaskStatus.FAILED
    assert executor.get_task("b").attempts == 2
    assert executor.retry_task("b")
    assert run_next(executor) is TaskStatus.PENDING  # budget reset: one retry left again
    clock.advance(1)
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("b")
    assert (info.status, info.attempts) == (TaskStatus.FAILED, 4)


def test_retry_gives_a_fresh_max_duration_clock(executor, storage, clock):
    executor.submit("demo.echo", "again", task_id="d", max_duration_millis=1000)
    clock.advance(1)
    assert len(storage.expire_overdue(10)) == 1
    clock.advance(3600)
    assert executor.retry_task("d")
    clock.advance(0.999)
    assert storage.expire_overdue(10) == []
    assert run_next(executor) is TaskStatus.COMPLETED
    # And the fresh deadline is enforced again from the retry on.
    storage_task = executor.get_task("d")
    assert storage_task.result == "again"
    executor.submit("demo.echo", None, task_id="d2", max_duration_millis=1000)
    clock.advance(1)
    storage.expire_overdue(10)
    assert executor.retry_task("d2")
    clock.advance(1)
    assert [t.task.task_id for t in storage.expire_overdue(10)] == ["d2"]


def test_retry_of_a_cancelled_running_task_clears_the_flag(executor, storage):
    executor.submit("demo.echo", "second life", task_id="cr")
    started = claim_and_start(storage)
    executor.cancel_task("cr")
    assert storage.fail(started, "stopped", retryable=True).status is TaskStatus.CANCELLED
    assert executor.retry_task("cr")
    assert executor.get_task("cr").cancel_requested is False
    assert run_next(executor) is TaskStatus.COMPLETED
    info = executor.get_task("cr")
    assert (info.result, info.attempts) == ("second life", 2)


def test_retry_of_completed_running_or_waiting_tasks_is_false(executor, storage):
    executor.submit("demo.echo", "done", task_id="done")
    assert run_next(executor) is TaskStatus.COMPLETED
    executor.submit("demo.always_fails", None, task_id="pending")
    assert run_next(executor) is TaskStatus.PENDING
    executor.submit("demo.echo", None, task_id="running")
    claim_and_start(storage)
    executor.submit("demo.echo", None, task_id="created")
    before = {t.task_id: t for t in executor.list_tasks()}
    assert {t.task_id: t.status.value for t in before.values()} == {
        "done": "COMPLETED",
        "pending": "PENDING",
        "running": "RUNNING",
        "created": "CREATED",
    }
    for task_id in ("done", "running", "created", "pending", "unknown"):
        assert executor.retry_task(task_id) is False, task_id
    assert {t.task_id: t for t in executor.list_tasks()} == before


def test_retried_task_is_claimable_by_priority_like_any_other(executor, storage, clock):
    executor.submit("demo.always_fails", None, task_id="old", retry_limit=0, priority=5)
    assert run_next(executor) is TaskStatus.FAILED
    clock.advance(1)
    executor.submit("demo.echo", None, task_id="new", priority=0)
    assert executor.retry_task("old")
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == ["old", "new"]


def test_retry_announces_nothing_but_later_outcomes_are_announced(executor, clock):
    executor.submit("demo.always_fails", None, task_id="sig", retry_limit=0)
    assert run_next(executor) is TaskStatus.FAILED
    with recording(signals.task_started) as started, recording(signals.task_failed) as failed:
        assert executor.retry_task("sig")
        assert started.calls == []
        clock.advance(1)
        assert run_next(executor) is TaskStatus.FAILED
    assert [c["attempt"] for c in started.calls] == [2]
    assert [c["status"] for c in failed.calls] == [TaskStatus.FAILED]


# -- stale claims and attempts still running --------------------------------------------------
def test_a_claim_taken_before_cancel_and_retry_cannot_start_the_task(executor, storage):
    """A claims, the task is cancelled and retried, A's start comes late: refused (it would run
    beside B's claim). B claims, starts and completes it; A's heartbeat renews nothing."""
    executor.submit("demo.echo", "once", task_id="cr2")
    stale = claim_one(storage, "A")
    assert executor.cancel_task("cr2") is True
    assert executor.retry_task("cr2") is True
    assert storage.start(stale, LEASE) is None
    assert storage.heartbeat("A", {"cr2": stale.token}, LEASE) == {}
    info = executor.get_task("cr2")
    assert (info.status, info.attempts) == (TaskStatus.PENDING, 0)
    fresh = claim_one(storage, "B")
    started = storage.start(fresh, LEASE)
    assert started is not None
    assert storage.start(stale, LEASE) is None
    assert storage.complete(started, "by B").status is TaskStatus.COMPLETED
    info = executor.get_task("cr2")
    assert (info.status, info.result, info.attempts, info.worker_id) == (
        TaskStatus.COMPLETED,
        "by B",
        1,
        "B",
    )


def _timed_out_while_running(executor, storage, clock, task_id="slow"):
    """Task ``task_id`` started by w1, then timed out by the master while its handler runs."""
    executor.submit("demo.echo", "late", task_id=task_id, max_duration_millis=1000)
    started = claim_and_start(storage, "w1")
    clock.advance(2)
    assert [t.task.task_id for t in storage.expire_overdue(10)] == [task_id]
    assert executor.get_task(task_id).status is TaskStatus.TIMEOUT
    return started


def test_retry_waits_while_the_handler_of_a_timed_out_attempt_runs(executor, storage, clock):
    started = _timed_out_while_running(executor, storage, clock)
    for _ in range(3):  # the holder's heartbeat keeps its lease, and tells it to stop
        clock.advance(LEASE / 2)
        assert storage.heartbeat("w1", {"slow": started.token}, LEASE) == {
            "slow": (started.token, True)
        }
        assert storage.recover_expired(100) == []
        assert executor.retry_task("slow") is False
        reason = executor.retry_task_or_reason("slow")
        assert "previous attempt is still running on worker w1" in reason
        assert executor.get_task("slow").status is TaskStatus.TIMEOUT
    assert storage.claim("w2", ["default"], 10, LEASE) == []
    # The handler returns: its outcome is discarded; without renewals the lease lapses.
    assert storage.complete(started, "too late") is None
    clock.advance(LEASE + 1)
    assert storage.recover_expired(100) == []  # nothing to record: it already ended TIMEOUT
    assert executor.retry_task_or_reason("slow") is None
    assert storage.heartbeat("w1", {"slow": started.token}, LEASE) == {}
    again = claim_and_start(storage, "w2")
    assert storage.complete(again, "second").status is TaskStatus.COMPLETED
    info = executor.get_task("slow")
    assert (info.status, info.result, info.attempts) == (TaskStatus.COMPLETED, "second", 2)


def test_max_concurrency_counts_a_timed_out_attempt_still_running(executor, storage, clock):
    started = _timed_out_while_running(executor, storage, clock)
    executor.submit("demo.echo", "next", task_id="next")
    caps = {"demo.echo": 1}
    assert storage.claim("w2", ["default"], 10, LEASE, name_limits=caps) == []
    clock.advance(LEASE / 2)
    assert "slow" in storage.heartbeat("w1", {"slow": started.token}, LEASE)
    assert storage.claim("w2", ["default"], 10, LEASE, name_limits=caps) == []
    clock.advance(LEASE + 1)  # the holder stopped renewing: the slot is free again
    storage.recover_expired(100)
    claims = storage.claim("w2", ["default"], 10, LEASE, name_limits=caps)
    assert [c.task_id for c in claims] == ["next"]
