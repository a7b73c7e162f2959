"""What the schedule list and schedule detail pages show, and the pause/resume/delete actions,
read and done through the service (any storage).

Like the task pages (``task_pages``), nothing here touches the ORM or Redis: ``ReliableSchedule``
only carries the admin's URLs and permissions, and on Redis storage its table is empty.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote
from django.urls import reverse

from ..core.records import TaskInfo
from ..exceptions import StorageUnavailableError, UnknownScheduleError
from ..schedules.describing import describe_schedule
from ..schedules.records import ScheduleInfo
from ..service.reliable_executor import ReliableExecutor
from . import schedule_activity, task_pages
from .schedule_activity import Activity, FireTime

PAGE_SIZE = 100
# The detail page lists the schedule's fires among this many newest tasks of its task name
# (no storage indexes tasks by id prefix) and shows at most FIRES_SHOWN of them.
FIRES_SCANNED = 200
FIRES_SHOWN = 20
# ``?state=active`` / ``?state=paused``.
STATES = ("active", "paused")
NOT_FOUND = "not found"


def change_url(schedule_id: str, site_name: str = "admin") -> str:
    """The schedule's page in the admin site named ``site_name``."""
    return reverse(
        f"{site_name}:django_reliable_executor_reliableschedule_change",
        args=[quote(schedule_id)],
    )


def delete_url(schedule_id: str, site_name: str = "admin") -> str:
    return reverse(
        f"{site_name}:django_reliable_executor_reliableschedule_delete",
        args=[quote(schedule_id)],
    )


def changelist_url(site_name: str = "admin") -> str:
    return reverse(f"{site_name}:django_reliable_executor_reliableschedule_changelist")


def relative(moment: dt.datetime | None, now: dt.datetime) -> str:
    """ "in 3 min 5 s", "5 s late", "now": ``moment`` against ``now``, to the second."""
    if moment is None:
        return ""
    seconds = round((moment - now).total_seconds())
    if seconds == 0:
        return "now"
    text = task_pages.format_duration(dt.timedelta(seconds=abs(seconds)))
    text = text.removesuffix(".0 s") + " s" if text.endswith(".0 s") else text
    return f"in {text}" if seconds > 0 else f"{text} late"


@dataclasses.dataclass(frozen=True)
class Filters:
    """The list's state filter and page, from the query string (bad values are dropped)."""

    state: str | None = None
    page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Filters:
        state = query.get("state", "")
        try:
            page = max(int(query.get("page", "1")), 1)
        except ValueError:
            page = 1
        if page > task_pages.MAX_PAGE:  # past any schedule stored: a bad value, as above
            page = 1
        return cls(state=state if state in STATES else None, page=page)

    @property
    def paused(self) -> bool | None:
        """``list_schedules``' ``paused`` argument."""
        return None if self.state is None else self.state == "paused"

    def url(self, **changes: Any) -> str:
        values: dict[str, Any] = {"state": self.state, "page": self.page}
        if "state" in changes:
            values["page"] = None
        values.update(changes)
        return task_pages.query_url(values)


@dataclasses.dataclass(frozen=True)
class Row:
    """One schedule of the list, with what its columns show beside the stored fields."""

    schedule: ScheduleInfo
    url: str
    timing: str
    next_run_in: str
    late: bool
    last_task: TaskInfo | None
    last_task_url: str | None
    words: str = ""  # the timing in plain words (describing.py)
    next_fire: FireTime | None = None  # the stored next run on the schedule's clock
    activity_url: str = ""  # its last 24 hours drawn small (``list_activity``), an image


def describe(schedule: ScheduleInfo) -> str:
    try:
        return schedule.describe()
    except Exception:  # a time zone gone from the system, say: show the raw definition
        if schedule.cron:
            return f"cron {schedule.cron} ({schedule.timezone})"
        return f"every {schedule.every}"


def in_words(schedule: ScheduleInfo) -> str:
    """The timing in plain words, or its literal definition when it cannot be read."""
    try:
        return describe_schedule(schedule)
    except Exception:  # as describe(): the page shows what is stored rather than fail
        return describe(schedule)


def row(
    schedule: ScheduleInfo,
    tasks: Mapping[str, TaskInfo],
    now: dt.datetime,
    site_name: str,
) -> Row:
    last = tasks.get(schedule.last_task_id) if schedule.last_task_id else None
    return Row(
        schedule=schedule,
        url=change_url(schedule.schedule_id, site_name),
        timing=describe(schedule),
        next_run_in=relative(schedule.next_run_at, now),
        late=not schedule.paused and schedule.next_run_at < now,
        last_task=last,
        last_task_url=task_pages.change_url(schedule.last_task_id, site_name)
        if schedule.last_task_id
        else None,
        words=in_words(schedule),
        next_fire=schedule_activity.next_fire(schedule),
        activity_url=activity_url(schedule.schedule_id, site_name),
    )


