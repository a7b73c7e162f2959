"""The filters of ``executor.list_tasks``, checked: a ValueError names a wrong one, and a
filter no stored task can match answers "nothing" without asking the storage."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ..core.ids import MAX_SCHEDULE_ID_LENGTH
from ..core.numbers import is_int
from ..core.parameter_filter import checked_parameter, storable
from ..core.parameter_index import search_entries
from ..core.queries import TaskQuery
from ..core.states import TaskStatus
from ..core.tags import tag_problem
from ..core.text import unstorable_char
from ..storage.checks import task_query

# The largest offset a listing passes to its storage: past any number of tasks stored, and
# small enough that offset + limit (a limit below 8 * 10**18) stays a signed 64-bit integer,
# as every storage's LIMIT, OFFSET and range arguments must: a larger offset lists nothing
# rather than make the storage raise.
MAX_OFFSET = 10**18


def as_status(value: TaskStatus | str) -> TaskStatus:
    try:
        return TaskStatus(value)
    except ValueError:
        raise ValueError(f"unknown status {value!r}") from None


def checked_statuses(
    status: TaskStatus | str | None, statuses: Iterable[TaskStatus | str] | None
) -> tuple[TaskStatus | None, frozenset[TaskStatus] | None]:
    """``status`` and ``statuses`` as statuses (give one, not both)."""
    if status is not None and statuses is not None:
        raise ValueError("give status or statuses, not both")
    if status is not None:
        status = as_status(status)
    chosen = None
    if statuses is not None:
        if isinstance(statuses, str):  # "FAILED" would be read as "F", "A", ...
            raise ValueError("statuses must be a collection of statuses, not a string")
        chosen = frozenset(as_status(s) for s in statuses)
    return status, chosen


def plausible_filters(
    limit: int,
    offset: int,
    task_name: str | None,
    queue: str | None,
    batch_id: str | None,
    schedule_runs: bool | None,
    schedule_id: str | None,
) -> bool:
    """Check the other filters (ValueError naming a wrong one); False when no stored task can
    match them, or the page starts past MAX_OFFSET."""
    if not is_int(limit) or limit < 0 or not is_int(offset) or offset < 0:
        raise ValueError("limit and offset must be integers >= 0")
    if limit > MAX_OFFSET:  # offset + limit must stay a signed 64-bit integer (see above)
        raise ValueError(f"limit must be at most 10**18, got {limit}")
    if batch_id is not None and (not isinstance(batch_id, str) or not batch_id):
        raise ValueError("batch_id must be a non-empty string")
    if schedule_runs is not None and not isinstance(schedule_runs, bool):
        raise ValueError(f"schedule_runs must be True, False or None, got {schedule_runs!r}")
    if schedule_id is not None and (not isinstance(schedule_id, str) or not schedule_id):
        raise ValueError("schedule_id must be a non-empty string")
    if schedule_id is not None and schedule_runs is False:
        raise ValueError("schedule_id lists schedule runs: it cannot go with schedule_runs=False")
    if schedule_id is not None and len(schedule_id) > MAX_SCHEDULE_ID_LENGTH:
        return False  # no schedule has such an id, so no run either
    if offset > MAX_OFFSET:
        return False  # no task stands that far down any listing
    texts = (task_name, queue, batch_id, schedule_id)
    # No stored task holds such text (submits refuse it).
    return not any(isinstance(t, str) and unstorable_char(t) for t in texts)


def plausible_tag(tag: str | None) -> bool:
    """Check ``tag`` (ValueError unless None or a string); False when no stored task can
    have it (submits refuse such a tag)."""
    if tag is None:
        return True
    if not isinstance(tag, str):
        raise ValueError(f"tag must be a string, got {type(tag).__name__}")
    return tag_problem(tag) is None


def storable_id(value: object) -> bool:
    """``value`` may be a stored id: a non-empty string without text no storage can hold
    (submits refuse it, so no task has it: looking it up would only make the storage raise)."""
    return isinstance(value, str) and bool(value) and unstorable_char(value) is None


def listing_query(filters: Mapping[str, Any], searchable: Collection[str]) -> TaskQuery | None:
    """The query ``list_tasks(**filters)`` hands the storage, checked as it checks them (a
    ValueError names a wrong one), of one task at offset 0 (a count ignores both); None when
    no stored task can match. ``searchable``: the setting SEARCHABLE_PARAMETERS."""
    status, statuses = checked_statuses(filters.get("status"), filters.get("statuses"))
    pairs = checked_parameter(filters.get("parameter"))
    task_name, queue, batch_id = (filters.get(n) for n in ("task_name", "queue", "batch_id"))
    runs, schedule_id, tag = (filters.get(n) for n in ("schedule_runs", "schedule_id", "tag"))
    if not plausible_filters(1, 0, task_name, queue, batch_id, runs, schedule_id) or not (
        plausible_tag(tag) and (pairs is None or storable(pairs))
    ):
        return None
    indexed = search_entries(pairs, searchable)
    return task_query(
        status, statuses, task_name, queue, 1, 0, batch_id, runs, schedule_id, tag, pairs, indexed
    )
