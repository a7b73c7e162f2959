"""A handler's progress report: the one check of set_progress()'s arguments, its stored form."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, TypedDict

from .numbers import is_number
from .text import storable_text

MAX_MESSAGE_CHARS = 1000
# Most one write per task in this many seconds: the calls in between are kept, the last wins.
WRITE_INTERVAL_SECONDS = 1.0


class Progress(TypedDict):
    """``TaskInfo.progress``: the last report of the task's handler (``updated_at`` aware UTC,
    when the handler reported it)."""

    current: int | float
    total: int | float | None
    message: str
    updated_at: dt.datetime


def _number(name: str, value: object) -> int | float:
    # bool is an int to Python, never a count to a caller.
    if not is_number(value):
        raise TypeError(f"set_progress: {name} must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"set_progress: {name} must be a finite number, not {value!r}")
    if value < 0:
        raise ValueError(f"set_progress: {name} must be 0 or more, not {value!r}")
    return value


def make_progress(current: object, total: object, message: object, now: dt.datetime) -> Progress:
    """The report of ``set_progress(current, total, message)`` at ``now``; TypeError or
    ValueError naming the argument when one does not fit (nothing is stored then)."""
    checked_current = _number("current", current)
    checked_total = None if total is None else _number("total", total)
    if checked_total is not None and checked_current > checked_total:
        raise ValueError(
            f"set_progress: current ({checked_current!r}) must not exceed total ({checked_total!r})"
        )
    if not isinstance(message, str):
        raise TypeError(f"set_progress: message must be a str, not {type(message).__name__}")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValueError(
            f"set_progress: message must be at most {MAX_MESSAGE_CHARS} characters, "
            f"not {len(message)}"
        )
    return {
        "current": checked_current,
        "total": checked_total,
        "message": storable_text(message),  # a handler's text: altered visibly, not refused
        "updated_at": now,
    }


def progress_to_json(progress: Progress | None) -> dict[str, Any] | None:
    """The stored (and JSON) form: ``updated_at`` in ISO 8601."""
    if progress is None:
        return None
    return {**progress, "updated_at": progress["updated_at"].isoformat()}


def progress_from_json(value: Any) -> Progress | None:
    """The Progress ``progress_to_json`` wrote (None stays None)."""
    if value is None:
        return None
    updated_at = dt.datetime.fromisoformat(value["updated_at"])
    if updated_at.tzinfo is None:
        updated_at = updated_at.replace(tzinfo=dt.timezone.utc)
    return {
        "current": value["current"],
        "total": value.get("total"),
        "message": value.get("message", ""),
        "updated_at": updated_at,
    }


def percent(progress: Progress | None) -> int | None:
    """How far, in whole percent (for a progress bar); None without a total."""
    if progress is None or progress["total"] is None:
        return None
    total = progress["total"]
    return 100 if total == 0 else min(100, int(100 * progress["current"] / total))


def _amount(value: float) -> str:
    """A count as written (``3``), a fraction to two decimals at most (``2.5``)."""
    return str(value) if isinstance(value, int) else f"{value:.2f}".rstrip("0").rstrip(".")


def progress_summary(progress: Progress) -> str:
    """``3 of 10 (30%): copying`` (``3: copying`` without a total), for people to read."""
    text = _amount(progress["current"])
    if progress["total"] is not None:
        text += f" of {_amount(progress['total'])} ({percent(progress)}%)"
    if progress["message"]:
        text += f": {progress['message']}"
    return text
