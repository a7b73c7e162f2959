"""Tasks declared with Django's own API; the tests enqueue them and a runexecutor runs them."""

from __future__ import annotations

import os
from typing import Any

from demo.models import Execution

from django_reliable_executor.conf import get_settings
from django_reliable_executor.tasks_compat import DECORATOR_OPTIONS, TaskContext, task


def _log(task_id: str, attempt: int) -> None:
    Execution.objects.using(get_settings().DATABASE_ALIAS).create(
        task_id=task_id, attempt=attempt, pid=os.getpid(), finished=True
    )


@task()
def noop(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def meaning_of_life() -> int:
    return 42


@task()
def echo(*args: Any, **kwargs: Any) -> dict:
    return {"args": list(args), "kwargs": kwargs}


@task()
async def add_async(a: int, b: int) -> int:
    return a + b


@task()
def fails() -> None:
    raise ValueError("This task failed due to ValueError")


class CustomError(Exception):
    """An exception of a module of ours: its dotted path is djtasks.tasks.CustomError."""


@task()
def fails_custom() -> None:
    raise CustomError("custom failure")


@task(takes_context=True)
def context_info(context: TaskContext) -> dict:
    _log(context.task_result.id, context.attempt)
    return {"id": context.task_result.id, "attempt": context.attempt}


@task(takes_context=True, backend="retrying")  # that backend's OPTIONS retry ConnectionError
def flaky(context: TaskContext, fail_times: int) -> int:
    """Fails its first ``fail_times`` attempts, then returns the attempt it succeeded on."""
    _log(context.task_result.id, context.attempt)
    if context.attempt <= fail_times:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return context.attempt


@task(priority=5, queue_name="djtasks")
def on_own_queue() -> str:
    return "ran"


if DECORATOR_OPTIONS:  # Django 6.1+ and the backport: this app's options on @task itself

    @task(
        retry_limit=5,
        retry_interval=1000,
        retry_backoff="exponential",
        max_duration_millis=60_000,
        retry_on=(ConnectionError, TimeoutError),
        attempt_timeout=30,
    )
    def with_options() -> str:
        return "ok"


@task(takes_context=True)
def report_progress(context: TaskContext, current: int, total: int) -> None:
    """Reports its progress through the context's set_progress (this backend's TaskContext)."""
    context.set_progress(current, total, "from a Django task")  # type: ignore[attr-defined]


@task(takes_context=True)
def approve_then_charge(context: TaskContext, order_id: int) -> dict:
    """A durable step, then a wait for the event "approval", through this backend's context."""
    charged = context.step("charge", lambda: f"charged {order_id}")  # type: ignore[attr-defined]
    approval = context.wait_for_event("approval")  # type: ignore[attr-defined]
    return {"charged": charged, "approval": approval}
