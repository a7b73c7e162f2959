"""Durable steps' names: what ``context.step`` and ``retry_task(from_step=...)`` accept."""

from __future__ import annotations

from .ids import MAX_ID_LENGTH
from .text import unstorable_char


def check_step_name(name: object, what: str = "step name") -> str:
    """``name`` when it can key a task's checkpoint: a non-empty string of at most
    MAX_ID_LENGTH characters that every storage can hold. TypeError or ValueError naming
    ``what`` otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a non-empty string, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{what} must be a non-empty string")
    if len(name) > MAX_ID_LENGTH:
        raise ValueError(f"{what} must be at most {MAX_ID_LENGTH} characters, not {len(name)}")
    bad = unstorable_char(name)
    if bad is not None:
        raise ValueError(f"{what} {name!r} holds {bad}, which no storage can hold")
    return name
