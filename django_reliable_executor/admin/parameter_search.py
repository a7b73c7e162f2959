"""The task list's search box read as filters: ``tag:import customer_id=42 region=eu`` lists the
tasks tagged "import" whose parameter holds customer_id 42 and region "eu".

A ``key=value`` term's value is read as JSON when it is JSON (``42``, ``true``, ``null``,
``"42"``), as a string otherwise (``Edinburgh``); a quoted value may hold spaces
(``city="New York"``). The list URL carries the pairs as one JSON object (``?parameter=``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from ..core.parameter_filter import checked_parameter

TAG_PREFIX = "tag:"
# A term: key=value with a quoted value (spaces and escaped quotes inside), or any word.
TERM = re.compile(r'[^\s=]*="(?:[^"\\]|\\.)*"(?=\s|$)|\S+')
HELP = 'search terms are tag:NAME and key=value (e.g. customer_id=42 city="New York")'


@dataclasses.dataclass(frozen=True)
class Search:
    """What a search box text asks for: a tag, parameter pairs, or what was wrong with it."""

    tag: str | None = None
    parameter: dict[str, Any] | None = None
    problem: str | None = None

    @property
    def parameter_text(self) -> str | None:
        """The pairs as the list URL carries them (None: no parameter filter)."""
        return None if self.parameter is None else compact(self.parameter)


def is_filter_search(text: str) -> bool:
    """Whether a search box text asks for filters (a tag or key=value terms), not a task id."""
    return any(t.startswith(TAG_PREFIX) or "=" in t for t in TERM.findall(text))


def parse(text: str) -> Search:
    """The filters a search box text asks for; ``problem`` names the first term not read."""
    tag, pairs = None, {}
    for term in TERM.findall(text):
        if term.startswith(TAG_PREFIX):
            if tag is not None:
                return Search(problem=f"One tag at a time: {term!r} is a second one.")
            tag = term[len(TAG_PREFIX) :] or None  # "tag:" alone: no tag filter
            continue
        key, equals, raw = term.partition("=")
        if not equals or not key:
            return Search(problem=f"Could not read {term!r}: {HELP}.")
        if not raw:
            return Search(problem=f'{term!r} has no value: write {key}="" for an empty string.')
        if key in pairs:
            return Search(problem=f"{key!r} is given twice.")
        pairs[key] = term_value(raw)
    parameter = pairs or None
    try:
        checked_parameter(parameter)
    except ValueError as exc:
        return Search(problem=f"Could not search by {exc}.")
    return Search(tag=tag, parameter=parameter)


def term_value(raw: str) -> Any:
    """A key=value term's value: its JSON value when it is JSON, else the text itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def url_parameter(text: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The pairs of a list URL's ``parameter`` (a JSON object), and what is wrong with it."""
    if text is None:
        return None, None
    try:
        value = json.loads(text)
        checked_parameter(value)
    except ValueError as exc:
        return None, f"The list's parameter filter {text!r} is not one: {exc}."
    return value, None


def valid_text(text: str | None) -> str | None:
    """A list URL's ``parameter`` when it is a valid filter (None otherwise: the list page
    says what is wrong with it, url_parameter)."""
    value, problem = url_parameter(text)
    return None if value is None or problem is not None else compact(value)


def filters_text(tag: str | None, parameter: str | None) -> str:
    """The search box text of a list's tag and parameter filters: what asks for them again."""
    terms = [TAG_PREFIX + tag] if tag is not None else []
    pairs = {} if parameter is None else json.loads(parameter)
    for key, value in pairs.items():
        terms.append(f"{key}={shown(value)}")
    return " ".join(terms)


def shown(value: Any) -> str:
    """A value as a term writes it: a string bare when it reads back as that string."""
    if (
        isinstance(value, str)
        and value
        and term_value(value) == value
        and not re.search(r'[\s"]', value)
    ):
        return value
    return compact(value)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
