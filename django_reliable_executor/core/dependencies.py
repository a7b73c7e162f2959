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
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..exceptions import DependencyNotCompletedError, InvalidDependencyError
from .ids import MAX_ID_LENGTH
from .states import TERMINAL_STATUSES, TaskStatus

if TYPE_CHECKING:
    from .records import NewTask

#: The character categories no task id holds (controls, format characters, lone surrogates,
#: line and paragraph separators), beside whitespace.
ID_FORBIDDEN_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
#: At most this many dependencies per task.
MAX_DEPENDENCIES = 100
#: What a dependency can do to its dependent when it ends otherwise than COMPLETED.
ON_FAILURE_CHOICES = ("cancel", "run")
_TERMINAL_VALUES = frozenset(status.value for status in TERMINAL_STATUSES)
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
    # A mapping iterates as its keys, and a JSON object would pass for a list of them.
    if isinstance(depends_on, (str, bytes, bytearray, Mapping)) or not isinstance(
        depends_on, Iterable
    ):
        raise InvalidDependencyError(
            f"depends_on must be a list of task ids, got {type(depends_on).__name__}",
            field="depends_on",
        )
    given = list(depends_on)
    # Each id checked before any is hashed or looked up: a list inside would not hash, and an
    # id no task can have (NUL, a lone surrogate, too long) must not reach the store's query.
    for dependency in given:
        problem = dependency_id_problem(dependency)
        if problem is not None:
            raise InvalidDependencyError(
                f"depends_on must hold task ids, got {_shown(dependency)}: {problem}",
                field="depends_on",
            )
    ids = tuple(dict.fromkeys(given))
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


def dependency_id_problem(value: Any) -> str | None:
    """Why ``value`` cannot be the id of a stored task (None: it can be): the task id rule
    of submission._task_id, less its reserved forms (a schedule's run may be depended on)."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}, not a string"
    if not 1 <= len(value) <= MAX_ID_LENGTH:
        return f"{len(value)} characters, not 1..{MAX_ID_LENGTH}"
    for char in value:
        if char.isspace() or unicodedata.category(char) in ID_FORBIDDEN_CATEGORIES:
            return f"it holds whitespace or a control character ({char!r})"
    return None


def _shown(value: Any) -> str:
    """``value``'s repr, cut short: an error message never carries a megabyte of input."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


def awaited_on_retry(
    task_id: str,
    depends_on: Iterable[str],
    statuses: Mapping[str, str | None],
    on_failure: str | None,
) -> tuple[str, ...]:
    """The dependencies a dependent retried by hand waits for again: those of ``depends_on``
    not ended (``statuses``: id -> status now, None for one purged). A retried dependent runs
    only after its dependencies completed, as it would have: raises
    DependencyNotCompletedError naming the first that ended otherwise (or was purged),
    unless ``on_failure`` is "run" (then it runs once every one has ended, whatever the
    outcome)."""
    ids = tuple(depends_on)
    if on_failure != "run":
        for dependency in ids:
            status = statuses.get(dependency)
            if status is None or (
                status in _TERMINAL_VALUES and status != TaskStatus.COMPLETED.value
            ):
                raise DependencyNotCompletedError(task_id, dependency, status)
    return tuple(
        d for d in ids if statuses.get(d) is not None and statuses[d] not in _TERMINAL_VALUES
    )
