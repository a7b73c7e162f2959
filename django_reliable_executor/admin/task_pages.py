"""What the task list page shows, and the helpers the other pages share (URLs, filters, rows,
durations), read through the service (any storage).

Nothing here touches the ORM or Redis: the pages work the same on every storage. Each function
returns the template context of one part of a page; the list's summary is ``task_summary``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import mark_safe

from ..core.parameter_filter import cut_short
from ..core.progress import percent, progress_summary
from ..core.records import TaskInfo
from ..core.states import DEAD_LETTER_STATUSES, WAITING_STATUSES, TaskStatus
from ..registry import all_handlers
from ..service.listing import MAX_OFFSET
from ..service.reliable_executor import ReliableExecutor
from . import parameter_search
from .operations import can_cancel, can_retry

PAGE_SIZE = 100
# The last page whose offset list_tasks takes (service/listing.py MAX_OFFSET).
MAX_PAGE = MAX_OFFSET // PAGE_SIZE + 1
# The filters a list URL may carry, in the order they appear in it.
FILTERS = ("status", "queue", "task_name", "origin", "schedule", "batch_id", "tag", "parameter")
# ``?origin=``: the tasks submitted (schedule runs left out), or only the schedules' runs.
ORIGINS = {"submitted": "Submitted", "schedules": "Schedule runs"}
# ``?status=dead``: the dead letters, tasks that ended FAILED, TIMEOUT or ERROR, listed together.
DEAD_LETTERS = "dead"
DEAD_LETTERS_LABEL = "Dead letters"


def change_url(task_id: str, site_name: str = "admin") -> str:
    """The task's page in the admin site named ``site_name``."""
    return reverse(
        f"{site_name}:django_reliable_executor_reliabletask_change", args=[quote(task_id)]
    )


def batch_url(batch_id: str, site_name: str = "admin") -> str:
    """The batch's page (batch_pages) in the admin site named ``site_name``."""
    return reverse(
        f"{site_name}:django_reliable_executor_reliabletask_batch", args=[quote(batch_id)]
    )


def changelist_url(site_name: str = "admin") -> str:
    return reverse(f"{site_name}:django_reliable_executor_reliabletask_changelist")


