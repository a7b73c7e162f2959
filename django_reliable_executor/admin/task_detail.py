"""What a task's detail page shows: its fields, related tasks (dependencies and dependents),
step timeline, durable wait and flow control, read through the service (any storage)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any
from urllib.parse import urlencode

from ..core.records import TaskInfo
from ..core.states import WAITING_STATUSES, TaskStatus
from ..core.waits import RECORD_KEY, wait_text
from ..registry import get_handler
from ..service.reliable_executor import ReliableExecutor
from .task_pages import (
    batch_url,
    change_url,
    changelist_url,
    format_duration,
    pretty_json,
    row,
)

#: A task page lists this many of the task's dependents, then says how many more.
DEPENDENTS_SHOWN = 100
# A step's result on the task's page: its JSON, cut after this many characters.
STEP_RESULT_CHARS = 80
# A rate limit's window (RateLimit.window_seconds) in words, for the task page.
RATE_WINDOWS = {1.0: "second", 60.0: "minute", 3600.0: "hour"}


@dataclasses.dataclass(frozen=True)
class Related:
    """A dependency or dependent of the task shown: a link, its status (None: purged), and
    whether the task still waits for it."""

    task_id: str
    url: str
    status: TaskStatus | None
    awaited: bool = False


def related_tasks(executor: ReliableExecutor, task: TaskInfo, site_name: str) -> dict[str, Any]:
    """The task's dependencies and dependents, each linked to its own detail page."""
    # A task thousands wait for: only the ids shown are read (the storage's LIMIT, or a few
    # SSCAN pages), the rest counted; the workflow graph draws more of them.
    shown = executor.dependents_of(task.task_id, DEPENDENTS_SHOWN)
    more = 0
    if len(shown) == DEPENDENTS_SHOWN:
        more = executor.count_dependents(task.task_id) - len(shown)
    found = executor.storage.get_many([*task.depends_on, *shown])

    def related(task_id: str, awaited: bool = False) -> Related:
        other = found.get(task_id)
        status = other.status if other is not None else None
        return Related(task_id, change_url(task_id, site_name), status, awaited)

    return {
        "dependencies": [related(d, d in task.waiting_for) for d in task.depends_on],
        "dependents": [related(d) for d in shown],
        "dependents_more": max(more, 0),
    }


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One checkpoint of the task's step timeline: its name, when it finished, and the start
    of its stored result's JSON ("" when the checkpoint went between the two reads)."""

    number: int
    name: str
    finished_at: dt.datetime
    result: str
    result_cut: bool  # the JSON was longer than STEP_RESULT_CHARS


def short_json(value: Any) -> tuple[str, bool]:
    """The JSON of ``value`` on one line, cut to STEP_RESULT_CHARS (True when it was cut)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if len(text) <= STEP_RESULT_CHARS:
        return text, False
    return text[: STEP_RESULT_CHARS - 1] + "\u2026", True


def step_timeline(executor: ReliableExecutor, task: TaskInfo) -> list[StepRow]:
    """The task's checkpoints in the order they finished, with their results: one more read
    of the storage (``step_results``, all of the task's at once), none for a task without
    steps."""
    if not task.steps:
        return []
    results = executor.storage.step_results(task.task_id)
    rows = []
    for number, step in enumerate(task.steps, start=1):
        stored = results.get(step.name)
        if isinstance(stored, dict) and RECORD_KEY in stored:  # a durable wait's record
            until = f" until {stored['until']}" if stored.get("until") else ""
            text, cut = f"a wait: {stored[RECORD_KEY]}{until}", False
        else:
            text, cut = short_json(stored) if step.name in results else ("", False)
        rows.append(StepRow(number, step.name, step.finished_at, text, cut))
    return rows


def task_detail(executor: ReliableExecutor, task: TaskInfo, site_name: str) -> dict[str, Any]:
    now = executor.clock.now()
    waited = None
    if task.status in WAITING_STATUSES and task.run_at <= now:
        waited = format_duration(now - task.run_at)
    return {
        "task": task,
        "row": row(task, now, site_name),
        **related_tasks(executor, task, site_name),
        "parameter_json": pretty_json(task.parameter),
        "result_json": pretty_json(task.result) if task.result is not None else None,
        "due_for": waited,
        "max_duration": format_duration(dt.timedelta(milliseconds=task.max_duration_millis))
        if task.max_duration_millis
        else None,
        "retry_interval": format_duration(dt.timedelta(milliseconds=task.retry_interval)),
        "attempt_timeout": attempt_timeout_text(task),
        "flow_control": key_flow_text(task),
        "rate_control": rate_flow_text(task),
        "batch_url": batch_url(task.batch_id, site_name) if task.batch_id else None,
        # Each tag links to the list of the tasks with it (the search box's "tag:...").
        "tag_links": [
            (tag, changelist_url(site_name) + "?" + urlencode({"tag": tag})) for tag in task.tags
        ],
        "steps": step_timeline(executor, task),
        "waiting": waiting_detail(task, site_name),
    }


def waiting_detail(task: TaskInfo, site_name: str) -> dict[str, Any] | None:
    """What a waiting task waits for (a durable wait), with links to the awaited tasks."""
    waiting = task.waiting
    if not waiting:
        return None
    until = waiting.get("until")
    return {
        "kind": waiting.get("kind"),
        "name": waiting.get("name"),
        "event": waiting.get("event"),
        "until": dt.datetime.fromisoformat(until) if until else None,
        "text": wait_text(waiting),
        "tasks": [
            Related(t, change_url(t, site_name), None, t in task.waiting_for)
            for t in waiting.get("task_ids") or ()
        ],
    }


def attempt_timeout_text(task: TaskInfo) -> str | None:
    """The limit each attempt of ``task`` runs under: its own, else its handler's (said so),
    else None."""
    if task.attempt_timeout is not None:
        return f"{format_duration(dt.timedelta(seconds=task.attempt_timeout))} per attempt"
    handler = get_handler(task.task_name)
    if handler is not None and handler.attempt_timeout is not None:
        limit = format_duration(dt.timedelta(seconds=handler.attempt_timeout))
        return f"{limit} per attempt (its handler's)"
    return None


def key_flow_text(task: TaskInfo) -> str | None:
    """What the handler of ``task`` does with its concurrency key (its cap per key, its
    turns), or None: the handler's options, as this process registered them."""
    handler = get_handler(task.task_name)
    if handler is None:
        return None
    parts = []
    if handler.max_concurrency_per_key is not None:
        n = handler.max_concurrency_per_key
        parts.append(f"at most {n} task{'s' if n != 1 else ''} of this name and key run at once")
    if handler.fairness is not None:
        parts.append("the keys take turns")
    return "; ".join(parts) or None


def rate_flow_text(task: TaskInfo) -> str | None:
    """What the handler of ``task`` does with its rate key (its starts per window per key, its
    turns when the task has no concurrency key to take them under), or None: the handler's
    options, as this process registered them."""
    handler = get_handler(task.task_name)
    if handler is None:
        return None
    parts = []
    if handler.rate_limit is not None:
        n, window = handler.rate_limit.count, RATE_WINDOWS[handler.rate_limit.window_seconds]
        parts.append(
            f"at most {n} task{'s' if n != 1 else ''} of this name and key start in any {window}"
        )
    if handler.fairness is not None and task.concurrency_key is None:
        parts.append("the keys take turns")
    return "; ".join(parts) or None
