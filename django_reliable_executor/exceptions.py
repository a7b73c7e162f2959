"""Exceptions raised to callers: every bad submit is a TaskSubmitError subclass."""

from __future__ import annotations


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
    """The task_id has the form of a schedule's fire id (``<schedule_id>@<UTC time>Z``), which
    only the schedules' firing may store."""


class UnknownTaskError(TaskSubmitError):
    """No handler is registered under the task_name (and ALLOW_UNKNOWN_TASKS is off)."""


class InvalidParameterError(TaskSubmitError):
    """The parameter is not JSON-serialisable or does not fit the handler's param_type."""


class ParameterTooLargeError(InvalidParameterError):
    """The serialised parameter is larger than MAX_PARAMETER_BYTES."""


class InvalidTaskOptionError(TaskSubmitError):
    """A submit option (retry_limit, queue, priority, run_at, ...) has a bad value."""


class HandlerRegistrationError(ReliableExecutorError):
    """Two different functions were registered under one task name, or options are invalid."""


class StorageUnavailableError(ReliableExecutorError):
    """The storage could not be reached; the operation did not happen."""


class InvalidScheduleError(ReliableExecutorError, ValueError):
    """A schedule definition was refused (bad cron, interval, time zone, ...); nothing was
    stored. ``field`` names what was wrong."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
