"""The two number tests every check shares: bool is an int to Python, never a count or a
duration to a caller."""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (NaN and infinity included: the caller bounds them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
