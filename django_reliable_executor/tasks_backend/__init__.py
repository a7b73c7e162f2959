"""A backend for Django's Tasks framework: ``@task`` and ``.enqueue()`` run by runexecutor.

    TASKS = {"default": {
        "BACKEND": "django_reliable_executor.tasks_backend.ReliableExecutorBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"retry_limit": 3, "retry_backoff": "exponential"},
    }}

A Django task becomes an ordinary task of this app, named by the task function's module path,
with ``{"args": [...], "kwargs": {...}}`` as its parameter: the same storage, the same
runexecutor, retries, timeouts, cancel, admin and metrics. See docs/django-tasks.md.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import logging
import operator
import threading
from collections.abc import Callable, Mapping
from typing import Any

from django.apps import apps
from django.core import checks
from django.utils.module_loading import import_string

from ..core.options import NAMES as OPTION_NAMES
from ..core.options import TASKS_BACKEND, TaskOptions, as_number, options_of
from ..core.options import problems as option_problems
from ..core.records import TaskSubmitRequest, Transition
from ..core.serialization import ConversionError, to_json_value
from ..exceptions import InvalidTaskOptionError, TaskSubmitError
from ..observability.announcer import on_finished
from ..registry import TaskHandler, get_handler, register, register_resolver
from ..service.reliable_executor import executor
from ..tasks_compat import (
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from ..worker.context import TaskContext as ExecutorContext
from .results import (
    STATUS_MAP as STATUS_MAP,
)
from .results import (
    ReliableTaskContext,
    django_task_of,
    in_installed_app,
    to_result,
)
from .results import (
    exception_path as exception_path,
)

logger = logging.getLogger("django_reliable_executor")
_TASK_NAME = operator.attrgetter("task.task_name")

# The task options of @task (Django 6.1, the backport) and of OPTIONS (the option table's), and
# those of them TaskOptions holds (all but retry_on).
OPTION_KEYS = options_of(TASKS_BACKEND)
TASK_OPTION_NAMES = tuple(name for name in OPTION_KEYS if name in OPTION_NAMES)

# The docs page and section of the fix, named as the system checks' hints name them.
SETUP_HINT = "See docs/django-tasks.md, Set-up."


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReliableTask(Task):  # type: ignore[misc]
    """Django's Task with this app's per-task options. On Django 6.1 (and the backport) they
    are keyword arguments of ``@task``: ``@task(retry_limit=5, retry_on=(ConnectionError,))``.
    None takes the backend's OPTIONS, then RELIABLE_EXECUTOR's defaults."""

    retry_limit: int | None = None
    retry_interval: int | dt.timedelta | None = None  # milliseconds
    retry_backoff: str | None = None
    max_duration_millis: int | dt.timedelta | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    attempt_timeout: float | dt.timedelta | None = None  # seconds each attempt may run


def _numbers(source: Any) -> TaskOptions:
    """The task options of ``source`` (a task), its timedelta durations in their units."""
    return TaskOptions(
        **{name: as_number(name, getattr(source, name, None)) for name in TASK_OPTION_NAMES}
    )


def _option_problems(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, what is wrong) for every bad OPTIONS entry, in the words submit would use."""
    problems = option_problems(options, TASKS_BACKEND, own=("retry_on",))
    retry_on = options.get("retry_on")
    if retry_on is not None:
        try:
            _exception_classes(retry_on)
        except (ImportError, TypeError, ValueError) as exc:
            problems.append(("retry_on", f"retry_on: {exc}"))
    return problems


def _exception_classes(value: Any) -> tuple[type[BaseException], ...]:
    """A class, a dotted path, or a list of either, as a tuple of exception classes."""
    items = value if isinstance(value, (list, tuple)) else [value]
    classes = []
    for item in items:
        found = _exception_class(item) if isinstance(item, str) else item
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            raise TypeError(f"{item!r} is not an exception class")
        classes.append(found)
    return tuple(classes)


