"""What a caller asks for when submitting: the request record and the submit's keyword options."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any, TypedDict


@dataclasses.dataclass(frozen=True)
class TaskSubmitRequest:
    """What a caller asks for. Options left as None take the handler's, then the settings' value.

    Attributes:
        task_name: A registered handler's name.
        task_parameter: A JSON value, or an instance of the handler's ``param_type``.
        task_id: Your id for the task (1..191 characters, no whitespace); default a uuid4
            hex. An id that exists returns the stored task and stores nothing.
        retry_limit: Retries after the first attempt.
        retry_interval: Milliseconds (or a timedelta) before a retry; the base of
            exponential backoff.
        retry_backoff: ``"fixed"`` or ``"exponential"``.
        max_duration_millis: Milliseconds (or a timedelta) from creation until the task
            is TIMEOUT.
        queue: Which workers take it (``runexecutor --queues``).
        priority: A 32-bit integer; among due tasks of a queue, higher runs first.
        delay_millis: Run no earlier than this many milliseconds (or a timedelta) from now.
        run_at: Run no earlier than this aware datetime; not with ``delay_millis``.
        unique_for: Seconds (or a timedelta) during which a submit of the same key returns
            the live task already submitted.
        unique_key: What makes two unique submits the same; default the task name and the
            parameter's canonical JSON.
        rate_key: Tasks of a rate-limited name sharing this key share one limit.
        concurrency_key: Of a name with ``max_concurrency_per_key``, at most that many
            tasks sharing this key are held at once (docs/flow-control.md, "Tenants").
        debounce: Seconds (or a timedelta): submits of one key (``unique_key``, else the
            parameter) keep one waiting task, which runs this long after the last of them.
        debounce_max_wait: Seconds (or a timedelta): ...but never later than this after the
            first of them.
        depends_on: Task ids that must end before this task may start.
        on_dependency_failure: ``"cancel"`` this task when a dependency ends badly, or
            ``"run"`` it anyway.
        tags: Up to 20 strings of 1..64 characters to find the task by
            (``list_tasks(tag=...)``); duplicates are dropped.
    """

    task_name: str
    task_parameter: Any = None
    task_id: str | None = None
    retry_limit: int | None = None
    # Durations: milliseconds (unique_for: seconds), or a datetime.timedelta.
    retry_interval: int | dt.timedelta | None = None
    retry_backoff: str | None = None  # "fixed" | "exponential"
    max_duration_millis: int | dt.timedelta | None = None
    queue: str | None = None
    priority: int | None = None
    delay_millis: int | dt.timedelta = 0
    run_at: dt.datetime | None = None
    # Unique tasks: while a task submitted with the same key within ``unique_for`` seconds
    # has not ended (docs/guarantees.md), a submit returns that task and stores nothing.
    unique_for: float | dt.timedelta | None = None
    unique_key: str | None = None  # default: the task name and the parameter's canonical JSON
    rate_key: str | None = None  # tasks of a name sharing it share its rate_limit
    # Tasks of a name sharing it share its max_concurrency_per_key (None: no key).
    concurrency_key: str | None = None
    # Debounce (core/debouncing.py): seconds, or timedeltas.
    debounce: float | dt.timedelta | None = None
    debounce_max_wait: float | dt.timedelta | None = None
    # Dependencies (dependencies.py): the task waits, CREATED and unclaimable, until every one
    # of these task ids has ended; a failed one cancels it unless on_dependency_failure="run".
    depends_on: Sequence[str] | None = None
    on_dependency_failure: str = "cancel"  # "cancel" | "run"
    # Seconds (or a timedelta) each attempt may run: one running longer is asked to stop
    # (hard under --pool process) and counts as a failed attempt (docs/retries.md).
    attempt_timeout: float | dt.timedelta | None = None
    # Strings to find the task by (list_tasks(tag=...)): core/tags.py checks them.
    tags: Sequence[str] | None = None


class SubmitOptions(TypedDict, total=False):
    """The keyword options of ``executor.submit`` and ``handler.submit``: the fields of
    TaskSubmitRequest but its task name and parameter (a type checker then names a misspelled
    one; at run time it is refused by name all the same)."""

    task_id: str | None
    retry_limit: int | None
    retry_interval: int | dt.timedelta | None
    retry_backoff: str | None
    max_duration_millis: int | dt.timedelta | None
    queue: str | None
    priority: int | None
    delay_millis: int | dt.timedelta
    run_at: dt.datetime | None
    unique_for: float | dt.timedelta | None
    unique_key: str | None
    rate_key: str | None
    concurrency_key: str | None
    debounce: float | dt.timedelta | None
    debounce_max_wait: float | dt.timedelta | None
    depends_on: Sequence[str] | None
    on_dependency_failure: str
    attempt_timeout: float | dt.timedelta | None
    tags: Sequence[str] | None
