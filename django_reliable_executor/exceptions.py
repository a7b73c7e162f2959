"""Exceptions raised to callers: every bad submit is a TaskSubmitError subclass."""

from __future__ import annotations

import datetime as dt


class ReliableExecutorError(Exception):
    """Base class of every error this app raises on purpose."""


class TaskSubmitError(ReliableExecutorError, ValueError):
    """A submit was refused; nothing was stored. ``field`` names what was wrong."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidTaskIdError(TaskSubmitError):
    """The task_id is empty, too long, not a string, or contains whitespace/control characters."""


class ReservedTaskIdError(InvalidTaskIdError):
    """The task_id has the form of a schedule's fire id (``<schedule_id>@<UTC time>Z``, perhaps
    followed by ``~<k>``), which only the schedules' firing may store."""


class UnknownTaskError(TaskSubmitError):
    """No handler is registered under the task_name (and ALLOW_UNKNOWN_TASKS is off)."""


class InvalidParameterError(TaskSubmitError):
    """The parameter is not JSON-serialisable or does not fit the handler's param_type."""


class ParameterTooLargeError(InvalidParameterError):
    """The serialised parameter is larger than MAX_PARAMETER_BYTES."""


class InvalidTaskOptionError(TaskSubmitError):
    """A submit option (retry_limit, queue, priority, run_at, ...) has a bad value."""


class InvalidDependencyError(TaskSubmitError):
    """``depends_on`` names a task that does not exist, the task itself, too many ids, or is
    combined with a delay; ``field`` is "depends_on" (or "on_dependency_failure"). Also
    either option given to a batch callback (``field`` "on_complete.depends_on", say)."""


class TaskSubmitConflictError(TaskSubmitError):
    """Another transaction stored the same task_id after the caller's transaction took its
    snapshot (PostgreSQL REPEATABLE READ or SERIALIZABLE), so the stored task cannot be read in
    it. The transaction cannot return that task: roll it back and run it again."""


class HandlerRegistrationError(ReliableExecutorError):
    """Two different functions were registered under one task name, or options are invalid."""


class StorageUnavailableError(ReliableExecutorError):
    """The storage could not be reached; the operation did not happen."""


class AttemptStillRunningError(ReliableExecutorError):
    """A manual retry was refused: the task timed out, but the handler of its previous attempt
    is still running on ``worker_id``, whose lease on it lasts until ``lease_expires_at``
    (renewed while the handler runs). Retrying then would run the task twice at once."""

    def __init__(self, task_id: str, worker_id: str | None, lease_expires_at: dt.datetime) -> None:
        super().__init__(
            f"its previous attempt is still running on worker {worker_id} (lease until "
            f"{lease_expires_at.isoformat(timespec='seconds')}, renewed while it runs); "
            "retry once it has ended"
        )
        self.task_id = task_id
        self.worker_id = worker_id
        self.lease_expires_at = lease_expires_at


class DependencyNotCompletedError(ReliableExecutorError):
    """A manual retry of a dependent was refused: its dependency ``dependency_id`` ended
    ``status`` rather than COMPLETED (None: it was purged, so whether it completed is not
    known), and the dependent waits for completed dependencies (``on_dependency_failure``
    "cancel"). Retried, it would run without what it depends on."""

    def __init__(self, task_id: str, dependency_id: str, status: str | None) -> None:
        ended = (
            "is no longer stored (purged), so whether it completed is not known"
            if status is None
            else f"ended {status}"
        )
        super().__init__(
            f"its dependency {dependency_id} {ended}, and it runs only after its dependencies "
            "completed (on_dependency_failure='cancel'); retry the dependency first"
        )
        self.task_id = task_id
        self.dependency_id = dependency_id
        self.status = status


class LeaseLostError(ReliableExecutorError):
    """Raised in a handler whose attempt no longer holds its task: a write of the attempt
    (a durable step's checkpoint, ``context.step``) was refused because the task's lease was
    lost (it expired and the task was recovered, claimed again, cancelled or timed out), so
    what the write carried was not stored. Another attempt owns the task now, or will."""

    def __init__(self, task_id: str, what: str) -> None:
        super().__init__(
            f"task {task_id}: {what} was refused: this attempt no longer holds the task's lease "
            "(it was recovered, timed out or cancelled meanwhile)"
        )
        self.task_id = task_id


class DuplicateStepError(ReliableExecutorError, ValueError):
    """``context.step`` was called twice with one name in one run of a handler: a task's steps
    are keyed by name, so the second call would get the first one's checkpoint back."""

    def __init__(self, task_id: str, step: str) -> None:
        super().__init__(
            f"task {task_id}: step {step!r} already ran in this run of the handler; "
            "each step of a task needs a name of its own"
        )
        self.task_id = task_id
        self.step = step


class UnknownStepError(ReliableExecutorError, ValueError):
    """``executor.retry_task(task_id, from_step=...)`` names a step the task has no stored
    checkpoint of (never finished, discarded, or misspelled). Nothing was changed."""

    def __init__(self, task_id: str, step: str, known: list[str]) -> None:
        stored = ", ".join(repr(name) for name in known) if known else "none"
        super().__init__(
            f"task {task_id} has no checkpoint of step {step!r} (stored steps, in the order "
            f"they finished: {stored}); nothing was changed"
        )
        self.task_id = task_id
        self.step = step


class InvalidScheduleError(ReliableExecutorError, ValueError):
    """A schedule definition was refused (bad cron, interval, time zone, ...); nothing was
    stored. ``field`` names what was wrong."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownScheduleError(InvalidScheduleError):
    """No schedule has this id (``run_schedule_now``); nothing was stored. ``field`` is
    "schedule_id"."""


class InvalidQueueError(ReliableExecutorError, ValueError):
    """pause_queue/resume_queue refused the queue name: it breaks the queue-name rule, or no
    registered handler, stored task, live worker or schedule uses it (a typo would
    otherwise pause nothing, silently). Nothing was stored. ``field`` is "queue"."""

    field = "queue"


class UnknownQueueError(InvalidQueueError):
    """The queue name passes the rule, but nothing uses it (see InvalidQueueError)."""


def storage_unavailable(exc: BaseException) -> bool:
    """Does ``exc`` say the storage is out of reach (down, restarting, connection lost), so
    the same write is worth retrying later? Other errors are the storage refusing the write."""
    from django.db import InterfaceError, OperationalError

    return isinstance(
        exc,
        (StorageUnavailableError, OperationalError, InterfaceError, ConnectionError, TimeoutError),
    )


class WaitTimeout(ReliableExecutorError):
    """Raised in a handler by a durable wait whose ``timeout`` passed before what it waited for
    happened (``context.wait_for``: tasks that had not all ended)."""

    def __init__(self, task_id: str, name: str, what: str) -> None:
        super().__init__(f"task {task_id}: wait {name!r} timed out: {what}")
        self.task_id = task_id
        self.name = name


class EventTimeout(WaitTimeout):
    """Raised in a handler by ``context.wait_for_event(name, timeout=...)`` when the timeout
    passed before the event was sent to the task."""


class TaskNotRunningError(ReliableExecutorError, ValueError):
    """``executor.request_stack`` was refused: the task is not found, or no handler of it is
    running (only a running handler has a live stack)."""


class StackNotAnsweredError(ReliableExecutorError):
    """``executor.task_stack`` has no answer to give: the worker did not answer the request
    within ``core.stacks.ANSWER_SECONDS`` (it is gone or frozen), or the request is unknown
    (expired, or made for another task)."""
