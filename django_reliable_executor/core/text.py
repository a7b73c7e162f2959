"""Characters no storage can hold: refused in what callers give, replaced in what workers write."""

from __future__ import annotations

import re
from typing import Any

from ..exceptions import TaskSubmitError

# NUL: PostgreSQL refuses it in text and in jsonb. A surrogate code point (lone, or two of them
# standing for a pair, as some decoders leave them): no UTF-8 encoder writes it, so SQLite,
# MySQL/MariaDB, PostgreSQL and Redis all refuse it. Each storage takes everything else (the
# MySQL/MariaDB columns are utf8mb4: 4-byte characters included). One rule for every storage,
# so a task's text reads the same wherever it is stored.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def unstorable_char(text: str) -> str | None:
    """The first character of ``text`` no storage can hold, described ("NUL", "a lone
    surrogate U+D800"); None when there is none."""
    if text.isascii() and "\x00" not in text:  # the common case, without the regex
        return None
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    return "NUL" if char == "\x00" else f"a lone surrogate U+{ord(char):04X}"


def storable_text(text: str) -> str:
    """``text`` as every storage can hold it: each NUL and surrogate replaced by U+FFFD, and a
    note saying so appended (a line of its own after text of several lines, a traceback's
    exception line staying where tasks_backend.exception_path reads it). ``text`` itself when
    it has none. For text the worker writes (a handler's error, its progress message): never
    refused, altered visibly."""
    if text.isascii() and "\x00" not in text:  # the common case, without the regex
        return text
    altered, count = _UNSTORABLE.subn(REPLACEMENT, text)
    if not count:
        return text
    note = f"(text altered: {count} NUL or surrogate character(s) replaced by U+FFFD)"
    if "\n" in altered:  # a traceback: the note is its last line, after the exception's
        return altered.rstrip("\n") + "\n" + note
    return f"{altered} {note}"


def check_caller_text(
    value: Any, field: str, error: type[TaskSubmitError] = TaskSubmitError
) -> None:
    """Raise ``error`` (``field=field``) when ``value``, a string a caller gives, holds a
    character no storage can hold. Other values pass: the field's own rule judges them."""
    if not isinstance(value, str):
        return
    problem = unstorable_char(value)
    if problem is not None:
        raise error(
            f"{field} contains {problem}, which no storage can hold: got {value[:100]!r}",
            field=field,
        )


def ascii_text(text: str) -> str:
    """``text`` with every non-ASCII character escaped (``\\U0001f600``) and a note saying so:
    the last resort for text a storage refused anyway (a MySQL column not in utf8mb4 refuses
    4-byte characters), so the text is recorded rather than lost."""
    escaped = text.encode("ascii", "backslashreplace").decode("ascii")
    return (
        escaped.rstrip("\n")
        + "\n(text altered: non-ASCII characters escaped: the storage refused them)"
    )
