"""Pure retry arithmetic, no I/O: the backoff delay and where a failed attempt leads."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from .states import TaskStatus

if TYPE_CHECKING:
    from .records import Claim

BACKOFF_CHOICES = ("fixed", "exponential")
JITTER = 0.10  # full jitter, kept within +-10 % of the nominal delay


def backoff_millis(
    retry_number: int,
    interval_millis: int,
    backoff: str,
    cap_millis: int,
    rand: Callable[[], float] = random.random,
) -> int:
    """Delay before retry ``retry_number`` (1-based).

    fixed: ``interval``. exponential: ``interval * 2**(n-1)`` capped at ``cap_millis``, then
    jittered uniformly within +-10 % (and never above the cap) so retries of many tasks that
    failed together spread out instead of hitting the same dependency at once.
    """
    if retry_number < 1:
        raise ValueError("retry_number starts at 1")
    if backoff == "fixed":
        return interval_millis
    if backoff != "exponential":
        raise ValueError(f"unknown backoff {backoff!r}")
    # Cap the exponent first so huge retry numbers cannot build a giant integer.
    nominal = min(interval_millis * 2 ** min(retry_number - 1, 62), cap_millis)
    jittered = nominal * (1 - JITTER + 2 * JITTER * rand())
    return max(0, int(min(jittered, cap_millis)))


def after_failure(
    *,
    budget_attempts: int,
    retry_limit: int,
    retryable: bool,
    cancel_requested: bool,
    deadline_at: dt.datetime | None,
    now: dt.datetime,
    retry_interval: int,
    retry_backoff: str,
    backoff_cap_millis: int,
) -> tuple[TaskStatus, dt.datetime | None]:
    """Where a failed attempt leads: ``(status, next run_at or None)``.

    Order matters: a requested cancel wins (the user asked to stop), then the deadline (a failure
    past max duration is TIMEOUT, not PENDING), then the retry budget.
    """
    if cancel_requested:
        return TaskStatus.CANCELLED, None
    if deadline_at is not None and now >= deadline_at:
        return TaskStatus.TIMEOUT, None
    if retryable and budget_attempts <= retry_limit:
        delay = backoff_millis(budget_attempts, retry_interval, retry_backoff, backoff_cap_millis)
        return TaskStatus.PENDING, now + dt.timedelta(milliseconds=delay)
    return TaskStatus.FAILED, None


def failure_outcome(
    claim: Claim,
    now: dt.datetime,
    backoff_cap_millis: int,
    *,
    retryable: bool,
    cancel_requested: bool,
) -> tuple[TaskStatus, dt.datetime | None]:
    """Where a failed attempt of ``claim`` leads by its task's retry options (see after_failure):
    the one failure policy every storage applies, to a worker's failure and to a lost lease."""
    task = claim.task
    return after_failure(
        budget_attempts=claim.budget_attempts,
        retry_limit=task.retry_limit,
        retryable=retryable,
        cancel_requested=cancel_requested,
        deadline_at=claim.deadline_at,
        now=now,
        retry_interval=task.retry_interval,
        retry_backoff=task.retry_backoff,
        backoff_cap_millis=backoff_cap_millis,
    )


def timeout_message(max_duration_millis: int | None, previous_error: str | None) -> str:
    """The last_error of a task that ran past its max duration."""
    message = f"max duration of {max_duration_millis} ms since creation exceeded"
    if previous_error:
        message += f"\nLast failure before the deadline:\n{previous_error}"
    return message


def attempt_timeout_message(seconds: float, what_happened: str) -> str:
    """The last_error of an attempt that ran past its attempt_timeout: its first line says so,
    then what became of its handler (a traceback on the lines after, when it raised)."""
    return f"attempt timed out after {seconds:g} s (attempt_timeout): {what_happened}"
