"""The @reliable_task_handler decorator and the registry of handlers by task name."""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack

from .core.flow_limits import FlowLimits
from .core.option_names import guess
from .core.rate_limits import RateLimit, parse_rate_limit
from .exceptions import HandlerRegistrationError
from .handler_options import ScheduleSpec, declared, normalized, validate_options
from .schedules.records import Schedule

if TYPE_CHECKING:
    from .core.records import SubmitOptions, TaskInfo

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
        max_concurrency: int | None = None,
        max_concurrency_per_key: int | None = None,
        fairness: str | None = None,
        debounce: float | None = None,
        debounce_max_wait: float | None = None,
        unique_for: float | None = None,
        rate_limit: str | None = None,
        attempt_timeout: float | None = None,
        origin: Any = None,
    ) -> None:
        self.func = func
        # What the handler was made from when not from a decorated function: the Django Task
        # of the Tasks backend (tasks_backend), which its results and signals are reported for.
        self.origin = origin
        # Asked for every claim the worker takes (which pool runs it): looked up once here.
        self.is_async = inspect.iscoroutinefunction(func)
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
        # Most tasks of this name held (claimed, started or not) at once across all workers.
        self.max_concurrency = max_concurrency
        # Most tasks of this name and one concurrency_key held at once across all workers.
        self.max_concurrency_per_key = max_concurrency_per_key
        # "round_robin": claims take this name's keys in turn (core/fairness.py).
        self.fairness = fairness
        # Seconds a submit waits for later ones of its key to join it (core/debouncing.py).
        self.debounce = debounce
        self.debounce_max_wait = debounce_max_wait
        # Seconds a submit of the same name and parameter returns the live task already
        # submitted instead of storing another (a submit's own unique_for comes first).
        self.unique_for = unique_for
        # Most tasks of this name (per rate_key) started in any window, across all workers.
        self.rate_limit: RateLimit | None = (
            parse_rate_limit(rate_limit) if rate_limit is not None else None
        )
        # Seconds each attempt may run (a submit's own attempt_timeout comes first); also
        # the limit of tasks stored without one (a schedule's runs, say).
        self.attempt_timeout = None if attempt_timeout is None else float(attempt_timeout)
        # Schedules declared with the decorator's ``schedule=`` (saved by runexecutor).
        self.schedules: tuple[Schedule, ...] = ()
        self.accepts_parameter = param_type is not None or _takes_positional(func)
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.func(*args, **kwargs)

    def submit(self, parameter: Any = None, **options: Unpack[SubmitOptions]) -> TaskInfo:
        """Queue this handler with ``parameter``; options as for ``executor.submit``."""
        if _submitter is None:
            raise RuntimeError(
                f"{self.name!r}.submit() needs the executor, connected when Django starts "
                "(django.setup())"
            )
        return _submitter(self.name, parameter, **options)

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
# limited_homes() until the registry changes: a sharded Redis storage reads it for every task
# it stores and every claim round, so it is built once, not once per read.
_limited_homes: Mapping[str, str] | None = None
# ``executor.submit``, which ``TaskHandler.submit`` goes through. The service sits above this
# module (it looks handlers up here), so the app connects it when Django starts (apps.ready).
_submitter: Callable[..., TaskInfo] | None = None


def connect_submitter(submit: Callable[..., TaskInfo]) -> None:
    """Make ``TaskHandler.submit`` call ``submit(task_name, parameter, **options)``."""
    global _submitter
    _submitter = submit


def reliable_task_handler(
    name: str | None = None,
    *,
    param_type: Any = None,
    queue: str = "default",
    priority: int = 0,
    retry_limit: int | None = None,
    retry_interval: int | dt.timedelta | None = None,
    retry_backoff: str | None = None,
    max_duration_millis: int | dt.timedelta | None = None,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    takes_context: bool = False,
    max_concurrency: int | None = None,
    max_concurrency_per_key: int | None = None,
    fairness: str | None = None,
    debounce: float | dt.timedelta | None = None,
    debounce_max_wait: float | dt.timedelta | None = None,
    unique_for: float | dt.timedelta | None = None,
    rate_limit: str | None = None,
    attempt_timeout: float | dt.timedelta | None = None,
    schedule: ScheduleSpec | Sequence[ScheduleSpec] | None = None,
    **unknown: Any,
) -> Callable[[Callable[..., R]], TaskHandler[R]]:
    """Register a function as the handler of ``name`` (default ``module.qualname``).

    Options left as None take the RELIABLE_EXECUTOR defaults when a task is submitted; each
    is described in docs/handlers.md. ``max_concurrency`` caps the tasks of this name held at
    once across every worker, ``max_concurrency_per_key`` those of one ``concurrency_key``;
    ``fairness="round_robin"`` takes the keys' due tasks in turn instead of the oldest first;
    ``rate_limit`` ("N/s", "N/m", "N/h") the starts in any such window, per ``rate_key``
    (docs/flow-control.md). ``unique_for`` makes every submit unique; ``debounce`` (with
    ``debounce_max_wait``) makes submits of one key join the task still waiting.
    ``attempt_timeout`` limits each attempt (docs/retries.md). ``schedule`` fires the task
    periodically: a cron string, seconds, a timedelta, a ``Schedule(...)`` or a list of them.
    """
    if unknown:
        _refuse_unknown(name, unknown)
    options = normalized(
        param_type=param_type,
        queue=queue,
        priority=priority,
        retry_limit=retry_limit,
        retry_interval=retry_interval,
        retry_backoff=retry_backoff,
        max_duration_millis=max_duration_millis,
        retry_on=retry_on,
        takes_context=takes_context,
        max_concurrency=max_concurrency,
        max_concurrency_per_key=max_concurrency_per_key,
        fairness=fairness,
        debounce=debounce,
        debounce_max_wait=debounce_max_wait,
        unique_for=unique_for,
        rate_limit=rate_limit,
        attempt_timeout=attempt_timeout,
    )

    def decorate(func: Callable[..., R]) -> TaskHandler[R]:
        return _registered(func, name, options, schedule)

    return decorate


