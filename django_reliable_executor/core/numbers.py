"""The two number tests every check shares: bool is an int to Python, never a count or a
duration to a caller."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # TypeIs narrows both branches of a test; typing has it from 3.13 only
    from typing_extensions import TypeIs


def is_int(value: Any) -> TypeIs[int]:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeIs[int | float]:
    """An int or a float, not a bool (NaN and infinity included: the caller bounds them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
