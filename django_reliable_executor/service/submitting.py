"""A submit request checked and turned into the task the storage stores (``NewTask``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import unicodedata
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..conf import ExecutorSettings
from ..core.debouncing import KEY_HOLD, debounce_digest, debounce_window, debounced_run_at
from ..core.dependencies import (
    ID_FORBIDDEN_CATEGORIES,
    check_dependencies,
    first_missing,
)
from ..core.ids import MAX_ID_LENGTH, is_fire_task_id
from ..core.option_names import guess
from ..core.options import NAMES as OPTION_NAMES
from ..core.options import TaskOptions, check_option, numeric_durations
from ..core.parameter_index import index_entries
from ..core.rate_limits import key_problem
from ..core.records import NewTask, TaskSubmitRequest
from ..core.serialization import (
    ConversionError,
    Encoded,
    dumps,
    from_json_value,
    to_json_value,
)
from ..core.tags import checked_tags
from ..core.text import check_caller_text
from ..core.uniqueness import unique_digest, unique_window
from ..exceptions import (
    InvalidParameterError,
    InvalidTaskIdError,
    InvalidTaskOptionError,
    ParameterTooLargeError,
    ReservedTaskIdError,
    TaskSubmitError,
    UnknownTaskError,
)
from ..registry import TaskHandler, get_handler

if TYPE_CHECKING:
    from ..storage.base import TaskStorage


def request_time(now: dt.datetime, index: int, count: int) -> dt.datetime:
    """The submit time of request ``index`` of ``count`` in one call: a microsecond after the
    one before, the last at ``now`` (none in the future: a task due now stays due now), so that
    the call's tasks are claimed in request order (claims take the oldest first; one shared
    instant left them in any order on the databases, which insert by task id)."""
    return now - dt.timedelta(microseconds=count - 1 - index)


def prepare(
    request: TaskSubmitRequest,
    now: dt.datetime,
    settings: ExecutorSettings,
    index: int,
    trace_context: dict[str, str] | None = None,
    new_id: Callable[[str, str], str] | None = None,
) -> NewTask:
    """The task ``request`` stores, its options completed from its handler and the settings;
    raises a TaskSubmitError subclass naming the bad field (``index``: its place in a batch).
    ``trace_context``: the submitter's span (tracing.current_trace_context), stored with it.
    ``new_id``: the storage's new_task_id, for a request without a task_id (else a uuid4)."""
    if not isinstance(request, TaskSubmitRequest):
        raise TaskSubmitError(
            f"request #{index} must be a TaskSubmitRequest, got {type(request).__name__}"
        )
    request = numeric_durations(request)
    name = request.task_name
    handler = _handler(name, settings)
    given_id = _task_id(request.task_id)
    parameter = _parameter(request.task_parameter, handler, settings)

    # The submit's own options, then the handler's, then the settings' defaults.
    options = TaskOptions.of(request, handler, settings.task_options).validate(
        required=OPTION_NAMES
    )
    debounce = _debounce(request, handler)
    key, unique_until, run_at = _key_window(
        request, handler, parameter, now, _run_at(request, now), debounce
    )
    # A task naming no id gets one from the storage, which may choose by queue (new_task_id).
    queue = cast(str, options.queue)
    task_id = given_id if given_id is not None else (new_id or _new_id)(queue, name)
    depends_on = _depends_on(request, task_id)
    return NewTask(
        task_id=task_id,
        task_name=name,
        # (validate(required=...) left None only in max_duration_millis, attempt_timeout)
        queue=queue,
        priority=cast(int, options.priority),
        parameter=parameter,
        retry_limit=cast(int, options.retry_limit),
        retry_interval=cast(int, options.retry_interval),
        retry_backoff=cast(str, options.retry_backoff),
        max_duration_millis=options.max_duration_millis,
        created_at=now,
        run_at=run_at,
        deadline_at=_deadline(run_at if debounce else now, options.max_duration_millis),
        unique_key=key,
        unique_until=unique_until,
        debounce=None if debounce is None else debounce[0],
        debounce_max_wait=None if debounce is None else debounce[1],
        rate_key=_key("rate_key", request.rate_key),
        concurrency_key=_key("concurrency_key", request.concurrency_key),
        tags=checked_tags(request.tags),
        indexed=index_entries(parameter, settings.SEARCHABLE_PARAMETERS),
        depends_on=depends_on,
        on_dependency_failure=request.on_dependency_failure,
        trace_context=trace_context,
        # Stored as float seconds whatever number was given (TaskInfo reads it back so).
        attempt_timeout=None if options.attempt_timeout is None else float(options.attempt_timeout),
    )


