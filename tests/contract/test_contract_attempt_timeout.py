"""attempt_timeout on every storage (SQLite, MariaDB, PostgreSQL, Redis): the option's checks
(nothing stored on a bad value, in multi-task submits too), how it is stored and read back and
carried by a claim, and what the real TaskRunner does with an attempt of a pool thread that
runs past it: asked to stop, still holding its claim while the handler runs on, then a failed
attempt for the retry policy, with a cancel or the deadline still winning."""

from __future__ import annotations

import datetime as dt
import math
import re
import threading
import time
from typing import Any

import pytest
from django.db import connections
from prometheus_client import REGISTRY

from django_reliable_executor import TaskContext, TaskSubmitRequest, reliable_task_handler, signals
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.exceptions import (
    HandlerRegistrationError,
    InvalidTaskOptionError,
    TaskSubmitError,
)
from django_reliable_executor.registry import get_handler
from django_reliable_executor.worker.attempt_limits import attempt_timeout_of
from tests.support.contract_support import (
    HOOKS,
    LEASE,
    claim_one,
    new_task,
    recording,
    run_claim,
    total,
)

TIMED = "contract.timed"  # decorator attempt_timeout=0.3, retry_on=(ConnectionError,)
LIMIT = 0.2  # seconds: the attempt_timeout the submits below give

BAD_VALUES = [
    0,
    0.0,
    -1,
    -0.5,
    True,
    False,
    "5",
    math.nan,
    math.inf,
    -math.inf,
    10**12,  # over 100 years
    dt.timedelta(0),
    dt.timedelta(seconds=-1),
    [1],
]


# -- the option: checked, stored, read back --------------------------------------------------
@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_a_bad_attempt_timeout_is_refused_naming_it_and_stores_nothing(executor, value):
    with pytest.raises(InvalidTaskOptionError) as caught:
        executor.submit("contract.hook", None, task_id="bad", attempt_timeout=value)
    assert caught.value.field == "attempt_timeout"
    message = str(caught.value)
    assert message.startswith("attempt_timeout must be None, a number of seconds above 0")
    expected = value.total_seconds() if isinstance(value, dt.timedelta) else value
    assert message.endswith(f"got {expected!r}")
    assert executor.get_task("bad") is None
    assert total(executor.count_by_status()) == 0


def test_multi_task_submits_with_one_bad_attempt_timeout_store_nothing(executor):
    good = TaskSubmitRequest("contract.hook", task_id="good", attempt_timeout=5)
    bad = TaskSubmitRequest("contract.hook", task_id="bad", attempt_timeout=-5)
    for submit in (executor.submit_many, executor.chain):
        with pytest.raises(InvalidTaskOptionError) as caught:
            submit([good, bad])
        assert caught.value.field == "attempt_timeout"
    with pytest.raises(InvalidTaskOptionError):
        executor.submit_batch([good, bad], batch_id="b1")
    with pytest.raises(TaskSubmitError) as caught:
        executor.submit_batch(
            [good],
            batch_id="b2",
            on_complete=TaskSubmitRequest("contract.hook", task_id="cb", attempt_timeout=0),
        )
    assert caught.value.field == "on_complete.attempt_timeout"
    assert executor.get_batch("b1") is None and executor.get_batch("b2") is None
    assert total(executor.count_by_status()) == 0


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        (1, 1.0),
        (0.25, 0.25),
        (dt.timedelta(milliseconds=1500), 1.5),
        (dt.timedelta(hours=2), 7200.0),
        (3153600000, 3153600000.0),  # 100 years: the most accepted
        (None, None),
    ],
)
def test_attempt_timeout_is_stored_read_back_and_claimed(executor, storage, given, stored):
    info = executor.submit("contract.hook", None, task_id="t", attempt_timeout=given)
    assert info.attempt_timeout == stored
    again = executor.get_task("t")
    assert again.attempt_timeout == stored
    assert type(again.attempt_timeout) is type(stored)
    assert claim_one(storage).task.attempt_timeout == stored


def test_the_handler_s_attempt_timeout_is_stored_unless_the_submit_gives_one(executor, storage):
    assert executor.submit(TIMED, None, task_id="own").attempt_timeout == 0.3
    assert executor.submit(TIMED, None, task_id="given", attempt_timeout=9).attempt_timeout == 9.0
    assert executor.get_task("own").attempt_timeout == 0.3
    # A task stored without one (a schedule's run, another service's submit) takes the
    # handler's when it runs; one stored with its own keeps it.
    storage.enqueue([new_task("bare", TIMED, None, executor.clock.now())])
    bare = executor.get_task("bare")
    assert bare.attempt_timeout is None
    assert attempt_timeout_of(bare, get_handler(TIMED)) == 0.3
    assert attempt_timeout_of(executor.get_task("given"), get_handler(TIMED)) == 9.0
    assert attempt_timeout_of(bare, None) is None


