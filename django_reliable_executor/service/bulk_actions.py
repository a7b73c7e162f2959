"""Bulk actions: retry or cancel every task a filter lists, run as a task of this app
(``django_reliable_executor.bulk_action``) by the project's own workers.

``count_matching`` says how many tasks a filter lists (the total an operator confirms;
``count_up_to`` stops at a cap, as the admin's page does);
``start_bulk_action`` checks the filter and submits the bulk action's task, once: its id is
derived from the action, the filter and the moment the total was counted, so a second click
of the same confirmation stores nothing and returns the same task, and its unique key from the
action and the filter alone, so while one bulk action over a filter is not finished, another
operator's returns it too. The task walks the filter in chunks (``bulk_walk``), each stored
as a durable step: its progress and its state live in the storage, never in a web process,
and a walk resumed on another worker carries on from its last chunk (walking the chunk that was
under way again: a task it had retried that has run and failed again since ended after the
count, which a retry walk leaves alone)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from ..core.records import TaskInfo, TaskSubmitRequest
from ..core.states import TaskStatus
from ..core.task_count import TaskCount
from ..core.text import unstorable_char
from .bulk_walk import (
    ACTIONS,
    BULK_ACTION,
    CHUNK,
    BulkAction,
    ChunkPlan,
    WalkState,
    act_chunk,
    plan_chunk,
)
from .listing import listing_query
from .reliable_executor import ReliableExecutor

# Filters the counters of every storage tell (by queue and status) without reading the tasks.
COUNTED_FILTERS = frozenset({"status", "statuses", "queue"})
# Filters that name something by its text (list_tasks would take another type as no match).
TEXT_FILTERS = frozenset({"task_name", "queue", "batch_id", "schedule_id", "tag"})
# The most tasks the confirmation page counts ("at least 100,000" past it), so that the count
# stays bounded in a web request wherever an index answers the filter (docs/benchmarks.md).
COUNT_CAP = 100_000
UNCAPPED = 2**62
# While a bulk action over the same action and filter is not finished, starting it again
# returns that one (the unique window: longer than any walk is expected to take).
UNIQUE_SECONDS = 7 * 24 * 3600
# A failed walk (the storage unreachable, say) is retried, from its last chunk stored.
RETRY_LIMIT = 5
RETRY_INTERVAL_MS = 5000


class BulkActionStopped(Exception):
    """Raised by a bulk action whose cancel was requested, between two chunks: it ends
    CANCELLED, the tasks it acted on so far stay as they are."""


def filter_names() -> list[str]:
    """The keyword filters ``list_tasks`` takes (all but limit and offset)."""
    parameters = inspect.signature(ReliableExecutor.list_tasks).parameters
    return [name for name in parameters if name not in ("self", "limit", "offset")]


def checked_filters(executor: ReliableExecutor, filters: Mapping[str, Any]) -> dict[str, Any]:
    """``filters`` (keyword filters of ``list_tasks``) as stored in a bulk action: None
    values left out, statuses as sorted values. ValueError naming a wrong one (an unknown
    name, a value ``list_tasks`` refuses, one that is not JSON)."""
    known = filter_names()
    checked: dict[str, Any] = {}
    for name, value in sorted(filters.items()):
        if name not in known:
            raise ValueError(f"unknown filter {name!r}: list_tasks filters by {', '.join(known)}")
        if value is None:
            continue
        if name in TEXT_FILTERS and (not isinstance(value, str) or not value):
            raise ValueError(f"filter {name} must be a non-empty string, got {value!r}")
        if isinstance(value, TaskStatus):
            value = value.value
        elif name == "statuses" and not isinstance(value, str):  # list_tasks refuses a str
            value = sorted({s.value if isinstance(s, TaskStatus) else s for s in value})
        checked[name] = value
    try:
        executor.list_tasks(**checked, limit=0)  # its own checks; limit 0 reads nothing
        json.dumps(checked, allow_nan=False)
    except TypeError as exc:
        raise ValueError(f"bad filter: {exc}") from None
    return checked


def _check_storable(checked: Mapping[str, Any]) -> None:
    """ValueError naming the first filter holding text no storage can hold. Such a filter
    matches nothing (list_tasks and a walk answer nothing), but a bulk action stores its
    filters in its own parameter, which could not hold it either: refused here, in the
    filter's name, rather than by that submit in the name of its parameter."""
    for name, value in checked.items():
        problem = _unstorable_in(value)
        if problem is not None:
            raise ValueError(
                f"filter {name} contains {problem}, which no storage can hold: got "
                f"{repr(value)[:100]}"
            )


