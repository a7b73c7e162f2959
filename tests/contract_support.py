"""Helpers of the contract suite: test-only handlers, a signal recorder, claim-and-run shortcuts."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.dispatch import Signal

from django_reliable_executor import TaskContext, reliable_task_handler
from django_reliable_executor.execution import TaskRunner
from django_reliable_executor.records import Claim, NewTask
from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.states import TaskStatus
from django_reliable_executor.storage.base import TaskStorage

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
    return TaskRunner(executor, LEASE).run(claim_one(executor.storage, worker))


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