def _refuse_unknown(name: str | None, unknown: Mapping[str, Any]) -> None:
    """Raised here rather than as Python's TypeError, to say what was probably meant."""
    known = [p for p in inspect.signature(reliable_task_handler).parameters if p != "unknown"]
    named = ", ".join(f"{key}{guess(key, known)}" for key in sorted(unknown))
    raise HandlerRegistrationError(
        f"@reliable_task_handler(name={name!r}): unknown option(s): {named}"
    )


def _registered(
    func: Callable[..., R],
    name: str | None,
    options: dict[str, Any],
    schedule: ScheduleSpec | Sequence[ScheduleSpec] | None,
) -> TaskHandler[R]:
    """The handler of ``func`` with these options, validated and registered."""
    task_name = name or f"{func.__module__}.{func.__qualname__}"
    validate_options(task_name, options)
    handler: TaskHandler[R] = TaskHandler(func, name=task_name, **options)
    handler.schedules = declared(task_name, schedule)
    register(handler)
    return handler


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
        _forget_limited_homes()


def _identity(func: Callable[..., Any]) -> tuple[str, str]:
    return (func.__module__, func.__qualname__)


def get_handler(name: str) -> TaskHandler[Any] | None:
    return _handlers.get(name)


_resolvers: list[Callable[[str], TaskHandler[Any] | None]] = []


def register_resolver(resolver: Callable[[str], TaskHandler[Any] | None]) -> None:
    """Add a way for a worker to find the handler of a task name nobody registered yet (the
    Django Tasks backend imports the task's module by its path)."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def resolve_handler(name: str) -> TaskHandler[Any] | None:
    """The registered handler of ``name``, else the first a resolver finds (workers only:
    submitting never imports anything by name)."""
    handler = _handlers.get(name)
    if handler is not None:  # every task but a first one of a name a resolver finds
        return handler
    for resolver in list(_resolvers):
        handler = resolver(name)
        if handler is not None:
            break
    return handler


def all_handlers() -> dict[str, TaskHandler[Any]]:
    return dict(_handlers)


def name_limits() -> dict[str, int]:
    """``{task_name: max_concurrency}`` of the registered handlers that have a cap."""
    return {
        name: handler.max_concurrency
        for name, handler in list(_handlers.items())
        if handler.max_concurrency is not None
    }


def key_limits() -> dict[str, int]:
    """``{task_name: max_concurrency_per_key}`` of the registered handlers that have one."""
    return {
        name: handler.max_concurrency_per_key
        for name, handler in list(_handlers.items())
        if handler.max_concurrency_per_key is not None
    }


def fair_names() -> frozenset[str]:
    """The names of the registered handlers with ``fairness="round_robin"``."""
    return frozenset(
        name for name, handler in list(_handlers.items()) if handler.fairness is not None
    )


def _limited(handler: TaskHandler[Any]) -> bool:
    """Whether the handler has a limit (or fairness) its tasks are claimed under one name at a
    time."""
    return (
        handler.rate_limit is not None
        or handler.max_concurrency is not None
        or handler.max_concurrency_per_key is not None
        or handler.fairness is not None
    )


def rate_limits() -> dict[str, RateLimit]:
    """``{task_name: RateLimit}`` of the registered handlers that have a rate limit."""
    return {
        name: handler.rate_limit
        for name, handler in list(_handlers.items())
        if handler.rate_limit is not None
    }


def limited_names() -> frozenset[str]:
    """The names of the registered handlers with a ``rate_limit``, a ``max_concurrency`` or
    a ``max_concurrency_per_key``: the worker claims their tasks one name at a time."""
    return frozenset(name for name, handler in list(_handlers.items()) if _limited(handler))


def limited_homes() -> Mapping[str, str]:
    """``{task_name: queue}`` of the names of ``limited_names``, each with its own (decorator)
    queue: a sharded Redis storage keeps every task of the name on that queue's shard. Built
    under the registry's lock, so that a change of the registry never leaves it stale."""
    global _limited_homes
    homes = _limited_homes
    if homes is None:
        with _lock:
            if _limited_homes is None:
                _limited_homes = MappingProxyType(
                    {
                        name: handler.queue
                        for name, handler in _handlers.items()
                        if _limited(handler)
                    }
                )
            homes = _limited_homes
    return homes


def _forget_limited_homes() -> None:
    """Drop limited_homes' copy (the caller holds the registry's lock)."""
    global _limited_homes
    _limited_homes = None


#: The registry's limited names, as the service builds its storage with them.
FLOW_LIMITS = FlowLimits(
    names=limited_names,
    keyed=lambda: key_limits().keys(),
    homes=limited_homes,
    fair=fair_names,
    known=lambda: frozenset(list(_handlers)),
)


def declared_schedules() -> list[Schedule]:
    """Every schedule declared with ``@reliable_task_handler(schedule=...)``."""
    return [spec for handler in list(_handlers.values()) for spec in handler.schedules]


def unregister(name: str) -> None:
    """Remove a handler (tests)."""
    with _lock:
        _handlers.pop(name, None)
        _forget_limited_homes()
