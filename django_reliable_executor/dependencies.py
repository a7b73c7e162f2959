"""Task dependencies: the submit options' rules, and the facts every storage shares about them.

A task submitted with ``depends_on=[ids]`` is stored CREATED with ``run_at`` at WAITING_RUN_AT
(on the databases also unavailable, out of the claim index), so no claim takes it and it counts
against no ``max_concurrency``. Every write that ends a task
(complete, fail, expire, cancel, recover) settles its dependents in the same atomic step: a
dependent whose last awaited dependency COMPLETED becomes due at once; one whose dependency ended
otherwise is CANCELLED (``last_error`` names it) unless it asked for ``on_dependency_failure=
"run"``. A cancel so cascaded cancels the dependents' own dependents too, sending no signal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .exceptions import InvalidDependencyError
from .states import TaskStatus

if TYPE_CHECKING:
    from .records import NewTask

#: At most this many dependencies per task.
MAX_DEPENDENCIES = 100
#: What a dependency can do to its dependent when it ends otherwise than COMPLETED.
ON_FAILURE_CHOICES = ("cancel", "run")
#: The run_at of a task still waiting for a dependency: after every real one.
WAITING_RUN_AT = dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)


def check_dependencies(
    depends_on: Any, on_failure: Any, task_id: str, delayed: bool
) -> tuple[str, ...]:
    """``depends_on`` as a tuple of distinct task ids in the order given (duplicates folded);
    raises InvalidDependencyError naming the field when it is not a list of ids, names
    ``task_id`` itself, holds more than MAX_DEPENDENCIES, or comes with a delay or run_at."""
    if on_failure not in ON_FAILURE_CHOICES:
        raise InvalidDependencyError(
            f"on_dependency_failure must be one of {ON_FAILURE_CHOICES}, got {on_failure!r}",
            field="on_dependency_failure",
        )
    if depends_on is None:
        return ()
    if isinstance(depends_on, (str, bytes)) or not isinstance(depends_on, Iterable):
        raise InvalidDependencyError(
            f"depends_on must be a list of task ids, got {type(depends_on).__name__}",
            field="depends_on",
        )
    ids = tuple(dict.fromkeys(depends_on))
    for dependency in ids:
        if not isinstance(dependency, str) or not dependency:
            raise InvalidDependencyError(
                f"depends_on must hold task ids (non-empty strings), got {dependency!r}",
                field="depends_on",
            )
    if len(ids) > MAX_DEPENDENCIES:
        raise InvalidDependencyError(
            f"depends_on holds {len(ids)} task ids, more than {MAX_DEPENDENCIES}",
            field="depends_on",
        )
    if task_id in ids:
        raise InvalidDependencyError(
            f"task {task_id!r} cannot depend on itself", field="depends_on"
        )
    if ids and delayed:
        raise InvalidDependencyError(
            "depends_on cannot be combined with delay_millis or run_at: a dependent runs "
            "when its dependencies end",
            field="depends_on",
        )
    return ids


def missing_error(task_id: str, missing: Iterable[str]) -> InvalidDependencyError:
    """The error of a submit whose dependencies do not exist (nothing is stored)."""
    names = ", ".join(repr(m) for m in missing)
    return InvalidDependencyError(
        f"depends_on of task {task_id!r} names tasks that do not exist: {names} "
        "(submit dependencies first)",
        field="depends_on",
    )


def first_missing(
    tasks: Sequence[NewTask], stored: Collection[str], skipped: Collection[str] = ()
) -> InvalidDependencyError | None:
    """The error of the first task of ``tasks`` (one call, in order) that the call would store
    with a dependency neither in ``stored`` (ids stored, or written before this call) nor a
    task before it that this call stores, else None. Tasks in ``stored`` are returned as they
    are, unchecked; those in ``skipped`` are not stored (a live task holds their unique key),
    so they are unchecked and count as nothing for the tasks after them (as on the
    databases, which refuse such a dependent)."""
    earlier: set[str] = set()
    for task in tasks:
        if task.task_id in stored or task.task_id in skipped:
            continue
        missing = [d for d in task.depends_on if d not in stored and d not in earlier]
        if missing:
            return missing_error(task.task_id, missing)
        earlier.add(task.task_id)
    return None


def failure_message(dependency_id: str, status: TaskStatus | str) -> str:
    """The ``last_error`` of a dependent cancelled because a dependency ended badly."""
    return f"dependency {dependency_id} ended {TaskStatus(status).value}: cancelled"
