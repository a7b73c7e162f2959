"""Helpers of the contract suite: test-only handlers, a signal recorder, claim-and-run shortcuts."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.dispatch import Signal

from django_reliable_executor import (
    TaskContext,
    TaskStatus,
    TaskSubmitError,
    reliable_task_handler,
    signals,
)
from django_reliable_executor.core.records import Claim, NewTask
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.base import TaskStorage
from django_reliable_executor.worker.runner import TaskRunner

# Only these apps' tables are flushed after each test: truncating every table of the project
# costs about a second per test on PostgreSQL, these four a fraction of it.

LEASE = 60.0

# task_id -> what the ``contract.hook`` handler does with its context (set by each test).
HOOKS: dict[str, Callable[[TaskContext], Any]] = {}
# Opened by tests to let ``contract.gate`` handlers return.
GATE = threading.Event()


@reliable_task_handler(name="contract.hook", takes_context=True, retry_interval=1000)
def hook(param: Any, context: TaskContext) -> Any:
    """Runs the test's hook for this task id; returns its value (or None without a hook)."""
    action = HOOKS.get(context.task_id)
    return action(context) if action is not None else None


@reliable_task_handler(name="contract.async_hook", takes_context=True, retry_interval=1000)
async def async_hook(param: Any, context: TaskContext) -> Any:
    """The ``async def`` twin of contract.hook: awaits the test's hook (a coroutine function)."""
    action = HOOKS.get(context.task_id)
    return await action(context) if action is not None else None


@reliable_task_handler(
    name="contract.timed",
    takes_context=True,
    retry_interval=1000,
    retry_on=(ConnectionError,),
    attempt_timeout=0.3,
)
def timed(param: Any, context: TaskContext) -> Any:
    """contract.hook with a decorator attempt_timeout of 0.3 s, retrying ConnectionError only."""
    action = HOOKS.get(context.task_id)
    return action(context) if action is not None else None


@reliable_task_handler(name="contract.gate")
def gate(param: Any = None) -> str:
    """Blocks until GATE is set (at most 30 s), so tests can hold a worker's pool busy."""
    GATE.wait(30)
    return "opened"


@reliable_task_handler(name="contract.bad_result")
def bad_result(param: Any = None) -> Any:
    """Returns a value JSON cannot hold."""
    return {1, 2, 3}


def raising(exc: BaseException) -> Callable[[TaskContext], Any]:
    def action(context: TaskContext) -> Any:
        raise exc

    return action


class Recorder:
    """Collects the kwargs of every send of one signal."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, sender: Any, signal: Signal, **kwargs: Any) -> None:
        self.calls.append({"sender": sender, **kwargs})

    def for_task(self, task_id: str) -> list[dict[str, Any]]:
        return [call for call in self.calls if call.get("task_id") == task_id]


@contextlib.contextmanager
def recording(signal: Signal) -> Iterator[Recorder]:
    recorder = Recorder()
    signal.connect(recorder, weak=False)
    try:
        yield recorder
    finally:
        signal.disconnect(recorder)


@contextlib.contextmanager
def connected(signal: Signal, receiver: Callable[..., Any]) -> Iterator[None]:
    signal.connect(receiver, weak=False)
    try:
        yield
    finally:
        signal.disconnect(receiver)


def at_once(storages: list[TaskStorage], work: Callable[[TaskStorage, str], None]) -> None:
    """Run ``work(storage, worker id)`` in a thread per storage (workers w0, w1, ...), all
    let go together, each closing its connections when done; fail with what any raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(storages))

    def run(storage: TaskStorage, worker: str) -> None:
        try:
            barrier.wait(10)
            work(storage, worker)
        except BaseException as exc:  # reported by the calling thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(storage, f"w{i}")) for i, storage in enumerate(storages)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []


def claim_one(storage: TaskStorage, worker: str = "w1", queue: str = "default") -> Claim:
    """Claim exactly one due task (fails the test when none or several are due)."""
    claims = storage.claim(worker, [queue], 10, LEASE)
    assert len(claims) == 1, [c.task_id for c in claims]
    return claims[0]


def claim_and_start(storage: TaskStorage, worker: str = "w1", queue: str = "default") -> Claim:
    started = storage.start(claim_one(storage, worker, queue), LEASE)
    assert started is not None
    return started


def run_next(executor: ReliableExecutor, worker: str = "w1") -> TaskStatus | None:
    """Claim the one due task and run it through the real TaskRunner."""
    return run_claim(executor, claim_one(executor.storage, worker))


@contextlib.contextmanager
def task_runner(executor: ReliableExecutor) -> Iterator[TaskRunner]:
    """A TaskRunner that completes through its CompletionWriter, as the worker's does: every
    completion is written, and announced, by the time the block ends."""
    runner = TaskRunner(executor, LEASE)
    writer = runner.start_writer()
    try:
        yield runner
    finally:
        writer.close()
        runner.progress.close()  # its thread's database connection with it


def run_claims(executor: ReliableExecutor, claims: list[Claim]) -> list[TaskStatus | None]:
    """Run each claim through the real TaskRunner and wait for its writer. Each claim's recorded
    status: for a completion, the one its writer announced (FAILED when the storage refused the
    result), or None when its outcome was discarded (the claim was no longer ours)."""
    with (
        recording(signals.task_completed) as completed,
        recording(signals.task_failed) as failed,
        task_runner(executor) as runner,  # closed first: its writes are announced, recorded
    ):
        statuses = [runner.run(claim) for claim in claims]
    written: dict[str, TaskStatus] = {c["task_id"]: TaskStatus.COMPLETED for c in completed.calls}
    written.update((c["task_id"], c["status"]) for c in failed.calls)
    return [
        written.get(claim.task_id) if status is TaskStatus.COMPLETED else status
        for claim, status in zip(claims, statuses, strict=True)
    ]


def run_claim(executor: ReliableExecutor, claim: Claim) -> TaskStatus | None:
    """``run_claims`` of one claim."""
    return run_claims(executor, [claim])[0]


def new_task(
    task_id: str,
    task_name: str,
    parameter: Any,
    now: dt.datetime,
    *,
    retry_limit: int = 3,
    max_duration_millis: int | None = None,
) -> NewTask:
    """A task record written straight to storage, as another service (or version) might."""
    return NewTask(
        task_id=task_id,
        task_name=task_name,
        queue="default",
        priority=0,
        parameter=parameter,
        retry_limit=retry_limit,
        retry_interval=1000,
        retry_backoff="fixed",
        max_duration_millis=max_duration_millis,
        created_at=now,
        run_at=now,
        deadline_at=(
            now + dt.timedelta(milliseconds=max_duration_millis) if max_duration_millis else None
        ),
    )


def total(counts: dict[TaskStatus, int]) -> int:
    return sum(counts.values())


def assert_refused(
    executor: ReliableExecutor, error: type[TaskSubmitError], field: str, submit: Any
) -> TaskSubmitError:
    """``submit()`` raises ``error`` naming ``field``; the stored tasks are exactly as before."""
    tasks_before = executor.list_tasks()
    counts_before = executor.count_by_status()
    with recording(signals.task_submitted) as submitted, pytest.raises(error) as raised:
        submit()
    assert isinstance(raised.value, TaskSubmitError)
    assert isinstance(raised.value, ValueError)
    assert raised.value.field == field
    assert field in str(raised.value)
    assert executor.list_tasks() == tasks_before
    assert executor.count_by_status() == counts_before
    assert submitted.calls == []
    return raised.value
