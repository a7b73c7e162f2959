"""The decorator's options checked and put in shape before a handler is registered: the same
rules as a submit's (core/options.py), the combinations a handler cannot have, and its
declared schedules."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from .core.debouncing import debounce_window
from .core.ids import MAX_ID_LENGTH, validate_schedule_id
from .core.numbers import is_number
from .core.options import NAMES as OPTION_NAMES
from .core.options import TaskOptions, as_number, check_option
from .core.rate_limits import parse_rate_limit
from .core.uniqueness import check_unique_for
from .exceptions import HandlerRegistrationError, InvalidScheduleError, InvalidTaskOptionError
from .schedules.records import OVERLAP_POLICIES, Schedule
from .schedules.timing import make_timing

# What the decorator's ``schedule=`` takes: each a Schedule, a cron string or an interval.
ScheduleSpec = Schedule | str | int | float | dt.timedelta


def validate_options(name: str, options: dict[str, Any]) -> None:
    def bad(message: str) -> HandlerRegistrationError:
        return HandlerRegistrationError(f"@reliable_task_handler(name={name!r}): {message}")

    if not isinstance(name, str) or not name or len(name) > MAX_ID_LENGTH:
        raise bad(f"name must be a non-empty string of at most {MAX_ID_LENGTH} characters")
    # The rule every entry point applies, so a bad option fails at import rather than at every
    # submit; queue and priority have no "not given" here (None is refused).
    try:
        TaskOptions(**{key: options[key] for key in OPTION_NAMES}).validate(
            required=("queue", "priority")
        )
    except InvalidTaskOptionError as exc:
        raise bad(str(exc)) from exc
    retry_on = options["retry_on"]
    if not isinstance(retry_on, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
    ):
        raise bad("retry_on must be a tuple of exception classes")
    try:
        check_option("max_concurrency", options.get("max_concurrency"))
        check_option("max_concurrency_per_key", options.get("max_concurrency_per_key"))
        check_option("fairness", options.get("fairness"))
    except InvalidTaskOptionError as exc:
        raise bad(str(exc)) from exc
    if options.get("unique_for") is not None:
        try:
            check_unique_for(options["unique_for"])
        except InvalidTaskOptionError as exc:
            raise bad(str(exc)) from exc
    _validate_debounce(options, bad)
    rate = options.get("rate_limit")
    if rate is not None:
        try:
            parse_rate_limit(rate)
        except ValueError as exc:
            raise bad(str(exc)) from exc


def _validate_debounce(
    options: dict[str, Any], bad: Callable[[str], HandlerRegistrationError]
) -> None:
    """``debounce`` and ``debounce_max_wait`` as a submit checks them, and not with
    ``unique_for`` (debounce keeps the newest submit of a key, unique_for the first)."""
    debounce, max_wait = options.get("debounce"), options.get("debounce_max_wait")
    if debounce is None and max_wait is None:
        return
    if debounce is None:
        raise bad("debounce_max_wait needs debounce")
    if options.get("unique_for") is not None:
        raise bad(
            "debounce and unique_for do not go together (debounce keeps the newest submit "
            "of a key, unique_for the first)"
        )
    try:
        debounce_window(debounce, max_wait, None)
    except InvalidTaskOptionError as exc:
        raise bad(str(exc)) from exc


def normalized(**options: Any) -> dict[str, Any]:
    """The decorator's options with retry_on a tuple and durations numbers (as_number)."""
    retry_on = options["retry_on"]
    options["retry_on"] = tuple((retry_on,) if isinstance(retry_on, type) else retry_on)
    for key in (
        "retry_interval",
        "max_duration_millis",
        "unique_for",
        "attempt_timeout",
        "debounce",
        "debounce_max_wait",
    ):
        options[key] = as_number(key, options[key])
    return options


def declared(
    name: str, given: ScheduleSpec | Sequence[ScheduleSpec] | None
) -> tuple[Schedule, ...]:
    """The decorator's ``schedule=`` as Schedules of this task, validated now so a bad cron
    fails at import time rather than when a worker starts."""
    if given is None:
        return ()
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    specs: list[Schedule] = []
    for item in items:
        if isinstance(item, str):
            spec = Schedule(cron=item)
        elif is_number(item) or isinstance(item, dt.timedelta):
            spec = Schedule(every=item)
        elif isinstance(item, Schedule):
            spec = item
        else:
            raise HandlerRegistrationError(
                f"@reliable_task_handler(name={name!r}): schedule must be a cron string, "
                f"seconds, a timedelta or a Schedule, got {item!r}"
            )
        if spec.task_name not in (None, name):
            raise HandlerRegistrationError(
                f"@reliable_task_handler(name={name!r}): a Schedule in schedule= fires this "
                f"handler; leave its task_name out (got {spec.task_name!r})"
            )
        spec = dataclasses.replace(spec, task_name=name, schedule_id=spec.schedule_id or name)
        try:
            validate_schedule_id(spec.schedule_id)
            if spec.overlap not in OVERLAP_POLICIES:
                raise InvalidScheduleError(
                    f"overlap must be one of {OVERLAP_POLICIES}, got {spec.overlap!r}",
                    field="overlap",
                )
            make_timing(
                every=spec.every,
                cron=spec.cron,
                timezone=spec.timezone or "UTC",
                anchor=dt.datetime.now(dt.timezone.utc),
            )
            # Its task options, as saving it would check them (runexecutor saves it).
            TaskOptions.of(spec).validate()
        except (InvalidScheduleError, InvalidTaskOptionError) as exc:
            raise HandlerRegistrationError(
                f"@reliable_task_handler(name={name!r}): schedule {spec.schedule_id!r}: {exc}"
            ) from exc
        specs.append(spec)
    ids = [spec.schedule_id for spec in specs]
    if len(set(ids)) != len(ids):
        raise HandlerRegistrationError(
            f"@reliable_task_handler(name={name!r}): several schedules need their own "
            "schedule_id (Schedule(schedule_id=..., ...))"
        )
    return tuple(specs)
