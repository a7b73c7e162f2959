"""Unique tasks: the rules for ``unique_for`` and ``unique_key``, and the key a storage stores."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from typing import Any

from ..exceptions import InvalidTaskOptionError
from .ids import MAX_ID_LENGTH
from .numbers import is_number
from .text import check_caller_text

MAX_UNIQUE_KEY_LENGTH = MAX_ID_LENGTH  # the unique key column's width
# Longest window accepted: a year is far beyond any real use and keeps now + it a valid datetime.
MAX_UNIQUE_SECONDS = 365 * 24 * 3600


def check_unique_for(value: Any) -> float:
    """``value`` as seconds, or InvalidTaskOptionError (``field="unique_for"``)."""
    ok = is_number(value) and math.isfinite(value) and 0 < value <= MAX_UNIQUE_SECONDS
    if not ok:
        raise InvalidTaskOptionError(
            f"unique_for must be a number of seconds above 0 and at most {MAX_UNIQUE_SECONDS}, "
            f"got {value!r}",
            field="unique_for",
        )
    return float(value)


def check_unique_key(value: Any) -> str:
    """``value`` as a key, or InvalidTaskOptionError (``field="unique_key"``)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_UNIQUE_KEY_LENGTH:
        raise InvalidTaskOptionError(
            f"unique_key must be a string of 1..{MAX_UNIQUE_KEY_LENGTH} characters, got {value!r}"[
                :300
            ],
            field="unique_key",
        )
    check_caller_text(value, "unique_key", InvalidTaskOptionError)
    return value


def unique_digest(task_name: str, unique_key: str | None, parameter: Any) -> str:
    """The key a storage stores for a unique task (64 hex digits): per task name, the given
    ``unique_key``, else the canonical JSON of the (JSON-ready) parameter — sorted keys,
    compact separators — so equal parameters give equal keys whatever their key order."""
    if unique_key is not None:
        text = f"{task_name}\0key\0{unique_key}"
    else:
        canonical = json.dumps(parameter, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        text = f"{task_name}\0parameter\0{canonical}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unique_window(
    request_for: Any, request_key: Any, handler_for: float | None, now: dt.datetime
) -> tuple[bool, str | None, dt.datetime | None]:
    """Check a submit's unique options (its own, then the handler's ``unique_for``): whether
    the task is unique, its checked ``unique_key`` and the end of its window."""
    seconds = request_for if request_for is not None else handler_for
    if seconds is None:
        if request_key is not None:
            raise InvalidTaskOptionError(
                "unique_key needs unique_for (the seconds the key holds), on the submit or "
                "the handler",
                field="unique_key",
            )
        return False, None, None
    window = check_unique_for(seconds)
    key = None if request_key is None else check_unique_key(request_key)
    return True, key, now + dt.timedelta(seconds=window)
