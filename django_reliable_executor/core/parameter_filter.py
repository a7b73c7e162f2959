"""``list_tasks(parameter=...)``: the pairs a task's JSON parameter must hold, checked, and the
comparison every storage makes (a JSON value's type and value: 42 is not "42", true is not 1)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .text import unstorable_char

# The pairs of a parameter filter, sorted by key: hashable, so a TaskQuery holding them is too.
Pairs = tuple[tuple[str, Any], ...]
# How many pairs one filter may hold: each is one more condition per task read.
MAX_PAIRS = 20
SCALARS = "a string, a number, True, False or None"


def checked_parameter(parameter: Mapping[str, Any] | None) -> Pairs | None:
    """``parameter`` as sorted (key, value) pairs (None: no filter); a ValueError names what is
    wrong. Values are JSON scalars: a nested object or list is refused, not compared."""
    if parameter is None:
        return None
    if not isinstance(parameter, Mapping):
        raise ValueError(
            f"parameter must be a dict of top-level keys and values, got {type(parameter).__name__}"
        )
    if not parameter:
        raise ValueError("parameter must name at least one key")
    if len(parameter) > MAX_PAIRS:
        raise ValueError(f"parameter names {len(parameter)} keys, over the {MAX_PAIRS} allowed")
    for key, value in parameter.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"parameter's keys must be non-empty strings, got {key!r}")
        problem = value_problem(value)
        if problem is not None:
            raise ValueError(f"parameter[{key!r}] {problem}")
    return tuple(sorted(parameter.items()))


def value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be searched for (None: it can): only JSON scalars are compared."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value}: JSON has no such number"
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            int.__repr__(value)
        except ValueError:  # past Python's limit of digits: no stored parameter holds it
            return "is an integer of too many digits to search for"
    if value is None or isinstance(value, (str, int, float, bool)):
        return None
    return f"is a {type(value).__name__}: only {SCALARS} can be searched for"


def storable(pairs: Pairs) -> bool:
    """False when no stored parameter can hold one of the texts (submits refuse them)."""
    return not any(
        unstorable_char(text)
        for key, value in pairs
        for text in (key, value)
        if isinstance(text, str)
    )


def same_json(stored: Any, wanted: Any) -> bool:
    """Whether a stored JSON value equals a searched one as JSON values: same type (a bool is
    not a number), numbers by value (42 equals 42.0)."""
    if wanted is None or isinstance(wanted, bool):
        return stored is wanted
    if isinstance(wanted, str):
        return isinstance(stored, str) and stored == wanted
    return isinstance(stored, (int, float)) and not isinstance(stored, bool) and stored == wanted


def matches(parameter: Any, pairs: Pairs) -> bool:
    """Whether a task's parameter (its JSON value) is an object holding every pair."""
    if not isinstance(parameter, dict):
        return False
    return all(key in parameter and same_json(parameter[key], value) for key, value in pairs)


def pairs_json(pairs: Pairs) -> str:
    """The pairs as one compact JSON object (PostgreSQL's ``@>``, MariaDB's JSON_CONTAINS)."""
    return json.dumps(dict(pairs), separators=(",", ":"), ensure_ascii=False)


class TaskPage(list):  # type: ignore[type-arg]  # of TaskInfo
    """A page of ``list_tasks`` whose parameter search stopped at its storage's bound before
    it read every task the other filters allow (Redis: see storage/redis/parameter_scan.py):
    older matches, and some newer ones, may be missing. ``list_tasks`` answers a plain list
    otherwise; ``cut_short(page)`` tells them apart."""

    cut_short = True


def cut_short(page: list[Any]) -> bool:
    """Whether a page of ``list_tasks`` is a TaskPage: its search stopped at a bound."""
    return isinstance(page, TaskPage)