def format_duration(delta: dt.timedelta | None) -> str:
    """A short human duration: "350 ms", "4.2 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"."""
    if delta is None:
        return ""
    seconds = delta.total_seconds()
    if seconds < 0:
        return "-" + format_duration(-delta)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Filters:
    """The list's filters and page, parsed from the query string (bad values are dropped).

    ``status=dead`` sets ``dead_letters`` (and leaves ``status`` None): FAILED, TIMEOUT and
    ERROR tasks together."""

    status: TaskStatus | None = None
    queue: str | None = None
    task_name: str | None = None
    page: int = 1
    dead_letters: bool = False
    batch_id: str | None = None  # a batch's members and callbacks (its page links here)
    origin: str | None = None  # a key of ORIGINS
    schedule: str | None = None  # one schedule's runs (its page links here)
    tag: str | None = None  # the tasks submitted with this tag (the search box's "tag:...")
    # The tasks whose parameter holds these pairs, a JSON object (the search box's "key=value").
    parameter: str | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Filters:
        raw_status = query.get("status", "")
        dead_letters = raw_status == DEAD_LETTERS
        try:
            status = None if dead_letters else TaskStatus(raw_status)
        except ValueError:
            status = None
        try:
            page = max(int(query.get("page", "1")), 1)
        except ValueError:
            page = 1
        if page > MAX_PAGE:  # past any task stored: a bad value too, not a storage error
            page = 1
        return cls(
            status=status,
            queue=query.get("queue", "").strip() or None,
            task_name=query.get("task_name", "").strip() or None,
            page=page,
            dead_letters=dead_letters,
            batch_id=query.get("batch_id", "").strip() or None,
            origin=query.get("origin") if query.get("origin") in ORIGINS else None,
            schedule=query.get("schedule", "").strip() or None,
            tag=query.get("tag", "").strip() or None,
            parameter=parameter_search.valid_text(query.get("parameter")),
        )

    @property
    def may_cancel(self) -> bool:
        """Whether the filtered tasks may include some a cancel changes (waiting or running):
        the list offers "Cancel all matching" only then (not over dead letters, say)."""
        if self.dead_letters:
            return False
        return self.status is None or self.status in WAITING_STATUSES | {TaskStatus.RUNNING}

    @property
    def active(self) -> bool:
        values = (
            self.status_param,
            self.queue,
            self.task_name,
            self.batch_id,
            self.origin,
            self.schedule,
            self.tag,
            self.parameter,
        )
        return any(v is not None for v in values)

    @property
    def schedule_runs(self) -> bool | None:
        """``list_tasks(schedule_runs=...)`` of the origin chosen (None: either)."""
        if self.schedule is not None:
            return None  # one schedule's runs: schedule_id says it
        return {"submitted": False, "schedules": True}.get(self.origin or "")

    @property
    def status_param(self) -> str | None:
        """The ``status`` value of the list URL: a status, "dead", or None."""
        if self.dead_letters:
            return DEAD_LETTERS
        return self.status.value if self.status is not None else None

    @property
    def statuses(self) -> frozenset[TaskStatus] | None:
        """The statuses listed (None: every one)."""
        if self.dead_letters:
            return DEAD_LETTER_STATUSES
        return frozenset({self.status}) if self.status is not None else None

    def list_filters(self) -> dict[str, Any]:
        """The keyword filters of ``executor.list_tasks`` these filters list (the bulk actions
        walk the same ones)."""
        return {
            "status": None if self.dead_letters else self.status,
            "statuses": DEAD_LETTER_STATUSES if self.dead_letters else None,
            "task_name": self.task_name,
            "queue": self.queue,
            "batch_id": self.batch_id,
            "schedule_runs": self.schedule_runs,
            "schedule_id": self.schedule,
            "tag": self.tag,
            "parameter": None if self.parameter is None else json.loads(self.parameter),
        }

    def url(self, **changes: Any) -> str:
        """The list's query string with some values changed (None removes one). A change of
        filter goes back to page 1."""
        values: dict[str, Any] = {name: getattr(self, name) for name in (*FILTERS, "page")}
        values["status"] = self.status_param
        if set(changes) - {"page"}:
            values["page"] = None
        values.update(changes)
        return query_url(values)


def query_url(values: dict[str, Any]) -> str:
    """A list page's query string: values that are None, and page 1, left out."""
    if values.get("page") == 1:
        values = {**values, "page": None}
    pairs = [(k, str(v)) for k, v in values.items() if v is not None]
    return "?" + urlencode(pairs) if pairs else "?"


@dataclasses.dataclass(frozen=True)
class Row:
    """One task of the list, with what the columns show beside the stored fields."""

    task: TaskInfo
    url: str
    next_run: dt.datetime | None
    duration: str
    can_retry: bool
    can_cancel: bool
    progress: str  # "3 of 10 (30%): copying"; "" before any report
    percent: int | None  # of the progress bar; None without a report or its total

    @property
    def task_name_html(self) -> str:
        """The task name, escaped, with a break allowed after each "." and "_": a long name
        wraps between its words ("orders." / "send_" / "confirmation"), not inside one."""
        escaped = str(escape(self.task.task_name))
        return mark_safe(re.sub(r"([._])", r"\1<wbr>", escaped))  # noqa: S308 - escaped above


def task_duration(task: TaskInfo, now: dt.datetime) -> str:
    """The last attempt's run time; a running task's time so far."""
    if task.started_at is None:
        return ""
    if task.finished_at is not None and task.finished_at >= task.started_at:
        return format_duration(task.finished_at - task.started_at)
    if task.status is TaskStatus.RUNNING:
        return format_duration(now - task.started_at) + " so far"
    return ""