def _deadline(start: dt.datetime, max_duration_millis: int | None) -> dt.datetime | None:
    """When a task started counting at ``start`` is TIMEOUT (None: no max duration). A
    debounced task counts from when it is due: each submit that joins it moves both."""
    if not max_duration_millis:
        return None
    return start + dt.timedelta(milliseconds=max_duration_millis)


def _handler(name: Any, settings: ExecutorSettings) -> TaskHandler[Any] | None:
    """The handler of task name ``name``, checked (None for an unknown name the settings
    allow)."""
    if not isinstance(name, str) or not name or len(name) > MAX_ID_LENGTH:
        raise UnknownTaskError(
            f"task_name must be a non-empty string of at most {MAX_ID_LENGTH} characters, "
            f"got {name!r}",
            field="task_name",
        )
    check_caller_text(name, "task_name", UnknownTaskError)
    handler = get_handler(name)
    if handler is None and not settings.ALLOW_UNKNOWN_TASKS:
        raise UnknownTaskError(
            f"task_name {name!r} has no registered handler (is its tasks module in an "
            "installed app? Set ALLOW_UNKNOWN_TASKS to submit for another service)",
            field="task_name",
        )
    return handler


def _key_window(
    request: TaskSubmitRequest,
    handler: TaskHandler[Any] | None,
    parameter: Any,
    now: dt.datetime,
    run_at: dt.datetime,
    debounce: tuple[float, float | None, str | None] | None,
) -> tuple[str | None, dt.datetime | None, dt.datetime]:
    """A unique or debounced submit's stored key and when its row may go, and when the task
    runs (a debounced one: ``debounce`` from now); (None, None, ``run_at``) for another."""
    name = request.task_name
    if debounce is not None:
        seconds, max_wait, key = debounce
        run_at = debounced_run_at(now, now, seconds, max_wait)
        return debounce_digest(name, key, parameter), run_at + KEY_HOLD, run_at
    unique, unique_key, until = unique_window(
        request.unique_for, request.unique_key, getattr(handler, "unique_for", None), now
    )
    return (unique_digest(name, unique_key, parameter) if unique else None), until, run_at


def _debounce(
    request: TaskSubmitRequest, handler: TaskHandler[Any] | None
) -> tuple[float, float | None, str | None] | None:
    """The submit's debounce (its own, else its handler's), checked with what it cannot go
    with: (seconds, longest wait, unique_key); None when the submit is not debounced."""
    # Each from the submit, else the handler: a submit's own debounce keeps the handler's
    # longest wait (which bounds how long later submits may postpone the task).
    seconds = request.debounce
    if seconds is None:
        seconds = getattr(handler, "debounce", None)
    max_wait = request.debounce_max_wait
    if max_wait is None:
        max_wait = getattr(handler, "debounce_max_wait", None)
    if seconds is None:
        if max_wait is not None:
            raise InvalidTaskOptionError(
                "debounce_max_wait needs debounce", field="debounce_max_wait"
            )
        return None
    for field, given, why in (
        (
            "unique_for",
            request.unique_for,
            "debounce keeps the newest submit of a key, unique_for the first",
        ),
        ("depends_on", request.depends_on, "a debounced task may be replaced by a later submit"),
        ("delay_millis", request.delay_millis or None, "debounce sets when the task runs"),
        ("run_at", request.run_at, "debounce sets when the task runs"),
    ):
        if given is not None:
            raise InvalidTaskOptionError(f"debounce does not go with {field}: {why}", field=field)
    if request.unique_for is None and getattr(handler, "unique_for", None) is not None:
        raise InvalidTaskOptionError(
            "debounce does not go with the handler's unique_for: debounce keeps the newest "
            "submit of a key, unique_for the first",
            field="debounce",
        )
    return debounce_window(seconds, max_wait, request.unique_key)


