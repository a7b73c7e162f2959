"""The parameter index (setting SEARCHABLE_PARAMETERS): which (key, value) entries a task's
parameter adds to it, and which of a search's pairs it can answer.

A value is indexed by its canonical JSON text, so that every storage compares as
``parameter_filter.same_json`` does: 42 and 42.0 share ``42``, the string "42" is ``"42"``,
true is ``true`` (never 1). A text longer than MAX_VALUE_CHARS is kept as a digest (``#``
and its SHA-256), which no JSON text starts with, so index rows stay short enough for any
database's index.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Collection
from typing import Any

from .parameter_filter import Pairs
from .records import NewTask

# (key, canonical value) entries of one task, or of one search.
Entries = tuple[tuple[str, str], ...]
# The longest top-level key that can be made searchable (the index's key column).
MAX_KEY_CHARS = 100
# Canonical texts longer than this are kept as a digest (the index's value column).
MAX_VALUE_CHARS = 200


def canonical(value: Any) -> str | None:
    """The index text of a JSON scalar, None for a value that is not one (an object, a list,
    a number JSON cannot hold): such a value is not indexed."""
    if value is None or isinstance(value, bool):
        text = json.dumps(value)
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, int):
        # int's own text, as json.dumps writes it: a subclass's str() may be another (an
        # ``(int, Enum)`` member's is "Level.LOW", stored as 1).
        text = int.__repr__(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        # An integral float equals the int of its value (same_json): one text for both.
        text = int.__repr__(int(value)) if value.is_integer() else float.__repr__(value)
    else:
        return None
    if len(text) > MAX_VALUE_CHARS:
        return "#" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text


def index_entries(parameter: Any, keys: Collection[str]) -> Entries:
    """The entries a task of this parameter adds to the index: one per searchable top-level
    key holding a JSON scalar, sorted by key (none when the parameter is not an object)."""
    if not keys or not isinstance(parameter, dict):
        return ()
    entries = []
    for key in sorted(keys):
        if key in parameter:
            text = canonical(parameter[key])
            if text is not None:
                entries.append((key, text))
    return tuple(entries)


def search_entries(pairs: Pairs | None, keys: Collection[str]) -> Entries:
    """The pairs of a parameter search the index can answer (their keys are searchable), as
    entries; the storage reads the tasks of every one of them, then checks all the pairs."""
    if not pairs or not keys:
        return ()
    found = []
    for key, value in pairs:
        if key in keys:
            text = canonical(value)
            if text is not None:
                found.append((key, text))
    return tuple(found)


def with_entries(task: NewTask, keys: Collection[str]) -> NewTask:
    """``task`` with its parameter index entries for ``keys`` (a schedule's run: fire_task
    leaves them out)."""
    if task.indexed or not keys:
        return task
    entries = index_entries(task.parameter, keys)
    # (replace, not copy_with: fire_task builds its record without the fields it leaves out)
    return dataclasses.replace(task, indexed=entries) if entries else task