def test_each_task_of_a_multi_task_submit_keeps_its_own(executor):
    infos = executor.chain(
        [
            TaskSubmitRequest("contract.hook", task_id="c1", attempt_timeout=1),
            TaskSubmitRequest("contract.hook", task_id="c2"),
            TaskSubmitRequest("contract.hook", task_id="c3", attempt_timeout=dt.timedelta(0, 3)),
        ]
    )
    assert [i.attempt_timeout for i in infos] == [1.0, None, 3.0]
    assert [executor.get_task(i).attempt_timeout for i in ("c1", "c2", "c3")] == [1.0, None, 3.0]


def test_a_batch_callback_keeps_its_attempt_timeout_until_it_is_stored(executor):
    executor.submit_batch(
        [TaskSubmitRequest("contract.hook", task_id="member", attempt_timeout=2)],
        batch_id="b",
        on_complete=TaskSubmitRequest("contract.hook", task_id="report", attempt_timeout=7.5),
    )
    assert executor.get_task("member").attempt_timeout == 2.0
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.COMPLETED
    assert executor.get_task("report").attempt_timeout == 7.5


def test_the_decorator_refuses_a_bad_attempt_timeout_at_import():
    for value in (0, -1, "1", math.nan, True, dt.timedelta(0)):
        with pytest.raises(HandlerRegistrationError, match="attempt_timeout must be"):

            @reliable_task_handler(name="tests.bad_attempt_timeout", attempt_timeout=value)
            def handler() -> None: ...

    assert get_handler("tests.bad_attempt_timeout") is None


def test_celery_s_time_limit_points_at_attempt_timeout(executor):
    with pytest.raises(InvalidTaskOptionError) as caught:
        executor.submit("contract.hook", None, time_limit=30)
    assert "Celery's time_limit is 'attempt_timeout' here: seconds per attempt" in str(caught.value)


