"""Contract: state machine, backoff, deadlines, ERROR, signals and claim order on every database."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import threading
import time

import pytest
from django.db import connections

from django_reliable_executor import TaskStatus, TaskSubmitRequest, signals
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.worker.runner import TaskRunner
from django_reliable_executor.worker.worker import Worker, WorkerOptions
from tests.support.contract_support import (
    GATE,
    HOOKS,
    LEASE,
    claim_and_start,
    claim_one,
    connected,
    new_task,
    raising,
    recording,
    run_claim,
    run_next,
    task_runner,
)

ms = dt.timedelta(milliseconds=1)
ALL_SIGNALS = (
    signals.task_submitted,
    signals.task_started,
    signals.task_completed,
    signals.task_retrying,
    signals.task_failed,
    signals.task_cancelled,
)


# -- the happy path ---------------------------------------------------------------------------
def test_storage_transitions_created_running_completed(executor, storage, clock):
    executor.submit("demo.echo", {"x": 1}, task_id="t")
    claim = claim_one(storage, "w1")
    assert claim.task.status is TaskStatus.CREATED  # claimed, not started
    assert executor.get_task("t").worker_id == "w1"
    assert executor.get_task("t").attempts == 0
    clock.advance(1)
    started = storage.start(claim, LEASE)
    assert started.task.status is TaskStatus.RUNNING
    running = executor.get_task("t")
    assert (running.status, running.attempts, running.started_at) == (
        TaskStatus.RUNNING,
        1,
        clock.now(),
    )
    clock.advance(1)
    transition = storage.complete(started, {"ok": True})
    assert transition.previous is TaskStatus.RUNNING
    assert transition.status is TaskStatus.COMPLETED
    done = executor.get_task("t")
    assert (done.status, done.result, done.finished_at) == (
        TaskStatus.COMPLETED,
        {"ok": True},
        clock.now(),
    )
    assert done.attempts == 1
    assert done.is_terminal


def test_runner_completes_and_announces(executor):
    executor.submit("demo.echo", {"x": [1, 2]}, task_id="r")
    with recording(signals.task_started) as started, recording(signals.task_completed) as done:
        assert run_next(executor) is TaskStatus.COMPLETED
    info = executor.get_task("r")
    assert (info.status, info.result, info.attempts) == (TaskStatus.COMPLETED, {"x": [1, 2]}, 1)
    assert started.calls == [
        {"sender": ReliableExecutor, "task_id": "r", "task_name": "demo.echo", "attempt": 1}
    ]
    assert done.calls == [
        {
            "sender": ReliableExecutor,
            "task_id": "r",
            "task_name": "demo.echo",
            "result": {"x": [1, 2]},
        }
    ]


def test_runner_converts_the_parameter_to_param_type(executor):
    executor.submit("demo.process_order", {"order_id": 5, "amount": 2.5}, task_id="o")
    assert run_next(executor) is TaskStatus.COMPLETED
    assert executor.get_task("o").result == {"order_id": 5, "charged": 2.5, "currency": "EUR"}


def test_transitions_are_compare_and_set(executor, storage):
    executor.submit("demo.echo", None, task_id="cas")
    claim = claim_one(storage)
    started = storage.start(claim, LEASE)
    assert storage.start(claim, LEASE) is None  # already RUNNING
    assert storage.complete(started, 1) is not None
    assert storage.complete(started, 2) is None
    assert storage.fail(started, "late", retryable=True) is None
    assert storage.fail(started, "late", retryable=False, is_error=True) is None
    assert storage.release([claim]) == 0
    info = executor.get_task("cas")
    assert (info.status, info.result, info.last_error, info.attempts) == (
        TaskStatus.COMPLETED,
        1,
        None,
        1,
    )


def test_start_many_starts_only_what_is_still_held(executor, storage):
    for i in range(4):
        executor.submit("demo.echo", None, task_id=f"sm-{i}")
    claims = sorted(storage.claim("w1", ["default"], 10, LEASE), key=lambda c: c.task_id)
    assert storage.start_many([], LEASE) == []
    both = storage.start_many(claims[:2], LEASE)
    assert [c.task.status for c in both] == [TaskStatus.RUNNING] * 2
    executor.cancel_task("sm-2")
    rest = storage.start_many(claims[2:], LEASE)
    assert rest[0] is None
    assert (rest[1].task_id, rest[1].task.attempts, rest[1].budget_attempts) == ("sm-3", 1, 1)
    statuses = [executor.get_task(c.task_id).status for c in claims]
    assert statuses == [TaskStatus.RUNNING] * 2 + [TaskStatus.CANCELLED, TaskStatus.RUNNING]


def test_complete_many_stores_each_result_exactly(executor, storage):
    results = [{"a": [1, 2]}, 1, True, None, "text", [1.5, {"b": None}]]
    for i in range(len(results) + 1):
        executor.submit("demo.echo", None, task_id=f"cm-{i}")
    claims = sorted(storage.claim("w1", ["default"], 10, LEASE), key=lambda c: c.task_id)
    started = storage.start_many(claims, LEASE)
    stale = started[-1]
    storage.fail(stale, "failed first", retryable=False)
    outcomes = [*zip(started[:-1], results, strict=True), (stale, "too late")]
    transitions = storage.complete_many(outcomes)
    assert [t.status for t in transitions[:-1]] == [TaskStatus.COMPLETED] * len(results)
    assert transitions[-1] is None
    for claim, result in zip(started[:-1], results, strict=True):
        stored = executor.get_task(claim.task_id).result
        assert stored == result
        assert type(stored) is type(result)
    assert executor.get_task(stale.task_id).status is TaskStatus.FAILED
    # All the same result takes the single-value path.
    for i in range(3):
        executor.submit("demo.echo", None, task_id=f"same-{i}")
    same = storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    assert all(storage.complete_many([(c, {"ok": 1}) for c in same]))
    assert {executor.get_task(c.task_id).result["ok"] for c in same} == {1}


def test_a_thousand_claims_start_and_complete_in_one_call(executor, storage):
    """A drain of a big batch claims, starts and completes 1,000 tasks per call: SQLite refuses
    an OR of (task_id, token) pairs that deep (an expression tree over 1,000 levels), so the
    storage splits it; every claim must still start once and store its own result."""
    executor.submit_many(
        [TaskSubmitRequest("demo.echo", None, task_id=f"k-{i:04d}") for i in range(1000)]
    )
    claims: list = []
    while len(claims) < 1000:
        got = storage.claim("w1", ["default"], 1000 - len(claims), LEASE)
        assert got, len(claims)
        claims += got
    started = storage.start_many(claims, LEASE)
    assert all(c is not None and c.task.status is TaskStatus.RUNNING for c in started)
    assert len({c.task_id for c in started}) == 1000
    # Different results take the CASE path (one WHEN per row), chunked the same way.
    transitions = storage.complete_many([(c, {"i": c.task_id}) for c in started])
    assert all(t is not None and t.status is TaskStatus.COMPLETED for t in transitions)
    done = executor.list_tasks(status="COMPLETED", limit=1000)
    assert len(done) == 1000
    assert all(t.result == {"i": t.task_id} and t.attempts == 1 for t in done)


def test_a_runner_without_its_writer_runs_nothing(executor, storage):
    """Completions have one path, the CompletionWriter the worker starts: a runner without one
    refuses before starting the task, which stays unstarted for the next claim."""
    executor.submit("demo.echo", None, task_id="nw")
    claim = claim_one(storage)
    with (
        recording(signals.task_started) as started,
        pytest.raises(RuntimeError, match="start_writer"),
    ):
        TaskRunner(executor, LEASE).run(claim)
    assert started.calls == []
    info = executor.get_task("nw")
    assert (info.attempts, info.started_at) == (0, None)


def test_one_runner_shared_by_many_threads(executor, alias):
    """Pool threads share one TaskRunner; its batched starts and completions stay exact."""
    count = 24
    for i in range(count):
        executor.submit("demo.echo", {"i": i}, task_id=f"p-{i:02d}")
    executor.submit("demo.always_fails", None, task_id="p-fail", retry_limit=0)
    claims = executor.storage.claim("w1", ["default"], 100, LEASE)
    outcomes: dict[str, TaskStatus | None] = {}
    errors: list[BaseException] = []

    def work(runner, mine) -> None:
        try:
            for claim in mine:
                outcomes[claim.task_id] = runner.run(claim)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    with (
        recording(signals.task_started) as started,
        recording(signals.task_completed) as done,
        task_runner(executor) as runner,  # its writer has written every completion at the end
    ):
        threads = [threading.Thread(target=work, args=(runner, claims[i::8])) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert outcomes.pop("p-fail") is TaskStatus.FAILED
    assert set(outcomes.values()) == {TaskStatus.COMPLETED}
    assert len(outcomes) == count
    for i in range(count):
        info = executor.get_task(f"p-{i:02d}")
        assert (info.status, info.result, info.attempts) == (TaskStatus.COMPLETED, {"i": i}, 1)
    assert sorted(c["task_id"] for c in started.calls) == sorted(c.task_id for c in claims)
    assert len(done.calls) == count


# -- retries and backoff ----------------------------------------------------------------------
def test_retryable_failure_goes_pending_after_fixed_backoff(executor, clock):
    executor.submit("demo.always_fails", None, task_id="f", retry_limit=2)
    with recording(signals.task_retrying) as retrying:
        assert run_next(executor) is TaskStatus.PENDING
    info = executor.get_task("f")
    assert info.status is TaskStatus.PENDING
    assert info.attempts == 1
    assert info.run_at == clock.now() + 100 * ms  # the handler's retry_interval
    assert "RuntimeError: this task always fails" in info.last_error
    assert "Traceback" in info.last_error
    assert info.finished_at is None
    [call] = retrying.calls
    assert call == {
        "sender": ReliableExecutor,
        "task_id": "f",
        "task_name": "demo.always_fails",
        "attempt": 1,
        "error": info.last_error,
        "next_run_at": info.run_at,
    }


def test_pending_is_not_claimable_until_due(executor, storage, clock):
    executor.submit("demo.always_fails", None, task_id="p", retry_interval=5000)
    run_next(executor)
    assert storage.claim("w1", ["default"], 10, LEASE) == []
    clock.advance(4.999)
    assert storage.claim("w1", ["default"], 10, LEASE) == []
    clock.advance(0.001)
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == ["p"]


def test_delayed_task_is_not_claimable_until_due(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="later", delay_millis=3000)
    executor.submit("demo.echo", None, task_id="at", run_at=clock.now() + dt.timedelta(seconds=9))
    assert storage.claim("w1", ["default"], 10, LEASE) == []
    clock.advance(3)
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == ["later"]
    clock.advance(6)
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == ["at"]


def test_retries_exhausted_ends_failed(executor, clock):
    executor.submit("demo.always_fails", None, task_id="x", retry_limit=2)
    with recording(signals.task_retrying) as retrying, recording(signals.task_failed) as failed:
        outcomes = []
        for _ in range(3):
            outcomes.append(run_next(executor))
            clock.advance(1)
    assert outcomes == [TaskStatus.PENDING, TaskStatus.PENDING, TaskStatus.FAILED]
    info = executor.get_task("x")
    assert (info.status, info.attempts) == (TaskStatus.FAILED, 3)
    assert info.finished_at == clock.now() - dt.timedelta(seconds=1)
    assert [c["attempt"] for c in retrying.calls] == [1, 2]
    [call] = failed.calls
    assert call == {
        "sender": ReliableExecutor,
        "task_id": "x",
        "task_name": "demo.always_fails",
        "status": TaskStatus.FAILED,
        "error": info.last_error,
    }
    assert executor.storage.claim("w1", ["default"], 10, LEASE) == []


def test_retry_limit_zero_fails_on_first_failure(executor):
    executor.submit("demo.always_fails", None, task_id="z", retry_limit=0)
    assert run_next(executor) is TaskStatus.FAILED
    assert executor.get_task("z").attempts == 1


def test_exception_outside_retry_on_fails_at_once(executor):
    executor.submit("demo.process_order", {"order_id": 1, "amount": -5}, task_id="declined")
    assert executor.get_task("declined").retry_limit == 3
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("declined")
    assert info.attempts == 1
    assert "PaymentDeclined" in info.last_error


def test_exception_inside_retry_on_is_retried(executor):
    executor.submit("demo.flaky", {"fail_times": 2}, task_id="fl", retry_limit=5)
    outcomes = []
    for _ in range(3):
        outcomes.append(run_next(executor))
        executor.clock.advance(1)
    assert outcomes == [TaskStatus.PENDING, TaskStatus.PENDING, TaskStatus.COMPLETED]
    info = executor.get_task("fl")
    assert (info.attempts, info.result) == (3, "succeeded on attempt 3")
    assert "ConnectionError" in info.last_error  # kept from the last failure


def test_a_non_json_result_fails_without_retry(executor):
    executor.submit("contract.bad_result", None, task_id="bad-result")
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("bad-result")
    assert "not JSON-serialisable" in info.last_error
    assert info.result is None


def test_a_result_no_storage_can_hold_fails_cleanly(executor):
    executor.submit("contract.hook", None, task_id="nul-result")
    HOOKS["nul-result"] = lambda context: {"text": "a\x00b"}
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("nul-result")
    assert "NUL" in info.last_error
    assert (info.result, info.attempts) == (None, 1)


def test_fixed_backoff_is_exact(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="fx", retry_limit=4, retry_interval=1500)
    for _ in range(4):
        started = claim_and_start(storage)
        assert storage.fail(started, "boom", retryable=True).status is TaskStatus.PENDING
        assert executor.get_task("fx").run_at - clock.now() == 1500 * ms
        clock.advance(1.5)
    started = claim_and_start(storage)
    assert storage.fail(started, "boom", retryable=True).status is TaskStatus.FAILED


@pytest.mark.parametrize(
    ("interval", "nominals"),
    [
        (1000, [1000, 2000, 4000, 8000, 16000]),
        (100000, [100000, 200000, 300000, 300000, 300000]),  # the storage's cap is 300 s
    ],
    ids=["doubling", "capped"],
)
def test_exponential_backoff_doubles_with_jitter_and_cap(
    executor, storage, clock, interval, nominals
):
    executor.submit(
        "demo.echo",
        None,
        task_id="exp",
        retry_limit=len(nominals),
        retry_interval=interval,
        retry_backoff="exponential",
    )
    with recording(signals.task_retrying) as retrying:
        for nominal in nominals:
            started = claim_and_start(storage)
            transition = storage.fail(started, "boom", retryable=True)
            executor.announcer.transition(transition)
            delay = (executor.get_task("exp").run_at - clock.now()) / ms
            assert nominal * 0.9 <= delay <= min(nominal * 1.1, 300000)
            assert transition.task.run_at == executor.get_task("exp").run_at
            clock.advance(delay / 1000)
    assert [c["attempt"] for c in retrying.calls] == [1, 2, 3, 4, 5]
    started = claim_and_start(storage)
    assert storage.fail(started, "boom", retryable=True).status is TaskStatus.FAILED


# -- max duration -----------------------------------------------------------------------------
def test_due_task_past_its_deadline_is_not_started(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="late", max_duration_millis=1000)
    claim = claim_one(storage)
    clock.advance(1)
    with recording(signals.task_started) as started, recording(signals.task_failed) as failed:
        assert run_claim(executor, claim) is TaskStatus.TIMEOUT
    info = executor.get_task("late")
    assert (info.status, info.attempts, info.started_at) == (TaskStatus.TIMEOUT, 0, None)
    assert "max duration" in info.last_error
    assert started.calls == []
    assert [(c["task_id"], c["status"]) for c in failed.calls] == [("late", TaskStatus.TIMEOUT)]


def test_task_claimed_after_its_deadline_times_out(executor, clock):
    executor.submit("demo.echo", None, task_id="late2", max_duration_millis=500, delay_millis=600)
    clock.advance(0.6)
    assert run_next(executor) is TaskStatus.TIMEOUT
    assert executor.get_task("late2").attempts == 0


def test_failure_past_the_deadline_is_timeout_not_pending(executor, clock):
    executor.submit("contract.hook", None, task_id="slow-fail", max_duration_millis=1000)

    def fail_late(context):
        clock.advance(2)
        raise ConnectionError("too late")

    HOOKS["slow-fail"] = fail_late
    with recording(signals.task_failed) as failed:
        assert run_next(executor) is TaskStatus.TIMEOUT
    info = executor.get_task("slow-fail")
    assert (info.status, info.attempts) == (TaskStatus.TIMEOUT, 1)
    assert "too late" in info.last_error
    assert [c["status"] for c in failed.calls] == [TaskStatus.TIMEOUT]


def test_failure_before_the_deadline_still_retries(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="in-time", max_duration_millis=10000)
    started = claim_and_start(storage)
    clock.advance(9)
    assert storage.fail(started, "boom", retryable=True).status is TaskStatus.PENDING


def test_expire_overdue_times_out_waiting_and_running_tasks(executor, storage, clock):
    executor.submit("demo.echo", None, task_id="wait", max_duration_millis=1000)
    executor.submit("demo.echo", None, task_id="run", max_duration_millis=1000)
    executor.submit("demo.echo", None, task_id="retrying", max_duration_millis=1000)
    executor.submit("demo.echo", None, task_id="later", max_duration_millis=5000)
    executor.submit("demo.echo", None, task_id="forever")
    executor.submit("demo.echo", None, task_id="done", max_duration_millis=1000)
    claims = {c.task_id: c for c in storage.claim("w1", ["default"], 10, LEASE)}
    storage.release([claims[i] for i in ("wait", "later", "forever")])
    running = storage.start(claims["run"], LEASE)
    pending = storage.start(claims["retrying"], LEASE)
    assert storage.fail(pending, "boom", retryable=True).status is TaskStatus.PENDING
    storage.complete(storage.start(claims["done"], LEASE), "ok")
    clock.advance(0.999)
    assert storage.expire_overdue(100) == []
    clock.advance(0.001)
    with recording(signals.task_failed) as failed:
        transitions = storage.expire_overdue(100)
        for transition in transitions:
            executor.announcer.transition(transition)
    assert {t.task.task_id: t.previous for t in transitions} == {
        "wait": TaskStatus.CREATED,
        "run": TaskStatus.RUNNING,
        "retrying": TaskStatus.PENDING,
    }
    assert {c["task_id"]: c["status"] for c in failed.calls} == dict.fromkeys(
        ("wait", "run", "retrying"), TaskStatus.TIMEOUT
    )
    for task_id in ("wait", "run", "retrying"):
        info = executor.get_task(task_id)
        assert (info.status, info.finished_at) == (TaskStatus.TIMEOUT, clock.now())
        assert "max duration of 1000 ms" in info.last_error
    assert "boom" in executor.get_task("retrying").last_error  # the last failure is kept
    assert executor.get_task("later").status is TaskStatus.CREATED
    assert executor.get_task("forever").status is TaskStatus.CREATED
    assert executor.get_task("done").status is TaskStatus.COMPLETED
    # The running worker's outcome no longer counts.
    assert storage.complete(running, "too late") is None
    assert executor.get_task("run").status is TaskStatus.TIMEOUT
    assert storage.expire_overdue(100) == []  # idempotent


def test_expire_overdue_respects_its_batch_limit(executor, storage, clock):
    for i in range(5):
        executor.submit("demo.echo", None, task_id=f"o-{i}", max_duration_millis=1000)
    clock.advance(2)
    assert len(storage.expire_overdue(2)) == 2
    assert len(storage.expire_overdue(10)) == 3
    assert executor.count_by_status()[TaskStatus.TIMEOUT] == 5


# -- ERROR --------------------------------------------------------------------------------------
def test_missing_handler_ends_error(storage, clock):
    service = ReliableExecutor(
        storage, clock=clock, settings=ExecutorSettings(ALLOW_UNKNOWN_TASKS=True)
    )
    info = service.submit("elsewhere.only", {"a": 1}, task_id="orphan", retry_limit=5)
    assert info.status is TaskStatus.CREATED
    with recording(signals.task_failed) as failed:
        assert run_next(service) is TaskStatus.ERROR
    stored = service.get_task("orphan")
    assert (stored.status, stored.attempts) == (TaskStatus.ERROR, 1)
    assert "elsewhere.only" in stored.last_error
    assert [(c["task_id"], c["status"]) for c in failed.calls] == [("orphan", TaskStatus.ERROR)]
    assert storage.claim("w1", ["default"], 10, LEASE) == []  # never retried


def test_unconvertible_parameter_ends_error(executor, storage, clock):
    # Written by another service (or an older version): the parameter no longer fits.
    storage.enqueue([new_task("stale", "demo.process_order", {"order": 1}, clock.now())])
    assert run_next(executor) is TaskStatus.ERROR
    info = executor.get_task("stale")
    assert info.status is TaskStatus.ERROR
    assert "param_type" in info.last_error
    assert "order" in info.last_error


# -- signals ----------------------------------------------------------------------------------
def test_cancel_sends_task_cancelled(executor):
    executor.submit("demo.echo", None, task_id="c")
    with recording(signals.task_cancelled) as cancelled:
        assert executor.cancel_task("c")
    assert cancelled.calls == [
        {"sender": ReliableExecutor, "task_id": "c", "task_name": "demo.echo"}
    ]


def test_failing_receivers_never_break_execution(executor, clock, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    with contextlib.ExitStack() as stack:
        for signal in ALL_SIGNALS:
            stack.enter_context(connected(signal, broken))
        executor.submit("demo.flaky", {"fail_times": 1}, task_id="sig")
        assert run_next(executor) is TaskStatus.PENDING
        clock.advance(1)
        assert run_next(executor) is TaskStatus.COMPLETED
        executor.submit("demo.always_fails", None, task_id="dead", retry_limit=0)
        assert run_next(executor) is TaskStatus.FAILED
        executor.submit("demo.echo", None, task_id="gone")
        assert executor.cancel_task("gone")
    assert executor.get_task("sig").status is TaskStatus.COMPLETED
    assert executor.get_task("dead").status is TaskStatus.FAILED
    assert executor.get_task("gone").status is TaskStatus.CANCELLED
    assert caplog.text.count("receiver bug") >= 6


def test_all_six_signals_in_one_life(executor, clock):
    with contextlib.ExitStack() as stack:
        recorders = {signal: stack.enter_context(recording(signal)) for signal in ALL_SIGNALS}
        executor.submit("demo.flaky", {"fail_times": 1}, task_id="life")
        assert run_next(executor) is TaskStatus.PENDING
        next_run_at = executor.get_task("life").run_at
        first_error = executor.get_task("life").last_error
        clock.advance(1)
        assert run_next(executor) is TaskStatus.COMPLETED
        executor.submit("demo.always_fails", None, task_id="doomed", retry_limit=0)
        assert run_next(executor) is TaskStatus.FAILED
        executor.submit("demo.echo", None, task_id="dropped")
        executor.cancel_task("dropped")
    sender = {"sender": ReliableExecutor}
    life = {"task_id": "life", "task_name": "demo.flaky"}
    assert recorders[signals.task_submitted].calls == [
        {**sender, **life},
        {**sender, "task_id": "doomed", "task_name": "demo.always_fails"},
        {**sender, "task_id": "dropped", "task_name": "demo.echo"},
    ]
    assert recorders[signals.task_started].for_task("life") == [
        {**sender, **life, "attempt": 1},
        {**sender, **life, "attempt": 2},
    ]
    assert recorders[signals.task_retrying].calls == [
        {**sender, **life, "attempt": 1, "error": first_error, "next_run_at": next_run_at}
    ]
    assert recorders[signals.task_completed].calls == [
        {**sender, **life, "result": "succeeded on attempt 2"}
    ]
    [failed] = recorders[signals.task_failed].calls
    assert failed == {
        **sender,
        "task_id": "doomed",
        "task_name": "demo.always_fails",
        "status": TaskStatus.FAILED,
        "error": executor.get_task("doomed").last_error,
    }
    assert "this task always fails" in failed["error"]
    assert recorders[signals.task_cancelled].calls == [
        {**sender, "task_id": "dropped", "task_name": "demo.echo"}
    ]


# -- claiming ---------------------------------------------------------------------------------
def test_priority_order_then_fifo(executor, storage, clock):
    order = [("a", 0), ("b", 5), ("c", 0), ("d", 10), ("e", 5), ("f", -1), ("g", 10)]
    for task_id, priority in order:
        executor.submit("demo.echo", None, task_id=task_id, priority=priority)
        clock.advance(0.001)
    first = storage.claim("w1", ["default"], 3, LEASE)
    assert [c.task_id for c in first] == ["d", "g", "b"]
    rest = storage.claim("w1", ["default"], 10, LEASE)
    assert [c.task_id for c in rest] == ["e", "a", "c", "f"]


def test_one_at_a_time_follows_the_same_order(executor, storage, clock):
    for task_id, priority in [("low", -5), ("old", 1), ("new", 1), ("top", 2)]:
        executor.submit("demo.echo", None, task_id=task_id, priority=priority)
        clock.advance(0.001)
    taken = [claim_one_of(storage) for _ in range(4)]
    assert taken == ["top", "old", "new", "low"]


def claim_one_of(storage) -> str:
    [claim] = storage.claim("w1", ["default"], 1, LEASE)
    return claim.task_id


def test_claim_takes_at_most_limit_and_hides_claimed_tasks(executor, storage):
    for i in range(10):
        executor.submit("demo.echo", None, task_id=f"c-{i}")
    assert storage.claim("w1", ["default"], 0, LEASE) == []
    mine = storage.claim("w1", ["default"], 3, LEASE)
    assert len(mine) == 3
    assert {executor.get_task(c.task_id).worker_id for c in mine} == {"w1"}
    theirs = storage.claim("w2", ["default"], 100, LEASE)
    assert len(theirs) == 7
    assert not {c.task_id for c in mine} & {c.task_id for c in theirs}
    assert storage.claim("w3", ["default"], 100, LEASE) == []
    assert {executor.get_task(c.task_id).worker_id for c in theirs} == {"w2"}


def test_queues_are_isolated(executor, storage):
    executor.submit("demo.echo", None, task_id="m1", queue="mail")
    executor.submit("demo.echo", None, task_id="r1", queue="reports")
    executor.submit("demo.echo", None, task_id="d1")
    assert [c.task_id for c in storage.claim("w1", ["mail"], 10, LEASE)] == ["m1"]
    assert storage.claim("w1", ["mail", "nowhere"], 10, LEASE) == []
    both = storage.claim("w2", ["reports", "default"], 10, LEASE)
    assert sorted(c.task_id for c in both) == ["d1", "r1"]
    assert storage.claim("w1", [], 10, LEASE) == []


def test_released_claims_return_without_an_attempt(executor, storage):
    executor.submit("demo.echo", None, task_id="back")
    claim = claim_one(storage, "w1")
    assert storage.release([claim]) == 1
    info = executor.get_task("back")
    assert (info.status, info.attempts, info.worker_id) == (TaskStatus.CREATED, 0, None)
    assert storage.start(claim, LEASE) is None  # the released claim is dead
    assert claim_one(storage, "w2").token != claim.token


def _wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_worker_claims_only_what_its_pool_can_take(executor, storage):
    """Backpressure: running + QUEUE_CAPACITY claims at most; shutdown hands the rest back."""
    for i in range(8):
        executor.submit("contract.gate", None, task_id=f"g-{i}")
    options = WorkerOptions(
        core_pool_size=1, max_pool_size=1, queue_capacity=2, poll_interval=0.02, worker_id="bp"
    )
    worker = Worker(options, executor)
    GATE.clear()
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:

        def held() -> list[str]:
            return [t.task_id for t in executor.list_tasks() if t.worker_id == "bp"]

        _wait_for(lambda: executor.count_by_status()[TaskStatus.RUNNING] == 1)
        _wait_for(lambda: len(held()) == 3)
        time.sleep(0.3)  # plenty of claim rounds: none may take more
        assert len(held()) == 3
        assert executor.count_by_status()[TaskStatus.RUNNING] == 1
        worker.request_stop()
        # Unstarted claims are handed back at once, while the running handler still runs.
        _wait_for(lambda: len(held()) == 1)
    finally:
        GATE.set()
        thread.join(30)
    assert not thread.is_alive()
    counts = executor.count_by_status()
    assert (counts[TaskStatus.COMPLETED], counts[TaskStatus.CREATED]) == (1, 7)
    waiting = executor.list_tasks(status=TaskStatus.CREATED)
    assert {(t.attempts, t.worker_id) for t in waiting} == {(0, None)}
    assert len(storage.claim("other", ["default"], 100, LEASE)) == 7
    connections.close_all()


def test_pending_failure_keeps_raising_receivers_isolated(executor):
    """A raising task_retrying receiver does not turn a retry into a failure."""
    executor.submit("contract.hook", None, task_id="iso")
    HOOKS["iso"] = raising(ConnectionError("down"))

    def broken(sender, **kwargs):
        raise ValueError("receiver bug")

    with connected(signals.task_retrying, broken):
        assert run_next(executor) is TaskStatus.PENDING
    assert executor.get_task("iso").status is TaskStatus.PENDING


@pytest.mark.parametrize(
    "parameter",
    ["hello", 0, 1.5, True, None, [1, "two", None], {"nested": {"list": [1, 2.5, "é"]}}],
    ids=["str", "int", "float", "bool", "null", "list", "dict"],
)
def test_claims_carry_exactly_what_get_task_reads(executor, storage, parameter):
    """The claim is built from raw rows: it must match the ORM's reading field for field."""
    executor.submit("demo.echo", parameter, task_id="raw", max_duration_millis=60000)
    [claim] = storage.claim("w1", ["default"], 10, 60)
    stored = executor.get_task("raw")
    assert claim.task.parameter == parameter
    assert type(claim.task.parameter) is type(parameter)
    assert claim.task == dataclasses.replace(stored, worker_id="w1")
    assert claim.deadline_at == stored.created_at + dt.timedelta(milliseconds=60000)
    assert claim.task.created_at.tzinfo is not None