def _key(option: str, value: Any) -> str | None:
    """A ``rate_key`` or ``concurrency_key``, checked."""
    problem = key_problem(option, value)
    if problem is not None:
        raise InvalidTaskOptionError(problem, field=option)
    return cast("str | None", value)


def _depends_on(request: TaskSubmitRequest, task_id: str) -> tuple[str, ...]:
    """The request's dependencies, checked (none given: ``()``)."""
    if request.depends_on is None and request.on_dependency_failure == "cancel":
        return ()
    return check_dependencies(
        request.depends_on,
        request.on_dependency_failure,
        task_id,
        delayed=bool(request.delay_millis) or request.run_at is not None,
    )


def _new_id(queue: str, task_name: str) -> str:
    return uuid.uuid4().hex


def _task_id(task_id: Any) -> str | None:
    """The given task id checked (None when none is given)."""
    if task_id is None:
        return None
    if not isinstance(task_id, str):
        raise InvalidTaskIdError(
            f"task_id must be a string, got {type(task_id).__name__}", field="task_id"
        )
    if not 1 <= len(task_id) <= MAX_ID_LENGTH:
        raise InvalidTaskIdError(
            f"task_id must be 1..{MAX_ID_LENGTH} characters, got {len(task_id)}",
            field="task_id",
        )
    for char in task_id:
        if char.isspace() or unicodedata.category(char) in ID_FORBIDDEN_CATEGORIES:
            raise InvalidTaskIdError(
                f"task_id {task_id!r} contains whitespace or a control character ({char!r})",
                field="task_id",
            )
    if is_fire_task_id(task_id):
        raise ReservedTaskIdError(
            f"task_id {task_id!r} has the form of a schedule's run "
            "('<schedule_id>@<YYYYmmddTHHMMSS>Z', perhaps then '~<k>'), which only the schedule "
            "may submit: choose an id of another form",
            field="task_id",
        )
    return task_id


def _parameter(value: Any, handler: TaskHandler[Any] | None, settings: ExecutorSettings) -> Any:
    try:
        plain = to_json_value(value)
        text = dumps(plain)
    except (ConversionError, ValueError, RecursionError) as exc:
        raise InvalidParameterError(
            f"task_parameter is not JSON-serialisable: {exc}", field="task_parameter"
        ) from exc
    size = len(text.encode("utf-8"))
    if size > settings.MAX_PARAMETER_BYTES:
        raise ParameterTooLargeError(
            f"task_parameter is {size} bytes as JSON, over MAX_PARAMETER_BYTES "
            f"({settings.MAX_PARAMETER_BYTES})",
            field="task_parameter",
        )
    if handler is not None:
        if not handler.accepts_parameter and plain is not None:
            raise InvalidParameterError(
                f"task_parameter must be None: handler {handler.name!r} takes no parameter, "
                f"got {type(value).__name__}",
                field="task_parameter",
            )
        if handler.param_type is not None:
            try:
                from_json_value(plain, handler.param_type)
            except ConversionError as exc:
                raise InvalidParameterError(
                    f"task_parameter does not fit the param_type of {handler.name!r}: {exc}",
                    field="task_parameter",
                ) from exc
    return plain


def event_payload(value: Any, max_bytes: int) -> Encoded:
    """An event's payload (``executor.send_event``) as stored: a JSON value every storage
    holds, of at most ``max_bytes`` (MAX_PARAMETER_BYTES) as JSON; ValueError naming it."""
    try:
        plain = to_json_value(value)
        text = dumps(plain)
    except (ConversionError, ValueError, RecursionError) as exc:
        raise ValueError(f"payload is not JSON-serialisable: {exc}") from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ValueError(f"payload is {size} bytes as JSON, over MAX_PARAMETER_BYTES ({max_bytes})")
    return Encoded(plain, text)