# -- a pool thread's attempt past its limit ------------------------------------------------------
def _run_in_thread(executor, claim) -> tuple[threading.Thread, list[Any]]:
    """``run_claim`` in a thread of its own (its connections closed as it ends); its result
    lands in the returned list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(run_claim(executor, claim))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait(predicate, timeout: float = 10.0) -> None:
    ends = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.01)


def test_an_attempt_past_its_limit_is_asked_to_stop_and_retried(executor):
    seen: dict[str, Any] = {}

    def cooperative(context: TaskContext) -> Any:
        seen["began"] = time.monotonic()
        while not context.is_cancelled():
            time.sleep(0.01)
        seen["stopped"] = time.monotonic()
        # Outside contract.timed's retry_on: retried all the same, as the worker ended it.
        raise InterruptedError("asked to stop")

    HOOKS["t"] = cooperative
    executor.submit(TIMED, None, task_id="t", attempt_timeout=LIMIT, retry_limit=1)
    queue = "default"
    before = REGISTRY.get_sample_value(
        "reliable_executor_tasks_retried_total", {"task_name": TIMED, "queue": queue}
    )
    # The limit runs from the attempt's start, a moment before the handler is called: the
    # handler's own clock may see a little less than LIMIT, never the worker's.
    claimed_at = time.monotonic()
    with recording(signals.task_retrying) as retrying:
        assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    assert seen["stopped"] - claimed_at >= LIMIT
    assert seen["stopped"] - seen["began"] < LIMIT + 1
    task = executor.get_task("t")
    assert (task.status, task.attempts) == (TaskStatus.PENDING, 1)
    first_line, *traceback = task.last_error.splitlines()
    assert re.fullmatch(
        r"attempt timed out after 0\.2 s \(attempt_timeout\): the handler raised after "
        r"\d+\.\d\d s:",
        first_line,
    ), first_line
    assert traceback[-1] == "InterruptedError: asked to stop"
    # The same signal and metric as any retried attempt.
    [call] = retrying.for_task("t")
    assert call["attempt"] == 1 and call["error"] == task.last_error
    after = REGISTRY.get_sample_value(
        "reliable_executor_tasks_retried_total", {"task_name": TIMED, "queue": queue}
    )
    assert (after or 0) == (before or 0) + 1

    # The retry gets a fresh limit: it returns in time and completes.
    HOOKS["t"] = lambda context: "quick"
    executor.clock.advance(2)
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.COMPLETED
    task = executor.get_task("t")
    assert (task.status, task.attempts, task.result) == (TaskStatus.COMPLETED, 2, "quick")


def test_a_handler_that_runs_on_keeps_its_claim_until_it_returns(executor, storage):
    """Past its limit the attempt stays RUNNING, leased and counted against max_concurrency:
    nothing else of its name is claimed, and no second attempt can start, until the handler
    returns; then it is a failed attempt (FAILED: no retries left)."""
    release = threading.Event()

    def stubborn(context: TaskContext) -> str:
        release.wait(10)
        return "late"

    HOOKS["t"] = stubborn
    executor.submit(TIMED, None, task_id="t", attempt_timeout=LIMIT, retry_limit=0)
    executor.submit(TIMED, None, task_id="other")
    claim = storage.claim("w1", ["default"], 1, LEASE, name_limits={TIMED: 1})[0]
    thread, outcome = _run_in_thread(executor, claim)
    time.sleep(LIMIT + 0.3)  # past the limit, the handler still waits

    task = executor.get_task("t")
    assert (task.status, task.attempts, task.handler_running) == (TaskStatus.RUNNING, 1, True)
    assert storage.claim("w2", ["default"], 10, LEASE, name_limits={TIMED: 1}) == []
    assert not executor.retry_task("t")  # RUNNING: nothing to retry by hand
    release.set()
    thread.join(10)
    assert outcome == [TaskStatus.FAILED]
    task = executor.get_task("t")
    assert (task.status, task.handler_running) == (TaskStatus.FAILED, False)
    assert task.last_error.startswith(f"attempt timed out after {LIMIT:g} s (attempt_timeout): ")
    assert "the handler returned after 0." in task.last_error
    assert task.last_error.endswith("; what it returned was discarded")
    assert task.result is None
    # The slot is free once it returned.
    [other] = storage.claim("w2", ["default"], 10, LEASE, name_limits={TIMED: 1})
    assert other.task_id == "other"


def test_a_handler_that_returns_in_time_completes(executor):
    HOOKS["t"] = lambda context: time.sleep(0.05) or "done"
    executor.submit(TIMED, None, task_id="t", attempt_timeout=5)
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.COMPLETED
    task = executor.get_task("t")
    assert (task.status, task.result, task.last_error) == (TaskStatus.COMPLETED, "done", None)


def test_the_decorator_s_limit_applies_to_a_task_stored_without_one(executor, storage):
    HOOKS["bare"] = lambda context: time.sleep(0.6)
    storage.enqueue([new_task("bare", TIMED, None, executor.clock.now(), retry_limit=0)])
    assert run_claim(executor, claim_one(storage)) is TaskStatus.FAILED
    assert executor.get_task("bare").last_error.startswith(
        "attempt timed out after 0.3 s (attempt_timeout): "
    )


def test_a_cancel_requested_during_a_timed_out_attempt_wins(executor, storage):
    release = threading.Event()
    HOOKS["t"] = lambda context: release.wait(10)
    executor.submit(TIMED, None, task_id="t", attempt_timeout=LIMIT, retry_limit=3)
    thread, outcome = _run_in_thread(executor, claim_one(storage))
    _wait(lambda: executor.get_task("t").status is TaskStatus.RUNNING)
    time.sleep(LIMIT + 0.1)
    assert executor.cancel_task("t")  # a request only: the handler still runs
    release.set()
    thread.join(10)
    assert outcome == [TaskStatus.CANCELLED]
    assert executor.get_task("t").status is TaskStatus.CANCELLED


def test_past_the_deadline_too_the_task_ends_timeout(executor, storage, clock):
    release = threading.Event()
    HOOKS["t"] = lambda context: release.wait(10)
    executor.submit(
        TIMED, None, task_id="t", attempt_timeout=LIMIT, max_duration_millis=60_000, retry_limit=3
    )
    thread, outcome = _run_in_thread(executor, claim_one(storage))
    _wait(lambda: executor.get_task("t").status is TaskStatus.RUNNING)
    time.sleep(LIMIT + 0.1)
    clock.advance(61)  # the deadline passed while the handler ran on
    release.set()
    thread.join(10)
    assert outcome == [TaskStatus.TIMEOUT]
    task = executor.get_task("t")
    assert task.status is TaskStatus.TIMEOUT


@reliable_task_handler(name="tests.no_context", retry_limit=0, attempt_timeout=LIMIT)
def no_context() -> str:
    """Takes no context, so it cannot be told to stop: it returns past its limit."""
    time.sleep(LIMIT + 0.3)
    return "late"


def test_a_handler_without_a_context_is_timed_out_when_it_returns(executor, storage):
    executor.submit("tests.no_context", None, task_id="t")
    assert run_claim(executor, claim_one(storage)) is TaskStatus.FAILED
    assert "the handler returned after" in executor.get_task("t").last_error
