"""What an unknown option name probably meant: the nearest known name, or this app's name
for a Celery option (countdown, eta, autoretry_for, ...)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# Celery's option -> (this app's, how it differs), where one exists.
CELERY = {
    "countdown": ("delay_millis", "milliseconds, not seconds"),
    "eta": ("run_at", "an aware datetime"),
    "expires": ("max_duration_millis", "a deadline in milliseconds from the submit"),
    "time_limit": (
        "attempt_timeout",
        "seconds per attempt; the attempt is asked to stop, and terminated only under "
        "runexecutor --pool process",
    ),
    "soft_time_limit": (
        "attempt_timeout",
        "seconds per attempt; context.is_cancelled() turns True at the limit",
    ),
    "autoretry_for": ("retry_on", "a tuple of exception classes"),
    "max_retries": ("retry_limit", ""),
    "default_retry_delay": ("retry_interval", "milliseconds, not seconds"),
    "retry_backoff_max": ("retry_interval", "the first interval; backoff doubles it"),
    "args": ("task_parameter", "one JSON value: a dict or list of your arguments"),
    "kwargs": ("task_parameter", "one JSON value: a dict or list of your arguments"),
    "routing_key": ("queue", ""),
    "bind": ("takes_context", "the handler then gets context=, a TaskContext"),
}

# Short names a newcomer tries, too far from the real one for difflib -> (the name, a note).
SHORT = {
    "delay": ("delay_millis", "milliseconds"),
    "retries": ("retry_limit", "retries after the first attempt"),
    "timeout": ("attempt_timeout", "seconds per attempt"),
}

# Options that another entry point takes -> where they belong.
ELSEWHERE = {"retry_on": "the decorator's", "takes_context": "the decorator's"}


def guess(name: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)``, `` (Celery's countdown is delay_millis here: ...)``, or ''."""
    if not isinstance(name, str):
        return ""
    known = sorted(known)
    celery = CELERY.get(name)
    if celery is not None and celery[0] in known:
        how = f": {celery[1]}" if celery[1] else ""
        return f" (Celery's {name} is {celery[0]!r} here{how})"
    if celery is not None and celery[0] in ELSEWHERE:
        where = ELSEWHERE[celery[0]]
        return f" (Celery's {name} is {where} {celery[0]!r} here, not an option of this call)"
    same_but_case = [option for option in known if option.lower() == name.lower()]
    if same_but_case:
        return f" (did you mean {same_but_case[0]!r}?)"
    short = SHORT.get(name.lower())
    if short is not None and short[0] in known:
        return f" (did you mean {short[0]!r}? {short[1]})"
    near = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""
