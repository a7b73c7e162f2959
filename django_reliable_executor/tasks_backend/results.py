"""Stored tasks as Django's TaskResults: the Django task a stored task was enqueued for, its
status, errors and progress."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

from django.apps import apps

from ..core.progress import Progress
from ..core.records import TaskInfo
from ..core.states import TaskStatus
from ..registry import get_handler
from ..tasks_compat import (
    InvalidTaskError,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
)
from ..worker.context import TaskContext as ExecutorContext

STATUS_MAP = {
    TaskStatus.CREATED: TaskResultStatus.READY,
    TaskStatus.PENDING: TaskResultStatus.READY,
    TaskStatus.RUNNING: TaskResultStatus.RUNNING,
    TaskStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    TaskStatus.FAILED: TaskResultStatus.FAILED,
    TaskStatus.TIMEOUT: TaskResultStatus.FAILED,
    TaskStatus.ERROR: TaskResultStatus.FAILED,
    TaskStatus.CANCELLED: TaskResultStatus.FAILED,
}


def django_task_of(info: TaskInfo) -> Task | None:
    """The Django task a stored task was enqueued for, as it was enqueued (priority, queue,
    run_after), or None when it is not a Django task."""
    parameter = info.parameter
    if not isinstance(parameter, dict) or set(parameter) - {
        "args",
        "kwargs",
        "backend",
        "run_after",
    }:
        return None
    handler = get_handler(info.task_name)
    base = handler.origin if handler is not None else None
    if not isinstance(base, Task):
        return None
    run_after = parameter.get("run_after")
    changes: dict[str, Any] = {"priority": info.priority, "queue_name": info.queue}
    if run_after:
        changes["run_after"] = dt.datetime.fromisoformat(run_after)
    if parameter.get("backend"):
        changes["backend"] = parameter["backend"]
    try:
        return base.using(**changes)
    except InvalidTaskError:
        # Stored under a queue or priority this process's settings would not allow now: the
        # task as it was stored, without validating it again (replace() would).
        return _unvalidated(base, changes)


def _unvalidated(base: Task, changes: dict[str, Any]) -> Task:
    copy = object.__new__(type(base))
    for field in dataclasses.fields(base):
        object.__setattr__(copy, field.name, changes.get(field.name, getattr(base, field.name)))
    return copy


def _errors(info: TaskInfo) -> list[TaskError]:
    if not info.last_error or STATUS_MAP[info.status] is TaskResultStatus.SUCCESSFUL:
        return []
    return [
        TaskError(exception_class_path=exception_path(info.last_error), traceback=info.last_error)
    ]


def exception_path(error: str) -> str:
    """The dotted path of the exception a stored traceback ends with ("builtins.ValueError");
    a failure recorded by the app itself (worker lost, timeout) has none of its own."""
    lines = error.rstrip("\n").splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("  File ")), default=-1)
    for line in lines[start + 1 :]:
        if line and not line[0].isspace():
            name = line.split(":", 1)[0].strip()
            path = name if "." in name else f"builtins.{name}"
            found = _imported(path)
            if isinstance(found, type) and issubclass(found, BaseException):
                return path
            break
    return "builtins.RuntimeError"


def _imported(path: str) -> Any:
    """The object at a dotted path, from a module already imported or of an installed app,
    else None: the path comes from stored text, which must not import any other module."""
    module_name, _, attribute = path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None and in_installed_app(path):
        try:
            module = import_module(module_name)
        except ImportError:
            return None
    return getattr(module, attribute, None) if module is not None else None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReliableTaskResult(TaskResult):  # type: ignore[type-arg,misc]
    """Django's TaskResult, with the task's ``progress`` (``TaskInfo.progress``: None before
    the handler's first ``set_progress``), which Django's has no field for; ``refresh()``
    reads it again too."""

    progress: Progress | None = None

    # TaskResult's own methods by name: super() without arguments fails in a slots dataclass.
    def refresh(self) -> None:
        TaskResult.refresh(self)
        self._refresh_progress(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        await TaskResult.arefresh(self)
        self._refresh_progress(await self.task.get_backend().aget_result(self.id))

    def _refresh_progress(self, refreshed: TaskResult) -> None:
        object.__setattr__(self, "progress", getattr(refreshed, "progress", None))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReliableTaskContext(TaskContext):  # type: ignore[misc]
    """Django's TaskContext, with ``set_progress`` (see this app's TaskContext)."""

    executor_context: ExecutorContext | None = None

    def set_progress(
        self, current: int | float, total: int | float | None = None, message: str = ""
    ) -> None:
        self._executor("set_progress").set_progress(current, total, message)

    # Durable steps and waits (docs/durable-tasks.md): this app's TaskContext's, by name.
    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._executor("step").step(name, fn, *args, **kwargs)

    def sleep(self, name: str, duration: float | dt.timedelta) -> Any:
        return self._executor("sleep").sleep(name, duration)

    def wait_for_event(self, name: str, timeout: float | dt.timedelta | None = None) -> Any:
        return self._executor("wait_for_event").wait_for_event(name, timeout)

    def wait_for(
        self, name: str, task_ids: Any, timeout: float | dt.timedelta | None = None
    ) -> Any:
        return self._executor("wait_for").wait_for(name, task_ids, timeout)

    def _executor(self, what: str) -> ExecutorContext:
        if self.executor_context is None:
            raise RuntimeError(f"{what}: this context belongs to no running task")
        return self.executor_context


def to_result(info: TaskInfo, task: Task, alias: str) -> TaskResult:
    parameter = info.parameter if isinstance(info.parameter, dict) else {}
    result: TaskResult = ReliableTaskResult(
        task=task,
        id=info.task_id,
        status=STATUS_MAP[info.status],
        enqueued_at=info.created_at,
        started_at=info.started_at,
        finished_at=info.finished_at if info.status.is_terminal else None,
        last_attempted_at=info.started_at,
        args=parameter.get("args", []),
        kwargs=parameter.get("kwargs", {}),
        backend=parameter.get("backend", alias),
        errors=_errors(info),
        # One entry per attempt (Django counts attempts so); only the last worker is stored.
        worker_ids=[info.worker_id or ""] * info.attempts,
        progress=info.progress,
    )
    if info.status is TaskStatus.COMPLETED:
        object.__setattr__(result, "_return_value", info.result)
    return result


def in_installed_app(module_path: str) -> bool:
    """True when ``module_path`` (a module, or an object in one) lies in an installed app's
    package: the only modules a worker imports because a stored task names them."""
    return any(module_path.startswith(config.name + ".") for config in apps.get_app_configs())