def activity_url(schedule_id: str, site_name: str = "admin") -> str:
    """The list's small drawing of the schedule's last 24 hours (an SVG image of its own, so
    that the list reads no run: each row's image is read when the browser shows it)."""
    return reverse(
        f"{site_name}:django_reliable_executor_reliableschedule_activity",
        args=[quote(schedule_id)],
    )


def list_activity(executor: ReliableExecutor, schedule: ScheduleInfo, now: dt.datetime) -> Activity:
    """One list row's last 24 hours, drawn small: its newest SCANNED_LIST runs and its skips."""
    return schedule_activity.activity(
        executor,
        schedule,
        now,
        schedule_activity.SCANNED_LIST,
        schedule_activity.HEIGHT_LIST,
        schedule_activity.BAR_LIST,
    )


def last_tasks(
    executor: ReliableExecutor, schedules: Iterable[ScheduleInfo]
) -> dict[str, TaskInfo]:
    """The tasks of the schedules' last fires, in one read of the storage (unknown ids, e.g.
    purged tasks, left out)."""
    ids = sorted({s.last_task_id for s in schedules if s.last_task_id})
    return executor.storage.get_many(ids) if ids else {}


def schedule_list(executor: ReliableExecutor, filters: Filters, site_name: str) -> dict[str, Any]:
    """One page of schedules by id: PAGE_SIZE + 1 are read to know if another page follows
    (no count of the matching schedules), and their last fires' tasks in one read."""
    offset = (filters.page - 1) * PAGE_SIZE
    schedules = executor.list_schedules(limit=PAGE_SIZE + 1, offset=offset, paused=filters.paused)[
        : PAGE_SIZE + 1
    ]
    shown = schedules[:PAGE_SIZE]
    tasks = last_tasks(executor, shown)
    now = executor.clock.now()
    rows = [row(schedule, tasks, now, site_name) for schedule in shown]
    has_next = len(schedules) > PAGE_SIZE
    return {
        "rows": rows,
        "page": filters.page,
        "first_index": offset + 1 if rows else 0,
        "last_index": offset + len(rows),
        "previous_url": filters.url(page=filters.page - 1) if filters.page > 1 else None,
        "next_url": filters.url(page=filters.page + 1) if has_next else None,
        "first_url": filters.url(page=1) if filters.page > 2 else None,
    }


def summary(executor: ReliableExecutor, filters: Filters) -> dict[str, Any]:
    """The active and paused counts, the state filter's links and the filter's total."""
    counts = executor.count_schedules()
    active, paused = counts.get("active", 0), counts.get("paused", 0)
    base = Filters()
    links = [
        {"label": "All", "url": base.url(), "selected": filters.state is None, "count": None},
        *(
            {
                "label": state.capitalize(),
                "url": base.url(state=state),
                "selected": filters.state == state,
                "count": n,
            }
            for state, n in (("active", active), ("paused", paused))
        ),
    ]
    total = {None: active + paused, "active": active, "paused": paused}[filters.state]
    return {
        "counts": {"active": active, "paused": paused, "total": active + paused},
        "state_links": links,
        "total": total,
        "active_url": base.url(state="active"),
        "paused_url": base.url(state="paused"),
    }


@dataclasses.dataclass(frozen=True)
class Fire:
    task: TaskInfo
    url: str
    planned: str  # the id's planned time, as written in it


def fires(executor: ReliableExecutor, schedule: ScheduleInfo, site_name: str) -> list[Fire]:
    """The tasks this schedule fired that still exist, newest first (at most FIRES_SHOWN):
    their ids are ``<schedule_id>@<planned time>`` (``~<k>`` after it on a sharded Redis),
    found among the FIRES_SCANNED newest tasks of the schedule's task name, plus the last
    fire's task however old."""
    prefix = schedule.schedule_id + "@"
    tasks = executor.list_tasks(task_name=schedule.task_name, limit=FIRES_SCANNED)
    found = [task for task in tasks if task.task_id.startswith(prefix)]
    last = schedule.last_task_id
    if last and all(task.task_id != last for task in found):
        task = executor.get_task(last)
        if task is not None:
            found.append(task)
    found.sort(key=lambda task: task.task_id, reverse=True)  # the planned time, newest first
    return [
        Fire(
            task=task,
            url=task_pages.change_url(task.task_id, site_name),
            # less the "~<k>" a sharded Redis storage may add to keep it on its queue's shard
            planned=task.task_id[len(prefix) :].partition("~")[0],
        )
        for task in found[:FIRES_SHOWN]
    ]


