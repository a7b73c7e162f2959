"""A TaskInfo as plain JSON and back: what ``executor show --json`` prints, what the HTTP API
answers and what crosses the process pool's pipe."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from .progress import progress_from_json, progress_to_json
from .records import StepInfo, TaskInfo
from .states import TaskStatus


def task_to_json(task: TaskInfo) -> dict[str, Any]:
    """Every TaskInfo field under its own name: datetimes in ISO 8601, the status by its value
    (what ``executor show --json`` prints and what crosses the process pool's pipe)."""
    plain: dict[str, Any] = {}
    for field in dataclasses.fields(task):
        value = getattr(task, field.name)
        if isinstance(value, dt.datetime):
            value = value.isoformat()
        elif isinstance(value, TaskStatus):
            value = value.value
        elif field.name == "progress":
            value = progress_to_json(value)
        elif field.name == "steps":
            value = [
                {"name": step.name, "finished_at": step.finished_at.isoformat()} for step in value
            ]
        elif isinstance(value, tuple):
            value = list(value)
        plain[field.name] = value
    return plain


def task_from_json(plain: dict[str, Any]) -> TaskInfo:
    """The TaskInfo ``task_to_json`` wrote."""
    values = dict(plain)
    for field in dataclasses.fields(TaskInfo):
        value = values.get(field.name)
        if isinstance(value, str) and "datetime" in str(field.type):
            values[field.name] = dt.datetime.fromisoformat(value)
    values["status"] = TaskStatus(values["status"])
    values["progress"] = progress_from_json(values.get("progress"))
    for name in ("depends_on", "waiting_for", "tags"):
        values[name] = tuple(values.get(name) or ())
    values["steps"] = tuple(
        StepInfo(step["name"], dt.datetime.fromisoformat(step["finished_at"]))
        for step in values.get("steps") or ()
    )
    return TaskInfo(**values)