def _unstorable_in(value: Any) -> str | None:
    """The first character no storage can hold in a filter's value (its strings, a
    parameter's keys and values, the items of a list), described; None when there is none."""
    if isinstance(value, str):
        return unstorable_char(value)
    if isinstance(value, Mapping):
        items: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        return None
    return next((p for p in map(_unstorable_in, items) if p is not None), None)


def _checked_window(
    since: dt.datetime | None, until: dt.datetime
) -> tuple[dt.datetime | None, dt.datetime]:
    for name, value in (("since", since), ("until", until)):
        if value is not None and (not isinstance(value, dt.datetime) or value.tzinfo is None):
            raise ValueError(f"{name} must be an aware datetime, got {value!r}")
    if since is not None and since > until:
        raise ValueError(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
    return since, until


def count_matching(
    executor: ReliableExecutor,
    filters: Mapping[str, Any],
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> int:
    """How many tasks ``list_tasks(**filters)`` lists that were submitted between ``since``
    and ``until`` (None: any time): ``count_up_to`` without a cap (on Redis a count that
    reads its bound of index entries answers the matches found so far: ``count_up_to`` tells
    it is incomplete). ValueError naming a wrong filter."""
    return count_up_to(executor, filters, since, until, cap=UNCAPPED).n


def count_up_to(
    executor: ReliableExecutor,
    filters: Mapping[str, Any],
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    *,
    cap: int = COUNT_CAP,
) -> TaskCount:
    """``count_matching``, stopping at ``cap`` (then incomplete: "at least ``cap``"). From
    the counters by queue and status when the filters are only those and ``since`` is None
    (no task read: ``until`` is taken as now); otherwise from the storage's ``count_tasks``,
    one pass over the list's own filters (an SQL COUNT; on Redis, the indexes a listing
    reads). ValueError naming a wrong filter."""
    checked = checked_filters(executor, filters)
    # The counters count the tasks stored now: ``until`` is now, or a moment ago.
    if since is None and set(checked) <= COUNTED_FILTERS:
        n = _counted(executor, checked)
        return TaskCount(min(n, cap), complete=n < cap)
    query = listing_query(checked, executor.settings.SEARCHABLE_PARAMETERS)
    if query is None:
        return TaskCount(0)
    return executor.storage.count_tasks(query, cap, since=since, until=until)


def _counted(executor: ReliableExecutor, filters: dict[str, Any]) -> int:
    if "status" in filters:
        wanted = {TaskStatus(filters["status"])}
    elif "statuses" in filters:
        wanted = {TaskStatus(s) for s in filters["statuses"]}
    else:
        wanted = set(TaskStatus)
    counts = executor.count_by_status(filters.get("queue"))
    return sum(counts.get(status, 0) for status in wanted)


def start_bulk_action(
    executor: ReliableExecutor,
    action: str,
    filters: Mapping[str, Any],
    *,
    total: int,
    until: dt.datetime,
    since: dt.datetime | None = None,
    queue: str = "default",
    chunk: int = CHUNK,
) -> tuple[TaskInfo, bool]:
    """Submit the bulk action ``action`` ("retry" or "cancel") over the tasks of ``filters``
    submitted between ``since`` and ``until`` (the moment ``total`` was counted) to
    ``queue``: the task, and whether this call stored it (False: the same confirmation was
    submitted already, or a bulk action over the same action and filter is not finished; the
    task returned is that one). ValueError naming what was wrong; nothing is stored then."""
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}: choose {' or '.join(ACTIONS)}")
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise ValueError(f"total must be an int >= 0, got {total!r}")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
    since, until = _checked_window(since, until)
    checked = checked_filters(executor, filters)
    _check_storable(checked)
    bulk = BulkAction(action, checked, since, until, total, chunk)
    what = [action, checked, bulk.to_json()["since"]]
    submitted = executor.submit_many_created(
        [
            executor_request(
                bulk,
                task_id=f"bulk-{action}-{_digest([*what, bulk.to_json()['until']])[:24]}",
                unique_key=f"{BULK_ACTION}:{_digest(what)[:32]}",
                queue=queue,
            )
        ]
    )
    return submitted[0]


def executor_request(
    bulk: BulkAction, *, task_id: str, unique_key: str, queue: str
) -> TaskSubmitRequest:
    """The submit request of a bulk action's task."""
    return TaskSubmitRequest(
        BULK_ACTION,
        bulk.to_json(),
        task_id=task_id,
        queue=queue,
        unique_key=unique_key,
        unique_for=UNIQUE_SECONDS,
        retry_limit=RETRY_LIMIT,
        retry_interval=RETRY_INTERVAL_MS,
        retry_backoff="exponential",
        tags=(f"bulk:{bulk.action}",),
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def run_bulk_action(executor: ReliableExecutor, parameter: Any, context: Any) -> dict[str, Any]:
    """The handler's work: walk the filter a chunk at a time, each chunk two durable steps:
    the tasks it will act on ("plan-1", ...), then what acting on them left ("chunk-1", ...),
    reporting its progress as it goes; returns what it did (``result_of``). Raises
    BulkActionStopped when its cancel is requested."""
    bulk = BulkAction.from_json(parameter)
    state = WalkState()
    report = _reporter(bulk, context.set_progress)
    number = 0
    while not state.done:
        if _stop_requested(executor, context):
            raise BulkActionStopped(f"stopped by request: {state.summary(bulk.action)}")
        number += 1
        current = state.to_json()
        # The plan is stored before any task is acted on: a walk resumed after its worker was
        # lost mid-chunk acts again on the same tasks rather than listing past the ones it
        # had already changed (a retried dead letter has left a "dead letters" filter).
        plan = context.step(
            f"plan-{number}",
            lambda current=current: plan_chunk(
                executor, bulk, WalkState.from_json(current)
            ).to_json(),
        )
        stored = context.step(
            f"chunk-{number}",
            lambda current=current, plan=plan: act_chunk(
                executor, bulk, WalkState.from_json(current), ChunkPlan.from_json(plan), report
            ).to_json(),
        )
        state = WalkState.from_json(stored)
        report(state)
    return result_of(bulk, state)


def _stop_requested(executor: ReliableExecutor, context: Any) -> bool:
    """Whether the walk is to stop before its next chunk: read from the storage each time, not
    through ``context.is_cancelled`` (which reads it at most once a second, long enough for
    a fast walk to finish after its Stop was pressed: "Stop after the current chunk")."""
    task = executor.get_task(context.task_id)
    return task is None or task.cancel_requested or context.is_cancelled()


def _reporter(bulk: BulkAction, set_progress: Callable[..., None]) -> Callable[[WalkState], None]:
    def report(state: WalkState) -> None:
        # More may match than were counted (tasks that failed since): the total grows then.
        set_progress(state.examined, max(bulk.total, state.examined), state.summary(bulk.action))

    return report


def result_of(bulk: BulkAction, state: WalkState) -> dict[str, Any]:
    """The bulk action's result: what it did to how many tasks."""
    return {
        "action": bulk.action,
        "total": bulk.total,
        "examined": state.examined,
        "changed": state.changed,
        "cancel_requested": state.requested,
        "skipped": dict(sorted(state.skipped.items())),
        "cut_short": state.cut_short,
    }


@dataclasses.dataclass(frozen=True)
class BulkStatus:
    """A bulk action as its page shows it."""

    task: TaskInfo
    bulk: BulkAction
    examined: int
    message: str
    waits_for: str | None  # why it has not started yet: no worker, a paused queue


def bulk_status(executor: ReliableExecutor, task_id: str) -> BulkStatus | None:
    """The bulk action of ``task_id`` (None: no such task, or not a bulk action)."""
    task = executor.get_task(task_id)
    if task is None or task.task_name != BULK_ACTION or not isinstance(task.parameter, dict):
        return None
    bulk = BulkAction.from_json(task.parameter)
    result = task.result if isinstance(task.result, dict) else None
    if result is not None:
        state = WalkState(
            examined=result["examined"],
            changed=result["changed"],
            requested=result["cancel_requested"],
            skipped=result["skipped"],
            cut_short=bool(result.get("cut_short")),
        )
        examined, message = state.examined, state.summary(bulk.action)
    elif task.progress is not None:
        examined, message = int(task.progress["current"]), task.progress["message"]
    else:
        examined, message = 0, ""
    return BulkStatus(task, bulk, examined, message, waits_for(executor, task))


def waits_for(executor: ReliableExecutor, task: TaskInfo) -> str | None:
    """Why a bulk action's task that has not started waits, in words; None once it runs."""
    if task.status not in (TaskStatus.CREATED, TaskStatus.PENDING):
        return None
    if task.queue in executor.paused_queues():
        return f"its queue {task.queue!r} is paused: resume it to let a worker start it"
    workers = executor.workers()
    if not workers:
        return "no worker is running: it starts when a worker (manage.py runexecutor) does"
    if not any(task.queue in w.queues for w in workers):
        return f"no running worker serves its queue {task.queue!r}"
    return None