def _run_at(request: TaskSubmitRequest, now: dt.datetime) -> dt.datetime:
    check_option("delay_millis", request.delay_millis)  # a number by now (numeric_durations)
    delay = cast(int, request.delay_millis)
    if request.run_at is None:
        return now + dt.timedelta(milliseconds=delay)
    if delay:
        raise InvalidTaskOptionError("give either delay_millis or run_at, not both", field="run_at")
    run_at = request.run_at
    if not isinstance(run_at, dt.datetime) or run_at.tzinfo is None:
        raise InvalidTaskOptionError(
            f"run_at must be an aware datetime, got {run_at!r}", field="run_at"
        )
    try:
        return max(run_at.astimezone(dt.timezone.utc), now)
    except OverflowError:  # e.g. datetime.max in a zone west of UTC
        raise InvalidTaskOptionError(
            f"run_at is out of the datetime range in UTC, got {run_at!r}", field="run_at"
        ) from None


def check_dependencies_exist(
    storage: TaskStorage,
    tasks: Sequence[NewTask],
    coming: Collection[str] = (),
    skipped: Collection[str] = (),
) -> None:
    """Raise InvalidDependencyError unless every dependency of ``tasks`` is stored or is a
    task of ``tasks`` before it that the call stores, or of ``coming`` (tasks to be written
    before these). ``skipped``: the ids of ``tasks`` the write will not store, as things stand
    (a live task holds their unique key). For storages that cannot check it while they write
    (the write waits for a commit); the write checks again."""
    wanted = {d for task in tasks for d in task.depends_on if d not in coming}
    if not wanted:
        return
    # A dependent whose id is stored is returned as it is: its dependencies are not checked.
    wanted.update(task.task_id for task in tasks if task.depends_on)
    stored = set(storage.get_many(sorted(wanted))) | set(coming)
    error = first_missing(tasks, stored, skipped)
    if error is not None:
        raise error


# Options of the handler's decorator a submit cannot override: the refusal says where they go.
HANDLER_ONLY = frozenset(
    ("fairness", "max_concurrency", "max_concurrency_per_key", "rate_limit", "retry_on")
)


def _handler_only(name: str) -> str:
    if name not in HANDLER_ONLY:
        return ""
    return f" ({name} is an option of the handler: @reliable_task_handler({name}=...))"


def request_of(task_name: str, parameter: Any, options: Mapping[str, Any]) -> TaskSubmitRequest:
    """The request ``executor.submit(task_name, parameter, **options)`` makes; an unknown
    option is refused by name, with the closest known one."""
    fields = {f.name for f in dataclasses.fields(TaskSubmitRequest)}
    unknown = sorted(set(options) - fields)
    if unknown:
        named = ", ".join(f"{name}{guess(name, fields)}{_handler_only(name)}" for name in unknown)
        raise InvalidTaskOptionError(f"unknown submit option(s): {named}", field=unknown[0])
    return TaskSubmitRequest(task_name=task_name, task_parameter=parameter, **options)


def chain_steps(requests: Sequence[TaskSubmitRequest]) -> list[TaskSubmitRequest]:
    """``requests`` as the steps of a chain (``executor.chain``): each depends on the one
    before it as well as on its own ``depends_on``; steps without a task_id get one."""
    steps: list[TaskSubmitRequest] = []
    previous: str | None = None
    for index, request in enumerate(requests):
        if not isinstance(request, TaskSubmitRequest):
            raise TaskSubmitError(
                f"request #{index} must be a TaskSubmitRequest, got {type(request).__name__}"
            )
        task_id = request.task_id if request.task_id is not None else uuid.uuid4().hex
        own = request.depends_on
        if own is not None and (
            isinstance(own, (str, bytes, bytearray, Mapping)) or not isinstance(own, Iterable)
        ):
            # No list to add the previous step to (a mapping's keys are none either):
            # refused as submit_many refuses it, naming the field.
            check_dependencies(own, request.on_dependency_failure, task_id, delayed=False)
        depends_on = [*(own or ()), *([previous] if previous is not None else [])]
        steps.append(dataclasses.replace(request, task_id=task_id, depends_on=depends_on or None))
        previous = task_id
    return steps