def _exception_class(path: str) -> Any:
    """A dotted path (``requests.ConnectionError``), or a built-in exception's bare name
    (``ConnectionError``, ``builtins.ConnectionError``)."""
    if "." not in path:
        found = getattr(builtins, path, None)
        if found is None:
            raise TypeError(
                f"{path!r} is neither a built-in exception nor a dotted path "
                "(module.ClassName, e.g. 'requests.ConnectionError')"
            )
        return found
    try:
        return import_string(path)
    except ImportError as exc:
        raise TypeError(f"{path!r} cannot be imported: {exc}") from None


class ReliableExecutorBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django Tasks on django-reliable-executor's storage and workers."""

    task_class = ReliableTask
    supports_defer = True  # run_after: the task waits in the storage until then
    supports_async_task = True  # coroutine functions run in the worker's thread
    supports_get_result = True  # from any process: results are stored
    supports_priority = True  # -100..100, higher first; ties oldest first

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.problems = _option_problems(self.options)
        good = {k: v for k, v in self.options.items() if k not in {p[0] for p in self.problems}}
        self.defaults = {k: good.get(k) for k in OPTION_KEYS}
        if self.defaults["retry_on"] is not None:
            self.defaults["retry_on"] = _exception_classes(self.defaults["retry_on"])

    # -- validating --------------------------------------------------------------------------
    def validate_task(self, task: Task) -> None:
        """Django's rules, this app's option and queue rules; then the task is registered
        as a handler, so a worker that imported its module can run it."""
        super().validate_task(task)
        try:  # the rule submit applies, so a bad option fails here rather than at every enqueue
            TaskOptions.of(_numbers(task), TaskOptions(queue=task.queue_name)).validate()
        except InvalidTaskOptionError as exc:
            raise InvalidTaskError(str(exc)) from exc
        retry_on = getattr(task, "retry_on", None)
        if retry_on is not None:
            try:
                _exception_classes(retry_on)
            except (ImportError, TypeError, ValueError) as exc:
                raise InvalidTaskError(f"retry_on: {exc}") from exc
        handler = get_handler(task.module_path)
        if handler is None or not isinstance(handler.origin, Task):
            register(_handler_for(task, self))

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:

        messages: list[checks.CheckMessage] = [
            checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']: {message}",
                hint=SETUP_HINT,
                id="django_reliable_executor.E020",
            )
            for _, message in self.problems
        ]
        if not apps.is_installed("django_reliable_executor"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses ReliableExecutorBackend, but "
                    "django_reliable_executor is not in INSTALLED_APPS",
                    hint=SETUP_HINT,
                    id="django_reliable_executor.E021",
                )
            )
        return messages

    # -- enqueueing --------------------------------------------------------------------------
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        if self.problems:
            raise InvalidTaskError(f"TASKS[{self.alias!r}]['OPTIONS']: {self.problems[0][1]}")
        for value, path in ((list(args), "args"), (dict(kwargs), "kwargs")):
            try:
                to_json_value(value, path)
            except ConversionError as exc:
                # A TypeError, as Django's own backends raise, with the path to the value.
                raise TypeError(f"{task.module_path}: {exc}") from None
        parameter: dict[str, Any] = {
            "args": normalize_json(list(args)),
            "kwargs": normalize_json(dict(kwargs)),
        }
        if self.alias != "default":
            parameter["backend"] = self.alias
        if task.run_after is not None:
            parameter["run_after"] = task.run_after.astimezone(dt.timezone.utc).isoformat()
        option = self._option(task)
        try:
            info = executor.submit_task(
                TaskSubmitRequest(
                    task_name=task.module_path,
                    task_parameter=parameter,
                    queue=task.queue_name,
                    priority=task.priority,
                    run_at=task.run_after,
                    retry_limit=option("retry_limit"),
                    retry_interval=option("retry_interval"),
                    retry_backoff=option("retry_backoff"),
                    max_duration_millis=option("max_duration_millis"),
                    attempt_timeout=option("attempt_timeout"),
                )
            )
        except TaskSubmitError as exc:
            raise InvalidTaskError(str(exc)) from exc
        result = to_result(info, task, self.alias)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _option(self, task: Task) -> Callable[[str], Any]:
        def value(key: str) -> Any:
            own = getattr(task, key, None)
            return own if own is not None else self.defaults[key]

        return value

    # -- results ---------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        info = executor.get_task(result_id) if isinstance(result_id, str) else None
        task = django_task_of(info) if info is not None else None
        if info is None or task is None:
            raise TaskResultDoesNotExist(result_id)
        return to_result(info, task, self.alias)