def schedule_detail(
    executor: ReliableExecutor, schedule: ScheduleInfo, site_name: str
) -> dict[str, Any]:
    now = executor.clock.now()
    tasks = last_tasks(executor, [schedule])
    return {
        "schedule": schedule,
        "row": row(schedule, tasks, now, site_name),
        "parameter_json": task_pages.pretty_json(schedule.parameter),
        "retry_interval": task_pages.format_duration(
            dt.timedelta(milliseconds=schedule.retry_interval)
        ),
        "max_duration": task_pages.format_duration(
            dt.timedelta(milliseconds=schedule.max_duration_millis)
        )
        if schedule.max_duration_millis
        else None,
        "fires": fires(executor, schedule, site_name),
        "words": in_words(schedule),
        "upcoming": schedule_activity.upcoming(schedule, now),
        "activity": schedule_activity.activity(
            executor, schedule, now, schedule_activity.SCANNED_DETAIL
        ),
        "runs_url": task_pages.changelist_url(site_name)
        + task_pages.query_url({"schedule": schedule.schedule_id}),
        "fires_scanned": FIRES_SCANNED,
        "fires_shown": FIRES_SHOWN,
        "delete_url": delete_url(schedule.schedule_id, site_name),
    }


# -- actions ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    """What pause or resume did to a selection: which schedules changed, why the others did
    not."""

    verb: str  # "paused" or "resumed"
    changed: list[str] = dataclasses.field(default_factory=list)
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    error: str | None = None
    tasks: list[str] = dataclasses.field(default_factory=list)  # "run now": the runs' ids

    @property
    def level(self) -> int:
        if self.error:
            return messages.ERROR
        return messages.WARNING if self.skipped else messages.SUCCESS

    def message(self) -> str:
        """E.g. "2 schedules paused; 1 skipped: 1 already paused"."""
        text = f"{_schedules(len(self.changed))} {self.verb}"
        if self.skipped:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
            text += f"; {sum(self.skipped.values())} skipped: {reasons}"
        if self.error:
            text += f". Stopped: {self.error}"
        if self.tasks:
            text += f". Task{'s' if len(self.tasks) > 1 else ''}: {', '.join(self.tasks)}"
        return text + "."


def _schedules(n: int) -> str:
    return f"{n} schedule" if n == 1 else f"{n} schedules"


def _set_paused(executor: ReliableExecutor, schedule_ids: Iterable[str], paused: bool) -> Outcome:
    outcome = Outcome("paused" if paused else "resumed")
    change: Callable[[str], ScheduleInfo | None] = (
        executor.pause_schedule if paused else executor.resume_schedule
    )
    ids = list(dict.fromkeys(schedule_ids))
    for index, schedule_id in enumerate(ids):
        try:
            schedule = executor.get_schedule(schedule_id)
            if schedule is None:
                outcome.skipped[NOT_FOUND] += 1
            elif schedule.paused == paused:
                outcome.skipped[f"already {'paused' if paused else 'active'}"] += 1
            elif change(schedule_id) is None:
                outcome.skipped[NOT_FOUND] += 1  # deleted meanwhile
            else:
                outcome.changed.append(schedule_id)
        except StorageUnavailableError as exc:
            outcome.skipped["not attempted"] += len(ids) - index
            outcome.error = str(exc)
            break
    return outcome


def pause_schedules(executor: ReliableExecutor, schedule_ids: Iterable[str]) -> Outcome:
    """Pause each active schedule; paused and unknown ones are skipped."""
    return _set_paused(executor, schedule_ids, True)


def resume_schedules(executor: ReliableExecutor, schedule_ids: Iterable[str]) -> Outcome:
    """Resume each paused schedule; active and unknown ones are skipped."""
    return _set_paused(executor, schedule_ids, False)


#: Why "run now" stored no new run: one started by hand earlier is not finished.
EARLIER_RUN = "run by hand earlier, not finished yet"


def run_schedules_now(executor: ReliableExecutor, schedule_ids: Iterable[str]) -> Outcome:
    """Fire one run of each schedule now (``executor.run_schedule_now``); a schedule whose
    earlier run now is not finished keeps that one (skipped, its task named)."""
    outcome = Outcome("fired now")
    ids = list(dict.fromkeys(schedule_ids))
    for index, schedule_id in enumerate(ids):
        try:
            before = executor.clock.now()
            task_id = executor.run_schedule_now(schedule_id)
            task = executor.get_task(task_id)
            # A new run is created at this call's time; the earlier one before it.
            if task is not None and task.created_at < before:
                outcome.skipped[EARLIER_RUN] += 1
            else:
                outcome.changed.append(schedule_id)
            outcome.tasks.append(task_id)
        except UnknownScheduleError:
            outcome.skipped[NOT_FOUND] += 1
        except StorageUnavailableError as exc:
            outcome.skipped["not attempted"] += len(ids) - index
            outcome.error = str(exc)
            break
    return outcome


ACTIONS = {"pause": pause_schedules, "resume": resume_schedules, "run_now": run_schedules_now}
