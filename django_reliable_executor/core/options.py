"""The task option table (OPTIONS: each option's rule, the entry points taking it, its stored
field) and TaskOptions, the options a submit merges from itself, its handler and the settings.

Every entry point checks an option through its rule here: the decorator (registry), submit
(service/submitting.prepare), schedules (service/schedules), the API (api/tasks,
api/schedules), the Django Tasks backend (tasks_backend._option_problems) and the
settings (conf). tests/unit/test_option_table.py keeps each entry point's signature equal to
the options the table gives it.

Adding a task option:

1. Add an ``Option`` to OPTIONS: its name, its rule (a test and the words of a good value:
   errors read "<name> must be <expected>, got <value>"), the entry points taking it and the
   NewTask field storing it (None when the handler keeps it in the process), plus its
   ``DEFAULT_*`` setting if the settings give a default (and the key in conf).
2. Run tests/unit/test_option_table.py: it names each signature still lacking it
   (TaskSubmitRequest, reliable_task_handler, TaskHandler, Schedule, the API's fields). A
   merged option (one a handler or the settings may give) is also a TaskOptions field.
3. Store it: a NewTask and TaskInfo field, a column (and a migration) in models/tasks.py, the
   Redis hash field, and both backends' reads and writes (storage/); then docs/submitting.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import NoneType
from typing import Any

from ..exceptions import InvalidTaskOptionError
from .numbers import is_int, is_number
from .option_names import guess
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


def _aware_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, dt.datetime) and value.utcoffset() is not None)


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _queue_ok(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_QUEUE_LENGTH
        and "," not in value
        and not any(map(str.isspace, value))
        and unstorable_char(value) is None
    )


# Where an option is given: the entry points of the table below.
DECORATOR = "decorator"  # @reliable_task_handler(...) and TaskHandler(...)
SUBMIT = "submit"  # executor.submit, TaskSubmitRequest, handler.submit, POST /tasks
SCHEDULE = "schedule"  # Schedule, executor.schedule(_many), the schedules API
TASKS_BACKEND = "tasks_backend"  # TASKS[...]["OPTIONS"] of the Django Tasks backend
SETTINGS = "settings"  # RELIABLE_EXECUTOR's DEFAULT_* (Option.setting)
ENTRY_POINTS = (DECORATOR, SUBMIT, SCHEDULE, TASKS_BACKEND, SETTINGS)
_ALL = frozenset(ENTRY_POINTS)


@dataclasses.dataclass(frozen=True)
class Option:
    """One task option: its rule (``test`` and the words of ``expected``), the entry points
    that take it, the NewTask field it is stored in (None: the handler keeps it, in the
    process) and the setting that gives its default."""

    name: str
    test: Callable[[Any], bool]
    expected: str
    takes: frozenset[str]
    stored: str | None
    setting: str | None = None


def _table(*options: Option) -> dict[str, Option]:
    return {option.name: option for option in options}


# Every task option, once. The test sees None too: only max_duration_millis and
# attempt_timeout take it as a value ("no limit"); elsewhere None means "not given" and
# TaskOptions skips it. retry_limit fits the 32-bit column; the millisecond values keep
# now + them a valid datetime. Options whose rule needs more than one value (rate_key,
# unique_for, depends_on, ...) are checked where they are read: their test here is the rule of
# their type only, and tests/unit/test_option_table.py keeps every signature in step.
OPTIONS: dict[str, Option] = _table(
    Option(
        "retry_limit",
        lambda v: is_int(v) and 0 <= v <= INT32 - 1,
        f"an integer from 0 to {INT32 - 1}",
        _ALL,
        "retry_limit",
        "DEFAULT_RETRY_LIMIT",
    ),
    Option(
        "retry_interval",
        lambda v: is_int(v) and 0 <= v <= MAX_MILLIS,
        f"an integer from 0 to {MAX_MILLIS}",
        _ALL,
        "retry_interval",
        "DEFAULT_RETRY_INTERVAL",
    ),
    Option(
        "retry_backoff",
        lambda v: v in BACKOFF_CHOICES,
        f"one of {BACKOFF_CHOICES}",
        _ALL,
        "retry_backoff",
        "DEFAULT_RETRY_BACKOFF",
    ),
    Option(
        "max_duration_millis",
        lambda v: v is None or (is_int(v) and 1 <= v <= MAX_MILLIS),
        f"None or an integer from 1 to {MAX_MILLIS}",
        _ALL,
        "max_duration_millis",
        "DEFAULT_MAX_DURATION",
    ),
    # Seconds, as Celery's time_limit; a timedelta is converted before (as_number).
    Option(
        "attempt_timeout",
        lambda v: v is None or _seconds_ok(v),
        f"None, a number of seconds above 0 and at most {MAX_SECONDS}, or a timedelta",
        frozenset((DECORATOR, SUBMIT, TASKS_BACKEND)),
        "attempt_timeout",
    ),
    Option(
        "queue",
        _queue_ok,
        f"1..{MAX_QUEUE_LENGTH} characters without whitespace or commas (nor NUL or surrogates)",
        frozenset((DECORATOR, SUBMIT, SCHEDULE)),
        "queue",
    ),
    Option(
        "priority",
        lambda v: is_int(v) and -INT32 <= v < INT32,
        "a 32-bit integer",
        frozenset((DECORATOR, SUBMIT, SCHEDULE)),
        "priority",
    ),
    Option(
        "delay_millis",
        lambda v: is_int(v) and 0 <= v <= MAX_MILLIS,
        f"an integer from 0 to {MAX_MILLIS}",
        frozenset((SUBMIT,)),
        "run_at",
    ),
    Option("run_at", _aware_or_none, "None or an aware datetime", frozenset((SUBMIT,)), "run_at"),
    Option(
        "unique_for",
        lambda v: v is None or is_number(v),
        "None or a number of seconds (core/uniqueness.check_unique_for)",
        frozenset((DECORATOR, SUBMIT)),
        "unique_until",
    ),
    Option(
        "unique_key",
        _text_or_none,
        "None or a string (core/uniqueness.unique_window)",
        frozenset((SUBMIT,)),
        "unique_key",
    ),
    Option(
        "debounce",
        lambda v: v is None or _seconds_ok(v),
        "None, a number of seconds above 0, or a timedelta (core/debouncing.py)",
        frozenset((DECORATOR, SUBMIT)),
        "debounce",
    ),
    Option(
        "debounce_max_wait",
        lambda v: v is None or _seconds_ok(v),
        "None, a number of seconds above 0, or a timedelta (core/debouncing.py)",
        frozenset((DECORATOR, SUBMIT)),
        "debounce_max_wait",
    ),
    Option(
        "rate_key",
        _text_or_none,
        "None or a string (core/rate_limits.key_problem)",
        frozenset((SUBMIT,)),
        "rate_key",
    ),
    Option(
        "concurrency_key",
        _text_or_none,
        "None or a string (core/rate_limits.key_problem)",
        frozenset((SUBMIT,)),
        "concurrency_key",
    ),
    Option(
        "tags",
        lambda v: v is None or isinstance(v, (list, tuple)),
        "None or a list of strings (core/tags.checked_tags)",
        frozenset((SUBMIT,)),
        "tags",
    ),
    Option(
        "depends_on",
        lambda v: v is None or not isinstance(v, str),
        "None or task ids (core/dependencies.check_dependencies)",
        frozenset((SUBMIT,)),
        "depends_on",
    ),
    Option(
        "on_dependency_failure",
        lambda v: v in ("cancel", "run"),
        "'cancel' or 'run'",
        frozenset((SUBMIT,)),
        "on_dependency_failure",
    ),
    Option(
        "max_concurrency",
        lambda v: v is None or (is_int(v) and v >= 1),
        "an integer >= 1 or None",
        frozenset((DECORATOR,)),
        None,
    ),
    Option(
        "max_concurrency_per_key",
        lambda v: v is None or (is_int(v) and v >= 1),
        "an integer >= 1 or None",
        frozenset((DECORATOR,)),
        None,
    ),
    Option(
        "fairness",
        lambda v: v is None or v == "round_robin",
        "'round_robin' or None",
        frozenset((DECORATOR,)),
        None,
    ),
    Option(
        "rate_limit",
        _text_or_none,
        'None or "N/s", "N/m" or "N/h" (core/rate_limits.parse_rate_limit)',
        frozenset((DECORATOR,)),
        None,
    ),
    Option(
        "retry_on",
        lambda v: isinstance(v, tuple),
        "a tuple of exception classes",
        frozenset((DECORATOR, TASKS_BACKEND)),
        None,
    ),
    Option("takes_context", _is_bool, "True or False", frozenset((DECORATOR,)), None),
    Option("param_type", lambda v: True, "any type, or None", frozenset((DECORATOR,)), None),
)

# option -> (test, what a good value is): every option's rule, as check_option reads it.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    name: (option.test, option.expected) for name, option in OPTIONS.items()
}


def options_of(entry_point: str) -> tuple[str, ...]:
    """The names of the options ``entry_point`` (one of ENTRY_POINTS) takes, in table order."""
    return tuple(name for name, option in OPTIONS.items() if entry_point in option.takes)


def problems(
    values: Mapping[str, Any], entry_point: str, *, own: Collection[str] = ()
) -> list[tuple[str, str]]:
    """(name, what is wrong) for each name of ``values`` that ``entry_point`` does not take
    (sorted, with what it probably meant), then for each option given (not None) that breaks
    its rule, in table order; durations may be timedeltas. The options in ``own`` are the
    caller's to check (a form the rule does not read, such as dotted paths)."""
    known = options_of(entry_point)
    found = []
    for name in sorted(set(values) - set(known)):
        found.append(
            (name, f"unknown option {name!r}{guess(name, known)} (known: {', '.join(known)})")
        )
    for name in known:
        value = as_number(name, values.get(name))
        if name not in own and value is not None:
            try:
                check_option(name, value)
            except InvalidTaskOptionError as exc:
                found.append((name, str(exc)))
    return found


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
SECOND_OPTIONS = ("unique_for", "attempt_timeout", "debounce", "debounce_max_wait")
_MILLISECOND = dt.timedelta(milliseconds=1)


def as_number(name: str, value: Any) -> Any:
    """``value`` of duration option ``name`` in its unit when it is a timedelta (milliseconds,
    rounded; seconds for SECOND_OPTIONS); anything else as it is (the option's
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