def row(task: TaskInfo, now: dt.datetime, site_name: str) -> Row:
    return Row(
        task=task,
        url=change_url(task.task_id, site_name),
        # A dependent waiting for its dependencies has no next run time of its own yet.
        next_run=task.run_at if task.status in WAITING_STATUSES and not task.waiting_for else None,
        duration=task_duration(task, now),
        can_retry=can_retry(task.status),
        can_cancel=can_cancel(task.status, task.cancel_requested),
        progress=progress_summary(task.progress) if task.progress is not None else "",
        percent=percent(task.progress),
    )


def task_list(executor: ReliableExecutor, filters: Filters, site_name: str) -> dict[str, Any]:
    """One page of tasks, newest first: PAGE_SIZE + 1 are read to know if another page follows
    (no COUNT of the matching tasks)."""
    offset = (filters.page - 1) * PAGE_SIZE
    tasks = executor.list_tasks(**filters.list_filters(), limit=PAGE_SIZE + 1, offset=offset)
    now = executor.clock.now()
    rows = [row(task, now, site_name) for task in tasks[:PAGE_SIZE]]
    has_next = len(tasks) > PAGE_SIZE
    return {
        "rows": rows,
        "page": filters.page,
        "first_index": offset + 1 if rows else 0,
        "last_index": offset + len(rows),
        "previous_url": filters.url(page=filters.page - 1) if filters.page > 1 else None,
        "next_url": filters.url(page=filters.page + 1) if has_next else None,
        "first_url": filters.url(page=1) if filters.page > 2 else None,
        "cut_short": cut_short(tasks),  # a parameter search stopped at its bound (Redis)
    }


def matching_total(filters: Filters, by_queue: dict[str, dict[TaskStatus, int]]) -> int | None:
    """How many tasks the filters match, when the counters tell (not for a task name filter:
    no storage keeps counts by name, and counting them would read every matching task; nor
    for a batch filter: the batch's page shows its counts; nor by origin: no counter tells
    schedule runs apart; nor by tag or parameter: none counts by them)."""
    if filters.task_name is not None or filters.batch_id is not None or filters.tag is not None:
        return None
    if filters.parameter is not None:
        return None
    if filters.origin is not None or filters.schedule is not None:
        return None
    if filters.queue is not None:
        counts = by_queue.get(filters.queue, {})
        sources = [counts]
    else:
        sources = list(by_queue.values())
    chosen = filters.statuses
    if chosen is not None:
        return sum(c.get(status, 0) for c in sources for status in chosen)
    return sum(sum(c.values()) for c in sources)


def filter_choices(
    filters: Filters, by_queue: dict[str, dict[TaskStatus, int]]
) -> list[dict[str, Any]]:
    """The sidebar: one list of links per filter, "All" first, the chosen one marked."""

    def choices(
        name: str, values: list[str], labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        labels = labels or {}
        current = filters.status_param if name == "status" else getattr(filters, name)
        links = [{"label": "All", "url": filters.url(**{name: None}), "selected": current is None}]
        links += [
            {
                "label": labels.get(value, value),
                "url": filters.url(**{name: value}),
                "selected": value == current,
            }
            for value in values
        ]
        if current is not None and current not in values:
            links.append({"label": current, "url": filters.url(), "selected": True})
        return {"name": name, "title": name.replace("_", " "), "links": links}

    names = sorted(all_handlers())
    return [
        choices(
            "status",
            [*(s.value for s in TaskStatus), DEAD_LETTERS],
            {DEAD_LETTERS: DEAD_LETTERS_LABEL},
        ),
        choices("queue", sorted(by_queue)),
        choices("task_name", names),
        # Schedules can flood the list with their runs: leave them out, or list only them.
        # One schedule's runs come from its page (no list of schedules here).
        *([choices("origin", list(ORIGINS), ORIGINS)] if filters.schedule is None else []),
        *([choices("schedule", [])] if filters.schedule is not None else []),
        # No list of batches: only the one chosen (from its page), with "All" to leave it.
        *([choices("batch_id", [])] if filters.batch_id is not None else []),
    ]