def test_completion_writer_records_in_batches_and_announces(executor, storage):
    """The worker's background writer: every put() ends COMPLETED and announced by close()."""
    from django_reliable_executor.worker.completion_writer import CompletionWriter

    ids = [executor.submit("demo.echo", {"i": i}, task_id=f"cw-{i}").task_id for i in range(5)]
    started = storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    announced = []
    writer = CompletionWriter(storage.complete_many, announced.extend, lambda claim: None)
    for claim in started:
        writer.put(claim, {"done": claim.task_id})
    writer.close()
    assert sorted(t.task.task_id for t in announced) == sorted(ids)
    for task_id in ids:
        info = executor.get_task(task_id)
        assert (info.status, info.result) == (TaskStatus.COMPLETED, {"done": task_id})


def test_completion_writer_failure_leaves_tasks_running_for_recovery(executor, storage):
    from django_reliable_executor.worker.completion_writer import CompletionWriter

    executor.submit("demo.echo", {}, task_id="cw-fail")
    [claim] = storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    announced, discarded = [], []

    def broken(outcomes):
        raise ConnectionError("database went away")

    writer = CompletionWriter(broken, announced.extend, discarded.append)
    writer.put(claim, "result")
    writer.close()
    assert announced == [] and discarded == []
    assert executor.get_task("cw-fail").status is TaskStatus.RUNNING  # lease recovery reruns it
