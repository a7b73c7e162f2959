"""Task tags (the submit option ``tags``): checked, folded, and the admin's ``tag:`` search."""

from __future__ import annotations

from typing import Any

from ..exceptions import InvalidTaskOptionError
from .text import unstorable_char

MAX_TAGS = 20  # per task (docs/submitting.md, "Tags")
MAX_TAG_LENGTH = 64  # characters: the tag table's column, and the Redis set's key suffix


def tag_problem(value: Any) -> str | None:
    """Why ``value`` is no good tag (None: it is one)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TAG_LENGTH:
        return f"each tag must be a string of 1..{MAX_TAG_LENGTH} characters, got {value!r}"
    problem = unstorable_char(value)
    if problem is not None:
        return f"a tag contains {problem}, which no storage can hold: got {value[:100]!r}"
    return None


def checked_tags(value: Any) -> tuple[str, ...]:
    """The ``tags`` a submit gives, checked and folded: duplicates dropped, the first of each
    kept in place; () for None. Raises InvalidTaskOptionError naming ``tags``."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise InvalidTaskOptionError(
            f"tags must be a list or tuple of strings, got {type(value).__name__}", field="tags"
        )
    for tag in value:
        problem = tag_problem(tag)
        if problem is not None:
            raise InvalidTaskOptionError(f"tags: {problem}", field="tags")
    tags = tuple(dict.fromkeys(value))
    if len(tags) > MAX_TAGS:
        raise InvalidTaskOptionError(
            f"tags holds {len(tags)} different tags: at most {MAX_TAGS}", field="tags"
        )
    return tags
