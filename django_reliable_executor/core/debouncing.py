"""Debounce: the rules of ``debounce`` and ``debounce_max_wait``, and when a debounced task runs.

Submits of one key (``unique_key``, else the task name and the parameter, as for unique tasks)
within the window keep one waiting task: a submit while that task waits unclaimed and has never
started joins it (its parameter becomes the submit's, and it runs ``debounce`` seconds after
this submit, but never later than ``debounce_max_wait`` seconds after the first submit); once it
is claimed, the next submit stores a new task, which opens a new window.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from ..exceptions import InvalidTaskOptionError
from .numbers import is_number
from .uniqueness import MAX_UNIQUE_SECONDS, check_unique_key, unique_digest

# How long a debounce key row outlives its task's due time: a task still unclaimed that long
# after it was due (every worker stopped) is no longer joined, and the row may be purged.
KEY_HOLD = dt.timedelta(days=1)


def check_seconds(name: str, value: Any) -> float:
    """``value`` as seconds, or InvalidTaskOptionError (``field=name``)."""
    if not (is_number(value) and math.isfinite(value) and 0 < value <= MAX_UNIQUE_SECONDS):
        raise InvalidTaskOptionError(
            f"{name} must be a number of seconds above 0 and at most {MAX_UNIQUE_SECONDS}, "
            f"or a timedelta, got {value!r}",
            field=name,
        )
    return float(value)


def debounce_window(
    debounce: Any, max_wait: Any, unique_key: Any
) -> tuple[float, float | None, str | None]:
    """The checked (debounce, debounce_max_wait, unique_key) of a debounced submit."""
    seconds = check_seconds("debounce", debounce)
    longest = None if max_wait is None else check_seconds("debounce_max_wait", max_wait)
    if longest is not None and longest < seconds:
        raise InvalidTaskOptionError(
            f"debounce_max_wait ({longest:g} s) must be at least debounce ({seconds:g} s)",
            field="debounce_max_wait",
        )
    key = None if unique_key is None else check_unique_key(unique_key)
    return seconds, longest, key


def debounce_digest(task_name: str, unique_key: str | None, parameter: Any) -> str:
    """The key a storage stores for a debounced task: apart from unique_for's keys, so a
    unique submit and a debounced one of the same key never meet."""
    return unique_digest(f"{task_name}\0debounce", unique_key, parameter)


def debounced_run_at(
    now: dt.datetime, first: dt.datetime, debounce: float, max_wait: float | None
) -> dt.datetime:
    """When a debounced task runs after a submit at ``now``, its window opened at ``first``."""
    run_at = now + dt.timedelta(seconds=debounce)
    if max_wait is not None:
        # (past already when the window opened longer ago: due now)
        run_at = min(run_at, first + dt.timedelta(seconds=max_wait))
    return run_at
