"""The @reliable_task_handler decorator and the registry of handlers by task name."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .exceptions import HandlerRegistrationError
from .retries import BACKOFF_CHOICES

if TYPE_CHECKING:
    from .records import TaskInfo

R = TypeVar("R")


class TaskHandler(Generic[R]):
    """A registered handler. Calling it runs the function directly; ``.submit()`` queues it."""

    def __init__(
        self,
        func: Callable[..., R],
        *,
        name: str,
        param_type: Any = None,
        queue: str = "default",
        priority: int = 0,
        retry_limit: int | None = None,
        retry_interval: int | None = None,
        retry_backoff: str | None = None,
        max_duration_millis: int | None = None,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        takes_context: bool = False,
    ) -> None:
        self.func = func
        self.name = name
        self.param_type = param_type
        self.queue = queue
        self.priority = priority
        self.retry_limit = retry_limit
        self.retry_interval = retry_interval
        self.retry_backoff = retry_backoff
        self.max_duration_millis = max_duration_millis
        self.retry_on = retry_on
        self.takes_context = takes_context
        self.accepts_parameter = param_type is not None or _takes_positional(func)
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.func(*args, **kwargs)

    def submit(self, parameter: Any = None, **options: Any) -> TaskInfo:
        """Queue this handler with ``parameter``; options as for ``executor.submit``."""
        from .service import executor

        return executor.submit(self.name, parameter, **options)

    def __repr__(self) -> str:
        return f"<TaskHandler {self.name}>"


def _takes_positional(func: Callable[..., Any]) -> bool:
    """Whether the handler has a parameter slot (besides ``context``)."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(p.kind in positional and p.name != "context" for p in parameters)


_handlers: dict[str, TaskHandler[Any]] = {}
_lock = threading.Lock()


def _validate_options(name: str, options: dict[str, Any]) -> None:
    def bad(message: str) -> HandlerRegistrationError:
        return HandlerRegistrationError(f"@reliable_task_handler(name={name!r}): {message}")

    if not isinstance(name, str) or not name or len(name) > 191:
        raise bad("name must be a non-empty string of at most 191 characters")
    for key in ("retry_limit", "retry_interval"):
        value = options[key]
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise bad(f"{key} must be an integer >= 0, got {value!r}")
    if options["retry_backoff"] is not None and options["retry_backoff"] not in BACKOFF_CHOICES:
        raise bad(
            f"retry_backoff must be one of {BACKOFF_CHOICES}, got {options['retry_backoff']!r}"
        )
    duration = options["max_duration_millis"]
    if duration is not None and (
        not isinstance(duration, int) or isinstance(duration, bool) or duration < 1
    ):
        raise bad(f"max_duration_millis must be a positive integer, got {duration!r}")
    # The same rule submit applies, so a bad queue fails at import rather than at every submit.
    queue = options["queue"]
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > 100
        or any(c.isspace() or c == "," for c in queue)
    ):
        raise bad(f"queue must be 1..100 characters without whitespace or commas, got {queue!r}")
    priority = options["priority"]
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise bad(f"priority must be an integer, got {priority!r}")
    retry_on = options["retry_on"]
    if not isinstance(retry_on, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
    ):
        raise bad("retry_on must be a tuple of exception classes")


def reliable_task_handler(
    name: str | None = None,
    *,
    param_type: Any = None,
    queue: str = "default",
    priority: int = 0,
    retry_limit: int | None = None,
    retry_interval: int | None = None,
    retry_backoff: str | None = None,
    max_duration_millis: int | None = None,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    takes_context: bool = False,
) -> Callable[[Callable[..., R]], TaskHandler[R]]:
    """Register a function as the handler of ``name`` (default ``module.qualname``).

    Options left as None take the RELIABLE_EXECUTOR defaults when a task is submitted.
    """
    if isinstance(retry_on, type):
        retry_on = (retry_on,)
    retry_on = tuple(retry_on)

    def decorate(func: Callable[..., R]) -> TaskHandler[R]:
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        options = dict(
            param_type=param_type,
            queue=queue,
            priority=priority,
            retry_limit=retry_limit,
            retry_interval=retry_interval,
            retry_backoff=retry_backoff,
            max_duration_millis=max_duration_millis,
            retry_on=retry_on,
            takes_context=takes_context,
        )
        _validate_options(task_name, options)
        handler: TaskHandler[R] = TaskHandler(func, name=task_name, **options)
        register(handler)
        return handler

    return decorate


def register(handler: TaskHandler[Any]) -> None:
    """Add a handler; re-registering the same function (a module imported twice) replaces it."""
    with _lock:
        existing = _handlers.get(handler.name)
        if existing is not None and _identity(existing.func) != _identity(handler.func):
            raise HandlerRegistrationError(
                f"task name {handler.name!r} is already registered to "
                f"{existing.func.__module__}.{existing.func.__qualname__}"
            )
        _handlers[handler.name] = handler


def _identity(func: Callable[..., Any]) -> tuple[str, str]:
    return (func.__module__, func.__qualname__)


def get_handler(name: str) -> TaskHandler[Any] | None:
    return _handlers.get(name)


def all_handlers() -> dict[str, TaskHandler[Any]]:
    return dict(_handlers)


def unregister(name: str) -> None:
    """Remove a handler (tests)."""
    with _lock:
        _handlers.pop(name, None)
