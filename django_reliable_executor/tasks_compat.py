"""One import of Django's Tasks framework: ``django.tasks`` (Django 6) or the django-tasks backport
(Django 5.2), whichever this process has, under the same names."""

from __future__ import annotations

import inspect
from typing import Any

try:  # Django 6.0 and later
    from django.tasks import (
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
except ImportError:  # Django 5.2 with the backport (pip install django-tasks)
    from django_tasks import (  # type: ignore[no-redef, assignment]
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef, assignment]
    from django_tasks.base import Task, TaskError  # type: ignore[no-redef, assignment]
    from django_tasks.exceptions import (  # type: ignore[no-redef, assignment]
        InvalidTaskError,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import (  # type: ignore[no-redef, assignment]
        task_enqueued,
        task_finished,
        task_started,
    )

    SOURCE = "django_tasks"


#: Whether ``@task(...)`` passes extra keyword arguments (this app's per-task options) to the
#: backend's task class: Django 6.1+ and the backport do, Django 6.0 does not.
DECORATOR_OPTIONS = any(
    p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(task).parameters.values()
)


def normalize_json(value: Any) -> Any:
    """Tuples to lists, and a TypeError for what JSON cannot hold, as Django's TaskResult does."""
    if SOURCE == "django.tasks":
        from django.utils.json import normalize_json as normalize
    else:
        from django_tasks.utils import normalize_json as normalize  # type: ignore[no-redef, assignment]
    return normalize(value)


__all__ = [
    "DECORATOR_OPTIONS",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
