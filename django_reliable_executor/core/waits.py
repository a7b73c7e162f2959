"""Durable waits (``context.sleep``, ``wait_for_event``, ``wait_for``): what a wait is, as the
worker hands it to the storage and as ``TaskInfo.waiting`` shows it, and its stored record.

A handler that waits stops there: its task goes back to PENDING without a lease, holding no
worker slot, until its time comes, its event arrives or the tasks it waits for end; then the
handler is called again from the top (a resumption, not an attempt). Each wait is keyed by its
name like a step: its record, stored with the task's checkpoints when it first waits, fixes its
end (a sleep's ``until``, a timeout) so a resumed call returns at once, or waits on for what is
left, and never starts the clock again."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

from .numbers import is_number

#: The kinds of wait (``TaskInfo.waiting["kind"]``).
SLEEP, EVENT, TASKS = "sleep", "event", "tasks"
WAIT_KINDS = (SLEEP, EVENT, TASKS)
#: The key of a wait's record among a task's checkpoints: its value names the kind.
RECORD_KEY = "__wait__"
#: At most this many tasks per ``wait_for``.
MAX_AWAITED_TASKS = 100
#: The longest wait or timeout: about 100 years, well inside every storage's datetimes.
MAX_WAIT_SECONDS = 100 * 366 * 86400


@dataclasses.dataclass(frozen=True)
class Wait:
    """One wait of a handler, as the storage records it. ``until``: when a sleep ends or a
    timeout passes (None: an event or tasks waited for without a timeout). ``event``: the
    event's name (kind "event"). ``task_ids``: the tasks still awaited (kind "tasks")."""

    kind: str
    name: str
    until: dt.datetime | None = None
    event: str | None = None
    task_ids: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        """``TaskInfo.waiting``: the wait as a JSON object (``until`` in ISO 8601)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "until": None if self.until is None else self.until.isoformat(),
            "event": self.event,
            "task_ids": list(self.task_ids),
        }

    def record(self) -> dict[str, Any]:
        """The checkpoint stored under the wait's name: what a resumed call needs to know."""
        record: dict[str, Any] = {RECORD_KEY: self.kind}
        if self.until is not None:
            record["until"] = self.until.isoformat()
        if self.kind == TASKS:
            record["task_ids"] = list(self.task_ids)
        return record


def is_record(value: Any, kind: str) -> bool:
    """``value`` (a stored checkpoint) is the record of a wait of ``kind``."""
    return isinstance(value, dict) and value.get(RECORD_KEY) == kind


def record_until(value: dict[str, Any]) -> dt.datetime | None:
    until = value.get("until")
    return None if until is None else dt.datetime.fromisoformat(until)


def wait_from_json(value: Any) -> dict[str, Any] | None:
    """``TaskInfo.waiting`` from its stored JSON (text or a decoded object)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        import json

        value = json.loads(value)
    return dict(value)


def wait_seconds(value: Any, what: str) -> float:
    """A duration a wait takes (seconds, or a timedelta), as seconds; TypeError or ValueError
    naming ``what`` when it is not one."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if not is_number(value):
        raise TypeError(f"{what} must be a number of seconds or a timedelta, not {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0 or seconds > MAX_WAIT_SECONDS:
        raise ValueError(
            f"{what} must be between 0 and {MAX_WAIT_SECONDS} seconds (about 100 years), "
            f"not {value!r}"
        )
    return seconds


def wait_text(waiting: dict[str, Any] | None) -> str:
    """``TaskInfo.waiting`` in words: "sleep 'nap' until 2026-12-08T09:00:00+00:00", "event
    'approved' (timeout ...)", "tasks 'children': a, b"; "-" for none."""
    if not waiting:
        return "-"
    kind, name, until = waiting.get("kind"), waiting.get("name"), waiting.get("until")
    if kind == SLEEP:
        return f"sleep {name!r} until {until}"
    ending = f" (timeout {until})" if until else ""
    if kind == EVENT:
        return f"event {waiting.get('event')!r}{ending}"
    return f"tasks {name!r}: {', '.join(waiting.get('task_ids') or ())}{ending}"