# -- the worker's side ---------------------------------------------------------------------------
def _handler_for(task: Task, backend: ReliableExecutorBackend) -> TaskHandler[Any]:
    """A handler running the Django task: args and kwargs from the parameter, Django's
    TaskContext (with the right attempt) when the task takes context."""
    func = task.func

    def run(parameter: Any, context: ExecutorContext) -> Any:
        args = parameter.get("args", []) if isinstance(parameter, dict) else []
        kwargs = parameter.get("kwargs", {}) if isinstance(parameter, dict) else {}
        info = context.task  # as started: RUNNING, this attempt counted
        # Django's task_started, sent here rather than from a receiver of this app's signal:
        # a receiver would run (and cost the worker) for every task, Django's or not.
        if task_started.receivers:
            task_started.send(type(backend), task_result=to_result(info, task, backend.alias))
        if not task.takes_context:
            return task.call(*args, **kwargs)
        django_context = ReliableTaskContext(
            task_result=to_result(info, task, backend.alias), executor_context=context
        )
        return task.call(django_context, *args, **kwargs)

    run.__module__ = func.__module__
    run.__qualname__ = func.__qualname__
    retry_on = getattr(task, "retry_on", None) or backend.defaults["retry_on"] or (Exception,)
    timeout = getattr(task, "attempt_timeout", None)
    if timeout is None:
        timeout = backend.defaults["attempt_timeout"]
    handler: TaskHandler[Any] = TaskHandler(
        run,
        name=task.module_path,
        queue=task.queue_name,
        retry_on=retry_on,
        takes_context=True,
        attempt_timeout=as_number("attempt_timeout", timeout),
        origin=task,
    )
    return handler


def _resolve(name: str) -> TaskHandler[Any] | None:
    """A worker asked for a task name it has no handler for: a Django task defined in a module
    nobody imported yet (not an app's tasks.py). Importing it registers it.

    Task names come from the storage, where anyone who can submit (with ALLOW_UNKNOWN_TASKS)
    or write to it puts them: only a module of an installed app is imported, never any other
    (``subprocess``, a project's settings, a module with effects at import)."""
    if not in_installed_app(name):
        logger.warning("task name %r: not imported, it names no module of an installed app", name)
        return None
    try:
        found = import_string(name)
    except (ImportError, ValueError):
        return None
    if not isinstance(found, Task):
        return None
    found.get_backend().validate_task(found)
    return get_handler(name)


register_resolver(_resolve)


# -- Django's signals, sent beside this app's ---------------------------------------------------
_local = threading.local()


def _send(signal: Any, task_id: str) -> None:
    info = executor.get_task(task_id)
    task = django_task_of(info) if info is not None else None
    if info is None or task is None:
        return
    backend = task.get_backend()
    signal.send(type(backend), task_result=to_result(info, task, backend.alias))


def _is_django_task(task_name: str) -> bool:
    handler = get_handler(task_name)
    return handler is not None and isinstance(handler.origin, Task)


def _on_finished(transitions: list[Transition]) -> None:
    """Django's task_finished for each Django task among ``transitions`` (tasks that reached a
    final status); a failure is logged and costs only its own task's signal."""
    names = set(map(_TASK_NAME, transitions))
    django_names = {name for name in names if _is_django_task(name)}
    if not django_names:
        return
    for transition in transitions:
        if transition.task.task_name in django_names:
            try:
                _send(task_finished, transition.task.task_id)
            except Exception:
                logger.exception("task %s: sending task_finished failed", transition.task.task_id)


# A listener of the announcer rather than a receiver of this app's signals: those would make
# every task, Django's or not, pay for a signal dispatch.
on_finished(_on_finished)

__all__ = ["ReliableExecutorBackend", "ReliableTask", "task_backends"]
