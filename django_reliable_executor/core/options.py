"""TaskOptions: a task's retry, deadline, time limit, queue and priority options, and the one rule
for each."""

from __future__ import annotations

import dataclasses
import datetime as dt
import operator
from collections.abc import Callable, Iterable, Sequence
from types import NoneType
from typing import Any

from ..exceptions import InvalidTaskOptionError
from .numbers import is_int, is_number
from .retries import BACKOFF_CHOICES
from .text import unstorable_char

MAX_QUEUE_LENGTH = 100
INT32 = 2**31
# Longest delay, interval or duration accepted: far beyond any real use, and small enough that
# now + it stays a valid datetime (a bigger one would overflow when the retry is scheduled).
MAX_MILLIS = 100 * 365 * 24 * 3600 * 1000  # 100 years
MAX_SECONDS = MAX_MILLIS // 1000


def _seconds_ok(value: Any) -> bool:
    """A number of seconds (int or float, not bool) above 0 and up to MAX_SECONDS: NaN fails
    both comparisons, infinity the second (and an int too large for a float is compared as
    an int, never converted)."""
    if not is_number(value):
        return False
    return 0 < value <= MAX_SECONDS


def _queue_ok(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_QUEUE_LENGTH
        and "," not in value
        and not any(map(str.isspace, value))
        and unstorable_char(value) is None
    )


# option -> (test, what a good value is). The test sees None too: only max_duration_millis and
# attempt_timeout take it as a value ("no limit"); elsewhere None means "not given" and
# TaskOptions skips it.
# retry_limit fits the 32-bit column; the millisecond values keep now + them a valid datetime.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "retry_limit": (
        lambda v: is_int(v) and 0 <= v <= INT32 - 1,
        f"an integer from 0 to {INT32 - 1}",
    ),
    "retry_interval": (
        lambda v: is_int(v) and 0 <= v <= MAX_MILLIS,
        f"an integer from 0 to {MAX_MILLIS}",
    ),
    "retry_backoff": (lambda v: v in BACKOFF_CHOICES, f"one of {BACKOFF_CHOICES}"),
    "max_duration_millis": (
        lambda v: v is None or (is_int(v) and 1 <= v <= MAX_MILLIS),
        f"None or an integer from 1 to {MAX_MILLIS}",
    ),
    # Seconds, as Celery's time_limit; a timedelta is converted before (as_number).
    "attempt_timeout": (
        lambda v: v is None or _seconds_ok(v),
        f"None, a number of seconds above 0 and at most {MAX_SECONDS}, or a timedelta",
    ),
    "queue": (
        _queue_ok,
        f"1..{MAX_QUEUE_LENGTH} characters without whitespace or commas (nor NUL or surrogates)",
    ),
    "priority": (lambda v: is_int(v) and -INT32 <= v < INT32, "a 32-bit integer"),
}


def check_option(name: str, value: Any) -> None:
    """Raise InvalidTaskOptionError (``field=name``) unless ``value`` is a good ``name``."""
    test, expected = RULES[name]
    if not test(value):
        raise InvalidTaskOptionError(f"{name} must be {expected}, got {value!r}", field=name)


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """The options stored with a task. None means "not given": a later source fills it in
    (the submit, then the handler, then the settings)."""

    retry_limit: int | None = None
    retry_interval: int | None = None  # milliseconds
    retry_backoff: str | None = None  # "fixed" | "exponential"
    max_duration_millis: int | None = None
    queue: str | None = None
    priority: int | None = None
    attempt_timeout: float | None = None  # seconds each attempt may run

    @classmethod
    def of(cls, *sources: Any) -> TaskOptions:
        """Each option from the first of ``sources`` (objects carrying the options as
        attributes: a request, a handler, a schedule, a task, other TaskOptions; None is
        skipped) that gives it."""
        values: Sequence[Any] = ()
        for source in sources:
            if source is None:
                continue
            given: Sequence[Any] = _given(source)
            if values:
                given = [v if v is not None else g for v, g in zip(values, given, strict=True)]
            values = given
            if NoneType not in map(type, values):  # by type: a value may compare oddly with None
                break  # every option given: later sources cannot change anything
        return cls(*values)

    def validate(self, *, required: Iterable[str] = ()) -> TaskOptions:
        """Check every option given (and those named in ``required`` even when None), in field
        order; raise InvalidTaskOptionError for the first bad one. Returns self."""
        values = _GET_ALL(self)
        required = tuple(required)
        # The values' types come first in the key: 1 == True, yet True is no priority.
        key: tuple[Any, ...] | None = (tuple(map(type, values)), values, required)
        try:
            if key in _GOOD:
                return self
        except TypeError:  # an unhashable value: a bad one, which the checks below name
            key = None
        for name, value in zip(NAMES, values, strict=True):
            if (value is not None or name in required) and not RULES[name][0](value):
                check_option(name, value)
        if key is not None:
            if len(_GOOD) >= GOOD_KEPT:
                _GOOD.clear()
            _GOOD.add(key)
        return self


NAMES = tuple(field.name for field in dataclasses.fields(TaskOptions))
# Options found good, with their types and the names required: a submit almost always checks
# the very options the submit before it checked, and looking them up costs far less.
_GOOD: set[tuple[Any, ...]] = set()
GOOD_KEPT = 1024
_GET_ALL = operator.attrgetter(*NAMES)  # one call reads them all: a submit reads three sources


def _given(source: Any) -> tuple[Any, ...]:
    """The options ``source`` carries as attributes, in NAMES order (None where it has none)."""
    try:
        return _GET_ALL(source)  # type: ignore[no-any-return]
    except AttributeError:
        return tuple(getattr(source, name, None) for name in NAMES)


# The options a retry policy reads, apart from where and in what order the task runs.
RETRY_NAMES = ("retry_limit", "retry_interval", "retry_backoff", "max_duration_millis")


# Duration options and their unit: each also takes a datetime.timedelta, converted to it.
MILLISECOND_OPTIONS = ("retry_interval", "max_duration_millis", "delay_millis")
SECOND_OPTIONS = ("unique_for", "attempt_timeout")
_MILLISECOND = dt.timedelta(milliseconds=1)


def as_number(name: str, value: Any) -> Any:
    """``value`` of duration option ``name`` in its unit when it is a timedelta (milliseconds,
    rounded; seconds for unique_for and attempt_timeout); anything else as it is (the option's
    rule checks it)."""
    if not isinstance(value, dt.timedelta):
        return value
    if name in SECOND_OPTIONS:
        return value.total_seconds()
    return round(value / _MILLISECOND)


def numeric_durations(source: Any) -> Any:
    """A dataclass instance (a TaskSubmitRequest) with its timedelta durations converted; the
    same object when it has none (the usual case, at the cost of five type checks)."""
    changes = {
        name: as_number(name, value)
        for name in (*MILLISECOND_OPTIONS, *SECOND_OPTIONS)
        if isinstance(value := getattr(source, name, None), dt.timedelta)
    }
    return dataclasses.replace(source, **changes) if changes else source
