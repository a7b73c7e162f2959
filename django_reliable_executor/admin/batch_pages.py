"""A batch's admin page: its counts, a progress bar, links to its members by status and its
callbacks; and the bulk retry of its failed members. Read and acted on through the service."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.batches import BatchInfo
from ..core.states import DEAD_LETTER_STATUSES, TaskStatus
from ..service.reliable_executor import ReliableExecutor
from .operations import Outcome, retry_tasks
from .task_pages import DEAD_LETTERS, Filters, batch_url, change_url, changelist_url

# The members' ids are read this many at a time for a bulk retry.
READ_PAGE = 1000


@dataclasses.dataclass(frozen=True)
class Callback:
    """One of the batch's callbacks: its task id, page and status (None: not submitted yet)."""

    role: str  # "on_complete" or "on_success"
    task_id: str
    url: str
    status: TaskStatus | None


def batch_detail(executor: ReliableExecutor, batch: BatchInfo, site_name: str) -> dict[str, Any]:
    """The template context of a batch's page. The counts are the batch's own counters (no
    count over its members); each links to the task list filtered by batch and status."""
    members = Filters(batch_id=batch.batch_id)
    base = changelist_url(site_name)
    ended = batch.completed + batch.failed + batch.cancelled
    counts = [
        ("Total", batch.total, base + members.url()),
        ("Completed", batch.completed, base + members.url(status=TaskStatus.COMPLETED.value)),
        ("Failed", batch.failed, base + members.url(status=DEAD_LETTERS)),
        ("Cancelled", batch.cancelled, base + members.url(status=TaskStatus.CANCELLED.value)),
        ("Pending", batch.pending, None),  # not ended: CREATED, PENDING or RUNNING
    ]
    waiting = [
        (status, base + members.url(status=status.value))
        for status in (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING)
    ]
    return {
        "batch": batch,
        "batch_url": batch_url(batch.batch_id, site_name),
        "counts": counts,
        "waiting_links": waiting,
        "ended": ended,
        "percent": round(100 * ended / batch.total) if batch.total else 100,
        "callbacks": callbacks(executor, batch, site_name),
    }


def callbacks(executor: ReliableExecutor, batch: BatchInfo, site_name: str) -> list[Callback]:
    found = []
    for role, task_id in (
        ("on_complete", batch.on_complete_id),
        ("on_success", batch.on_success_id),
    ):
        if task_id is None:
            continue
        task = executor.get_task(task_id)
        status = task.status if task is not None else None
        found.append(Callback(role, task_id, change_url(task_id, site_name), status))
    return found


def failed_member_ids(executor: ReliableExecutor, batch: BatchInfo) -> list[str]:
    """The ids of the batch's FAILED, TIMEOUT and ERROR members (never its callbacks, which
    carry its id too), read a page at a time."""
    skip = {batch.on_complete_id, batch.on_success_id}
    ids: list[str] = []
    offset = 0
    while True:
        page = executor.list_tasks(
            statuses=DEAD_LETTER_STATUSES,
            batch_id=batch.batch_id,
            limit=READ_PAGE,
            offset=offset,
        )
        ids += [task.task_id for task in page if task.task_id not in skip]
        if len(page) < READ_PAGE:
            return ids
        offset += len(page)


def retry_failed_members(executor: ReliableExecutor, batch: BatchInfo) -> Outcome:
    """Retry each failed member through the admin's retry (the service's compare-and-set): it
    is pending again and its batch counts its next ending; a finished batch stays finished and
    never fires its callbacks again (docs/workflows.md, "The retry rule")."""
    return retry_tasks(executor, failed_member_ids(executor, batch))
